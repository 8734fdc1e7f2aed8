import pytest
import torch

from freshper.trainer.advantages import advantages


def test_reinforce_pp_batch_normalised():
    r = torch.tensor([1.0, 0.0, 0.0, 3.0])
    a = advantages("reinforce++", r)
    assert a.mean().abs() < 1e-6 and (a.std(unbiased=False) - 1).abs() < 1e-5
    assert torch.equal(a.argsort(), r.argsort())


def test_grpo_group_normalised_and_constant_groups_zero():
    r = torch.tensor([1.0, 0.0, 5.0, 5.0])
    a = advantages("grpo", r, torch.tensor([0, 0, 1, 1]))
    torch.testing.assert_close(a, torch.tensor([1.0, -1.0, 0.0, 0.0]), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="group"):
        advantages("grpo", r)
    with pytest.raises(ValueError, match="advantage"):
        advantages("gae", r)

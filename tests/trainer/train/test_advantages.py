import pytest
import torch

from freshper.trainer.train.advantages import advantages


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


def test_reinforce_equals_grpo_on_outcome_rewards_and_groups_need_not_be_sorted():
    r = torch.tensor([1.0, 5.0, 0.0, 5.0, 2.0])
    g = torch.tensor([7, 3, 7, 3, 9])  # non-contiguous ids; 9 is a singleton
    a = advantages("reinforce", r, g)
    torch.testing.assert_close(a, torch.tensor([1.0, 0.0, -1.0, 0.0, 0.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(a, advantages("grpo", r, g))


def test_shape_whitens_over_response_tokens_and_clips():
    from freshper.trainer.train.advantages import shape

    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[True, True, False], [False, True, False]])
    raw = shape(adv, mask, whiten=False, clip=0.0)
    assert torch.equal(raw, torch.tensor([[2.0, 2.0, 0.0], [0.0, -1.0, 0.0]]))
    w = shape(adv, mask, whiten=True, clip=0.0)
    vals = w[mask].double()
    assert abs(float(vals.mean())) < 1e-6 and abs(float(vals.std(unbiased=False)) - 1) < 1e-5
    assert (w[~mask] == 0).all()
    c = shape(adv, mask, whiten=True, clip=0.2)
    assert float(c.abs().max()) == pytest.approx(0.2) and torch.equal(c.sign(), w.sign())


def test_sample_std_is_the_papers_normaliser():
    """The paper's code: (x - mean) / (torch.std(x) + 1e-6) with n - 1, zeros for a group of one
    or of equal returns."""
    r = torch.tensor([1.0, 0.0, 0.0, 3.0, 2.0, 2.0, 4.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    a = advantages("reinforce", r, g, std="sample")
    x = r[:4]
    torch.testing.assert_close(a[:4], (x - x.mean()) / (x.std() + 1e-6), rtol=1e-6, atol=0)
    assert a[4:].abs().max() == 0
    pop = advantages("reinforce", r, g)
    torch.testing.assert_close(a[:4], pop[:4] * (3 / 4) ** 0.5, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="std"):
        advantages("reinforce", r, g, std="n-1")


@pytest.mark.parametrize("kind,std", [("grpo", "population"), ("grpo", "sample"), ("reinforce++", "population")])
def test_a_batch_of_equal_returns_has_exactly_zero_advantage_even_after_whitening(kind, std):
    """Equal returns whose float32 mean is not exact (8 x -0.45, 3 x 0.1): the advantage is 0, not
    the rounding error over eps, which whitening would scale up to unit size."""
    from freshper.trainer.train.advantages import shape

    r = torch.tensor([-0.45] * 8 + [0.1] * 3)
    g = torch.tensor([0] * 8 + [1] * 3)
    assert (r[:8].sum() / 8 != r[0]) or (r[8:].sum() / 3 != r[8]), "the premise: a mean with a rounding error"
    r = r[:8] if kind == "reinforce++" else r
    a = advantages(kind, r, g[:len(r)], std=std)
    assert (a == 0).all()
    assert (shape(a, torch.ones(len(r), 4, dtype=torch.bool), whiten=True, clip=5.0) == 0).all()


@pytest.mark.parametrize("kind", ["grpo", "reinforce", "reinforce++"])
def test_no_rows_give_no_advantages(kind):
    """A rank of several may draw no replay rows: its (empty) advantages are still well defined."""
    a = advantages(kind, torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert a.shape == (0,)

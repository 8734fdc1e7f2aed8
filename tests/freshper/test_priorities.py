"""Base priorities and the log-key identity."""
import pytest
import torch

from freshper import base_priority, log_keys


def test_base_priorities():
    r = torch.tensor([-2.0, 0.0, 3.0])
    assert torch.equal(base_priority("reward", rewards=r), torch.tensor([2.0, 0.0, 3.0]))
    adv = torch.tensor([[1.0, -3.0, 5.0], [2.0, 2.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert torch.equal(base_priority("advantage", advantages=adv, mask=mask), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="kind"):
        base_priority("kl", rewards=r)
    with pytest.raises(ValueError, match="rewards"):
        base_priority("reward")


def test_log_key_differences_are_the_decayed_log_priorities():
    """k_i - k_j = alpha * (log p_i - log p_j) - alpha * (age_i - age_j) / tau at any step t."""
    lb = torch.log(torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64))
    birth = torch.tensor([0, 40, 1_000_000_000])
    k = log_keys(lb, birth, mode="freshper", alpha=0.6, tau=500.0)
    t = 1_000_000_123
    direct = 0.6 * (lb - (t - birth).double() / 500.0)
    torch.testing.assert_close(k - k[0], direct - direct[0], rtol=0, atol=1e-9)
    assert torch.equal(log_keys(lb, birth, mode="uniform", alpha=0.6, tau=1.0), torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="mode"):
        log_keys(lb, birth, mode="lifo", alpha=0.6, tau=1.0)

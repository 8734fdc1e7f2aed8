"""Shared builders for the buffer tests."""
import torch

from freshper import ReplayBuffer


def filled(mode="freshper", capacity=64, n=48, seed=0, sampler="auto", tau=20.0, **kw) -> ReplayBuffer:
    """A buffer with `n` entries added over several steps, varied priorities, one field."""
    g = torch.Generator().manual_seed(seed)
    buf = ReplayBuffer(capacity, mode=mode, tau=tau, seed=seed, sampler=sampler, **kw)
    step = 0
    while len(buf) < min(n, capacity):
        b = min(8, n - len(buf))
        p = torch.rand(b, generator=g, dtype=torch.float64) * 3
        buf.add(p, step=step, tok=torch.randint(0, 100, (b, 5), generator=g), ret=torch.randn(b, generator=g))
        step += 7
    return buf


def direct_probabilities(buf: ReplayBuffer, log_base, birth, live, t) -> torch.Tensor:
    """P(i) from the paper's formula, in float64, without the log-key identity."""
    p = torch.exp(log_base)  # base + eps
    if buf.mode == "uniform":
        w = torch.ones_like(p)
    elif buf.mode == "per":
        w = p ** buf.alpha
    else:
        w = (p * torch.exp(-(t - birth).double() / buf.tau)) ** buf.alpha
    w = torch.where(live, w, torch.zeros_like(w))
    return w / w.sum()

"""Priorities and the time-invariant log-keys they become.

FreshPER samples slot i with probability P(i) = p_i^alpha / sum_j p_j^alpha where
p_i = (base_i + eps) * exp(-(t - b_i) / tau). In log space,

    alpha * log p_i = alpha * (log(base_i + eps) + b_i / tau)  -  alpha * t / tau

and the last term is shared by every slot, so it cancels in P(i). The bracket, the log-key
k_i, is fixed when the slot is written: advancing the step changes nothing, and no per-step
refresh of the priorities exists anywhere in this package.
"""
from __future__ import annotations

import torch

MODES = ("uniform", "per", "freshper")
BASE_PRIORITIES = ("reward", "advantage")


def log_keys(log_base: torch.Tensor, birth: torch.Tensor, *, mode: str, alpha: float, tau: float) -> torch.Tensor:
    """Log-keys k_i (float64, same shape as `log_base`) from log(base + eps) and birth steps.

    Slot i is drawn with probability softmax(k)_i over live slots. `birth` is an integer step;
    dividing it in float64 keeps 1e-10 absolute precision up to ~1e9 steps.
    """
    if mode == "uniform":
        return torch.zeros_like(log_base, dtype=torch.float64)
    if mode == "per":
        return alpha * log_base.double()
    if mode == "freshper":
        return alpha * (log_base.double() + birth.double() / tau)
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def base_priority(kind: str, *, rewards: torch.Tensor | None = None, advantages: torch.Tensor | None = None,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """Base priority per trajectory, (B,) float, before `eps` is added by the buffer.

    kind "reward": |episode reward| (the paper's `reward_fresh`), from `rewards` (B,).
    kind "advantage": |mean advantage over unmasked tokens|, from `advantages` (B, T) and `mask` (B, T).
    """
    if kind == "reward":
        if rewards is None:
            raise ValueError("base_priority('reward') needs rewards=(B,) episode rewards")
        return rewards.abs().float()
    if kind == "advantage":
        if advantages is None or mask is None:
            raise ValueError("base_priority('advantage') needs advantages=(B, T) and mask=(B, T)")
        m = mask.float()
        return ((advantages.float() * m).sum(-1) / m.sum(-1).clamp_min(1.0)).abs()
    raise ValueError(f"kind must be one of {BASE_PRIORITIES}, got {kind!r}")

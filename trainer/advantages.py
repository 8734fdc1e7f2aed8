"""Advantage estimators on episode rewards (outcome rewards; every response token of an
episode gets its episode's advantage).

reinforce++: returns normalised over the whole batch, (R - mean) / std (Hu, 2025; the paper's).
grpo: returns normalised within each group of episodes that share an initial state.
"""
from __future__ import annotations

import torch

ESTIMATORS = ("reinforce++", "grpo")


def advantages(kind: str, reward: torch.Tensor, group: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """(E,) float32 advantages from (E,) episode rewards; `group` (E,) int64 for grpo."""
    r = reward.float()
    if kind == "reinforce++":
        return (r - r.mean()) / (r.std(unbiased=False) + eps)
    if kind == "grpo":
        if group is None:
            raise ValueError("grpo advantages need group=(E,) group ids")
        out = torch.empty_like(r)
        for g in group.unique():
            sel = group == g
            x = r[sel]
            out[sel] = (x - x.mean()) / (x.std(unbiased=False) + eps)
        return out
    raise ValueError(f"advantage must be one of {ESTIMATORS}, got {kind!r}")

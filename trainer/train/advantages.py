"""Advantage estimators on episode returns (outcome rewards), and their token-level shaping.

reinforce: returns normalised within each group of episodes that share an initial state,
    (R - mean_group) / (std_group + eps): the paper's code (ROLL's `reinforce` estimator with
    reward_normalization grouping=traj_group_id, method=mean_std). With one outcome reward per
    episode and gamma = 1 every token's return is the episode's, so at the episode level this is
    the same number as grpo's.
reinforce++: returns normalised over the whole batch (Hu, 2025; what the paper's text names).
grpo: returns normalised within groups.
Then `shape` spreads each episode's advantage over its response tokens and, as the paper's
example configs do, whitens them over all response tokens of the batch and clips to ±clip.
"""
from __future__ import annotations

import torch

ESTIMATORS = ("reinforce", "reinforce++", "grpo")


def _group_normalise(r: torch.Tensor, group: torch.Tensor, eps: float, std: str = "population") -> torch.Tensor:
    if r.numel() == 0:  # a rank that drew no replay rows
        return r.clone()
    _, inv = torch.unique(group, return_inverse=True)
    n = torch.zeros(int(inv.max()) + 1, dtype=r.dtype, device=r.device).index_add_(0, inv, torch.ones_like(r))
    mean = torch.zeros_like(n).index_add_(0, inv, r) / n
    ss = torch.zeros_like(n).index_add_(0, inv, (r - mean[inv]) ** 2)
    # population: std over n; sample (the paper's code): torch's std, over n - 1. Either way a
    # group of one or of equal returns gets exactly 0: its mean carries a rounding error, and
    # (r - mean) / (std + eps) would turn that error into an advantage of order 1e-3, which the
    # batch whitening then blows up to unit size when every group of a batch is flat.
    sd = (ss / n).sqrt() if std == "population" else (ss / (n - 1).clamp_min(1)).sqrt()
    flat = (n < 2) | (sd <= FLAT)
    return torch.where(flat[inv], torch.zeros_like(r), (r - mean[inv]) / (sd[inv] + eps))


GROUP_STDS = ("population", "sample")
FLAT = 1e-6  # returns whose standard deviation is below this are equal: their advantage is 0


def _own(t: torch.Tensor) -> torch.Tensor:
    return t


def advantages(kind: str, reward: torch.Tensor, group: torch.Tensor | None = None, eps: float = 1e-6,
               std: str = "population", total=_own) -> torch.Tensor:
    """(E,) float32 advantages from (E,) episode returns; `group` (E,) int64 ids for the group
    estimators (a singleton group gets 0). std: the group's standard deviation over n
    ("population") or n - 1 with zeros for flat groups ("sample", the paper's code).
    `total(t)` sums a tensor over the ranks that share the batch (several GPUs; each group lives
    on one rank, so only the batch-wide reinforce++ statistics need it)."""
    if std not in GROUP_STDS:
        raise ValueError(f"std must be one of {GROUP_STDS}, got {std!r}")
    r = reward.float()
    if kind == "reinforce++":
        s = total(torch.stack([r.sum(), torch.tensor(float(r.numel()), device=r.device)]))
        mean = s[0] / s[1]
        sd = (total(((r - mean) ** 2).sum()) / s[1]).sqrt()
        return torch.zeros_like(r) if sd <= FLAT else (r - mean) / (sd + eps)
    if kind in ("reinforce", "grpo"):
        if group is None:
            raise ValueError(f"{kind} advantages need group=(E,) group ids")
        return _group_normalise(r, group.to(r.device), eps, std)
    raise ValueError(f"advantage must be one of {ESTIMATORS}, got {kind!r}")


def shape(adv: torch.Tensor, mask: torch.Tensor, whiten: bool, clip: float, eps: float = 1e-8,
          total=_own) -> torch.Tensor:
    """(E, L) token advantages: each episode's (E,) advantage on its response tokens (`mask`),
    whitened over all of them if `whiten`, clipped to [-clip, clip] if clip > 0; 0 elsewhere.
    `total(t)` sums over the ranks that share the batch: the whitening is over the global batch."""
    m = mask.to(adv.dtype)
    tok = adv[:, None] * m
    if whiten:
        s = total(torch.stack([tok.sum(), m.sum()]))
        n = s[1].clamp_min(1.0)
        mean = s[0] / n
        std = total((((tok - mean) * m) ** 2).sum()).div(n).sqrt()
        tok = (tok - mean) / (std + eps) * m
    if clip > 0:
        tok = tok.clamp(-clip, clip)
    return tok

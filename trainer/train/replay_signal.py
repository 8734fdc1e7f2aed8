"""What a batch can teach. A replay batch: per replayed episode, whether it came without the rest
of its group (a group-relative advantage is then 0) and how many of its loss tokens carry a
non-zero advantage; the loop reports both shares each replay update (replay_singleton_frac,
replay_adv_nonzero_frac). A fresh batch: the share of its groups whose outcomes differ (the others
give no gradient) and how sure the policy was of what it sampled (rollout_signal)."""
from __future__ import annotations

import torch


def signal_rows(group: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(E, 3) float64 per replayed episode: 1 if no other member of its group is in the batch (a
    group-relative advantage is 0 for it), its loss tokens, and those tokens again if its
    advantage before whitening is non-zero (|A| > 1e-6), else 0."""
    _, inv, counts = torch.unique(group, return_inverse=True, return_counts=True)
    tokens = mask[:, 1:].sum(1).double()
    return torch.stack([(counts[inv] == 1).double(), tokens, tokens * (adv.abs() > 1e-6).double()], 1)


# What each replayed row contributes to a replay update's statistics, in this order; its
# signal_rows follow.
REPLAY_ROW_COLUMNS = ("weight", "age", "kl", "kl_k1", "gen_age")


def replay_signal(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What a replay batch can teach, from its signal_rows (E, 3): the share of its episodes whose
    group has no other member in the batch, and the share of its loss tokens whose episode
    advantage, before whitening, is non-zero (0-dim float64 tensors)."""
    return rows[:, 0].mean(), rows[:, 2].sum() / rows[:, 1].sum().clamp_min(1.0)


def rollout_signal(score: torch.Tensor, group: torch.Tensor, mask: torch.Tensor, engine_logp: torch.Tensor) -> dict:
    """Of a fresh batch (score (E,), group ids (E,), mask and the engine's log-probs (E, T)):
    `groups_varied`, the share of groups whose scores are not all equal (a group of one outcome
    has zero group-relative advantage before whitening; under the paper's batch whitening its rows
    still carry a gradient whenever another group of the batch varies, docs/training.md), and
    `reply_nll`, the mean negative
    log-prob of the sampled reply tokens in nats (at temperature 1 without top-k/top-p, a Monte
    Carlo estimate of the policy's per-token entropy: a policy collapsing onto one reply drives it
    toward 0)."""
    _, inv = torch.unique(group, return_inverse=True)
    n = int(inv.max()) + 1 if len(inv) else 0
    hi = torch.full((n,), -torch.inf, dtype=torch.float64, device=score.device).scatter_reduce(
        0, inv, score.double(), "amax")
    lo = torch.full((n,), torch.inf, dtype=torch.float64, device=score.device).scatter_reduce(
        0, inv, score.double(), "amin")
    m = mask.bool()
    return {"groups_varied": float((hi - lo > 1e-9).double().mean()) if n else 0.0,
            "reply_nll": float(-engine_logp[m].double().sum() / m.sum().clamp_min(1))}

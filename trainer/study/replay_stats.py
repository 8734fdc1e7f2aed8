"""What replay did in a run, from its metrics rows: the KL-vs-age data, the drift rate, the ages.

The trainer logs, per iteration, the mean per-token KL(mu || pi) of replayed trajectories in
age bins 0, 1, 2-3, 4-7, ... (`replay_kl_by_age`: {lowest age of the bin: [mean KL, count]}),
and means of the IS-weight ESS fraction, the replayed ages and the share of replayed tokens
at a clip bound. This module pools them over a run. The drift fit answers the paper's premise
(KL grows linearly with age) in two numbers: the rate r (KL per iteration of age, a weighted
least-squares line through the origin) and the exponent p of a power law KL ∝ age^p fitted on
log-log axes (p ≈ 1: linear). The drift time 1/(2r) is the age at which a token's importance
ratio has lost a factor e of effective sample size (trainer/train/drift.py derives it); it is the
scale a tau sweep should span.
"""
from __future__ import annotations

import math

import numpy as np

# Ages are logged per bin, not per trajectory: a bin [a, 2a-1] is represented by its midpoint.
# Replay draws young trajectories more often, so the midpoint overstates a bin's mean age a
# little and the rate comes out a little low; the bias is the same for every arm compared.


def bin_age(lowest: int) -> float:
    """Representative age of the bin whose lowest age is `lowest` (0, 1, 2, 4, ...)."""
    return 0.0 if lowest == 0 else (3 * lowest - 1) / 2


def kl_by_age(rows: list[dict]) -> dict[int, tuple[float, int]]:
    """{lowest age of the bin: (mean per-token KL(mu || pi), trajectories)} over a run's replays."""
    acc: dict[int, list[float]] = {}
    for r in rows:
        for age, (kl, n) in r.get("replay_kl_by_age", {}).items():
            a = acc.setdefault(int(age), [0.0, 0])
            a[0] += kl * n
            a[1] += n
    return {k: (v[0] / v[1], v[1]) for k, v in sorted(acc.items()) if v[1]}


def drift_fit(kl: dict[int, tuple[float, int]]) -> tuple[float, float]:
    """(rate r in KL per token per iteration of age, exponent p of KL ∝ age^p) from binned KL.

    r: count-weighted least squares through the origin over all bins. p: count-weighted line
    on (log age, log KL) over bins of age >= 1 with KL > 0; nan with fewer than two such bins.
    """
    a = np.array([bin_age(k) for k in kl], dtype=float)
    y = np.array([v[0] for v in kl.values()], dtype=float)
    n = np.array([v[1] for v in kl.values()], dtype=float)
    den = float((n * a * a).sum())
    rate = float((n * a * y).sum() / den) if den > 0 else float("nan")
    ok = (a >= 1) & (y > 0)
    if ok.sum() < 2:
        return rate, float("nan")
    p = np.polyfit(np.log(a[ok]), np.log(y[ok]), 1, w=np.sqrt(n[ok]))[0]
    return rate, float(p)


def age_shares(kl: dict[int, tuple[float, int]]) -> dict[int, float]:
    """{lowest age of the bin: share of the run's replayed trajectories in that bin}."""
    total = sum(v[1] for v in kl.values())
    return {k: v[1] / total for k, v in kl.items()} if total else {}


def replay_summary(rows: list[dict]) -> dict:
    """Per-run means of the replay diagnostics; empty for a run that never replayed."""
    rep = [r for r in rows if "replay_kl_by_age" in r]
    if not rep:
        return {}
    kl = kl_by_age(rep)
    rate, p = drift_fit(kl)
    return {"age_mean": float(np.mean([r["replay_age_mean"] for r in rep])),
            "kl_mean": float(np.mean([r["replay_kl"] for r in rep])),
            "ess": float(np.mean([r["is_ess"] for r in rep])),
            "clip_share": float(np.mean([r["replay_clip_frac"] for r in rep])),
            # what a replay batch can teach (logged since 2026-12-01; nan for older runs)
            "singleton": float(np.mean([r.get("replay_singleton_frac", np.nan) for r in rep])),
            "adv_nonzero": float(np.mean([r.get("replay_adv_nonzero_frac", np.nan) for r in rep])),
            "drift_rate": rate, "drift_exponent": p,
            "drift_time": 1 / (2 * rate) if rate > 0 else math.inf}


def signal_by_window(rows: list[dict], width: int = 40) -> list[tuple[int, float, float]]:
    """[(first iteration of the window, mean singleton share, mean share of non-zero-advantage
    tokens)] over windows of `width` iterations of a run's replays; [] for runs without them."""
    rep = [r for r in rows if "replay_singleton_frac" in r]
    out = []
    for start in range(0, (rep[-1]["iteration"] + 1) if rep else 0, width):
        w = [r for r in rep if start <= r["iteration"] < start + width]
        if w:
            out.append((start, float(np.mean([r["replay_singleton_frac"] for r in w])),
                        float(np.mean([r["replay_adv_nonzero_frac"] for r in w]))))
    return out

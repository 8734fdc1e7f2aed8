"""The figures of the staleness study's amendment (RESULTS.md, 2026-12-07): what the gradient clip
did to the stale-decay arm, from the runs' own metrics.

    python results/study-staleness/amendment.py
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

RUNS = Path(__file__).resolve().parent.parent / "compare-study-staleness"
ARMS = ("synchronous", "stale-gate", "stale-is", "stale-decay")
SEEDS = range(1100, 1116)
CLIP, TAU = 1.0, 17.0


def rows(arm: str, seed: int) -> list[dict]:
    path = RUNS / f"{arm}-s{seed}" / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def main() -> None:
    norms = {arm: [r["grad_norm"] for s in SEEDS for r in rows(arm, s) if "grad_norm" in r] for arm in ARMS}
    every = np.concatenate([np.array(v) for v in norms.values()])
    live = every[every > 0]  # 0: an update whose batch had no signal (every advantage 0), skipped
    print(f"pre-clip gradient norm of the 64 runs' {every.size} updates: {every.size - live.size} without signal "
          f"(norm 0); the other {live.size}: min {live.min():.1f}, median {np.median(live):.1f}, max {live.max():.1f}, "
          f"above algo.grad_clip {CLIP}: {np.mean(live > CLIP):.1%}")
    for arm, v in norms.items():
        v = np.array(v)
        v = v[v > 0]
        print(f"  {arm}: {v.size} updates with signal, min {v.min():.1f}, median {np.median(v):.1f}, max {v.max():.1f}")
    print("\nthe first stale update of each seed, stale-decay against stale-is (same weights, same batch until the "
          "runs part):")
    ratios, weights, parted = [], [], []
    for s in SEEDS:
        d, i = rows("stale-decay", s), rows("stale-is", s)
        j = next(k for k, r in enumerate(d) if r["batch_age"] > 0)
        assert all(d[k]["loss"] == i[k]["loss"] for k in range(j)), "fresh batches are trained alike"
        ratios.append(d[j]["grad_norm"] / i[j]["grad_norm"])
        weights.append(math.exp(-d[j]["batch_age"] / TAU))
        # the first iteration whose rollouts differ: the weights that generated them differ
        parted.append(next((k for k in range(len(d)) if (d[k]["reward"], d[k]["gen_tokens"]) !=
                            (i[k]["reward"], i[k]["gen_tokens"])), None))
    r, w = np.array(ratios), np.array(weights)
    print(f"  grad-norm ratio / the decay's weight: {np.min(r / w):.6f} to {np.max(r / w):.6f} over 16 seeds "
          "(the loss weight scales the gradient exactly, and the clip then divides it back out)")
    print("  the first iteration whose rollouts differ (the weights that generated them differ), per seed: "
          f"{sorted(parted)}")
    final = {arm: np.array([[r for r in rows(arm, s) if "final_eval_success" in r][-1]["final_eval_success"]
                            for s in SEEDS]) for arm in ("stale-is", "stale-decay")}
    diff = final["stale-decay"] - final["stale-is"]
    print(f"\nfinal validation, stale-decay - stale-is: mean {diff.mean():+.3f}, SD {diff.std(ddof=1):.3f}, "
          f"identical on {int(np.sum(diff == 0))} of 16 seeds")
    gate = np.array([[r for r in rows("stale-gate", s) if "final_eval_success" in r][-1]["final_eval_success"]
                     for s in SEEDS])
    d = final["stale-is"] - gate
    from scipy import stats

    h = stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / d.size ** 0.5
    print(f"stale-is - stale-gate (not registered; the IS arm itself against the gate): mean {d.mean():+.3f}, "
          f"95% [{d.mean() - h:+.3f}, {d.mean() + h:+.3f}], higher on {int(np.sum(d > 0))}/16")


if __name__ == "__main__":
    main()

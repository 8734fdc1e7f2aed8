"""The stale-replay probe's figures (PLAN.md): per arm and seed, the replayed generation ages, the
KL to the current policy and the IS weights by age, and the decay's bite against PER.

    python results/probe-stale-replay/readout.py
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent
RUNS = {"per": "compare-probe-stale-replay/per-s{}", "freshper tau 17": "compare-probe-stale-replay/freshper-s{}",
        "freshper tau 4": "compare-probe-stale-replay-tau4/freshper-tau4-s{}",
        "freshper tau 1": "compare-probe-stale-replay-tau1/freshper-tau1-s{}"}
SEEDS = (1300, 1301)


def histogram(run: Path) -> dict[int, list[float]]:
    """{generation age: [replayed trajectories, KL sum, IS-weight sum]} over the run's iterations."""
    out: dict[int, list[float]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        for g, (c, kl, w) in json.loads(line).get("replay_by_gen_age", {}).items():
            acc = out.setdefault(int(g), [0, 0.0, 0.0])
            acc[0] += c
            acc[1] += kl * c
            acc[2] += w * c
    return out


def mean_age(h) -> float:
    return sum(g * v[0] for g, v in h.items()) / sum(v[0] for v in h.values())


def tv(a, b) -> float:
    na, nb = sum(v[0] for v in a.values()), sum(v[0] for v in b.values())
    return 0.5 * sum(abs(a.get(g, [0])[0] / na - b.get(g, [0])[0] / nb) for g in set(a) | set(b))


def main() -> None:
    hists = {}
    for arm, pattern in RUNS.items():
        for s in SEEDS:
            run = HERE / pattern.format(s)
            if (run / "DONE").exists():
                hists[arm, s] = histogram(run)
    for (arm, s), h in hists.items():
        n = sum(v[0] for v in h.values())
        old = sum(v[0] for g, v in h.items() if g > 8) / n
        print(f"\n{arm}, seed {s}: {n} replayed, mean generation age {mean_age(h):.2f}, older than 8: {old:.3f}")
        print("  age  share   mean KL   mean IS weight")
        for g in sorted(h):
            c, kl, w = h[g]
            print(f"  {g:3d}  {c / n:.3f}  {kl / c:.5f}  {w / c:.3f}")
    print("\nagainst per (same seed): mean age change, total variation")
    for (arm, s), h in hists.items():
        if arm != "per" and ("per", s) in hists:
            p = hists["per", s]
            print(f"  {arm}, seed {s}: {mean_age(h) / mean_age(p) - 1:+.1%} ({mean_age(h):.2f} vs {mean_age(p):.2f}), "
                  f"TV {tv(h, p):.3f}")
    pooled: dict[int, list[float]] = {}
    for h in hists.values():
        for g, (c, kl, _) in h.items():
            acc = pooled.setdefault(g, [0, 0.0])
            acc[0] += c
            acc[1] += kl
    ages = [g for g, (c, _) in pooled.items() if c >= 20]
    if len(ages) >= 2:
        x = np.array(ages, float)
        y = np.array([pooled[g][1] / pooled[g][0] for g in ages])
        slope, icpt = np.polyfit(x, y, 1)
        print(f"\nKL against age, pooled, ages with >= 20 trajectories ({min(ages)}-{max(ages)}): slope {slope:.5f} "
              f"nats a token per version, intercept {icpt:.5f}; drift tau 1/(2r) = "
              f"{1 / (2 * slope) if slope > 0 else float('inf'):.1f}")


if __name__ == "__main__":
    main()

"""The registered readout of "Pre-registered study: replay over stale data" (REGISTRATION.md),
from the runs' metrics alone:

    python results/study-stale-replay/readout.py

Primary: final validation avg@4 (`final_eval_success`), freshper minus per, paired by seed: mean,
90% and 95% t-intervals, and the reading by the registered rule. Secondaries: freshper minus
on-policy-matched and minus on-policy, the same way, and the replayed generation ages per arm
(mean, share older than 8 versions, histogram). Descriptive, per arm: validation before and at
iteration 15, training success over the last 3 iterations, runs that collapsed (training success
0 over their last 3 iterations, and the first iteration from which it stayed 0), the mean KL to the
current policy of replayed trajectories by generation age, and the IS-weight ESS. Until every
registered run has its DONE file it prints how many have, and no figure of any run.
"""
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

from scipy import stats

ROOT = Path(__file__).resolve().parents[1] / "compare-study-stale-replay"
ARMS = ("on-policy-matched", "on-policy", "per", "freshper")
SEEDS = range(1400, 1424)
MARGIN = 0.10


def load(arm: str, seed: int) -> list[dict] | None:
    folder = ROOT / f"{arm}-s{seed}"
    if not (folder / "DONE").exists():
        return None
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]


def paired(a: list[float], b: list[float]) -> dict:
    """a - b by seed: mean, SD, 90% and 95% t-intervals, how often a is higher."""
    d = [x - y for x, y in zip(a, b)]
    m, se = statistics.mean(d), statistics.stdev(d) / len(d) ** 0.5
    out = {"mean": m, "sd": statistics.stdev(d), "higher": sum(x > 0 for x in d), "n": len(d)}
    for level in (0.90, 0.95):
        h = stats.t.ppf(0.5 + level / 2, len(d) - 1) * se
        out[level] = (m - h, m + h)
    return out


def reading(p: dict, better: str, worse: str) -> str:
    """The registered rule: a difference where the 95% interval excludes 0, else equivalence where
    the 90% interval lies within the margin, else not shown."""
    (lo90, hi90), (lo95, hi95) = p[0.90], p[0.95]
    if lo95 > 0:
        return f"{better} better"
    if hi95 < 0:
        return f"{worse} better"
    if -MARGIN < lo90 and hi90 < MARGIN:
        return f"equivalent within +-{MARGIN}"
    return "not shown: neither a difference nor equivalence"


def collapsed_at(rows: list[dict]) -> int | None:
    """The first iteration from which training success stayed 0, for a run whose last 3 were 0."""
    if any(r["success"] > 0 for r in rows[-3:]):
        return None
    i = len(rows)
    while i > 0 and rows[i - 1]["success"] == 0:
        i -= 1
    return rows[i]["iteration"] if i < len(rows) else None


def replayed(rs: list[list[dict]]) -> dict[int, list[float]]:
    """{generation age: [replayed trajectories, KL sum]} over the runs' replay updates."""
    out: dict[int, list[float]] = {}
    for r in rs:
        for x in r:
            for g, (c, kl, _) in x.get("replay_by_gen_age", {}).items():
                acc = out.setdefault(int(g), [0, 0.0])
                acc[0] += c
                acc[1] += kl * c
    return out


def main():
    runs = {(a, s): load(a, s) for a in ARMS for s in SEEDS}
    missing = [f"{a}-s{s}" for (a, s), r in runs.items() if r is None]
    print(f"runs done: {len(runs) - len(missing)} of {len(runs)}")
    if missing:  # no figure of any run before all are in, as registered
        print("incomplete: no readout until every registered run is in; missing " + ", ".join(missing))
        sys.exit(0)
    final = {a: [runs[(a, s)][-1]["final_eval_success"] for s in SEEDS] for a in ARMS}
    print("| arm | " + " | ".join(f"s{s}" for s in SEEDS) + " | mean |")
    print("|---|" + "---|" * (len(SEEDS) + 1))
    for a in ARMS:
        print(f"| {a} | " + " | ".join(f"{v:.3f}" for v in final[a]) + f" | {statistics.mean(final[a]):.3f} |")
    for label, (x, y) in {"primary: freshper - per": ("freshper", "per"),
                          "freshper - on-policy-matched": ("freshper", "on-policy-matched"),
                          "freshper - on-policy": ("freshper", "on-policy")}.items():
        p = paired(final[x], final[y])
        print(f"{label}: {p['mean']:+.3f} (SD {p['sd']:.3f}), 90% [{p[0.90][0]:+.3f}, {p[0.90][1]:+.3f}], "
              f"95% [{p[0.95][0]:+.3f}, {p[0.95][1]:+.3f}], {x} higher on {p['higher']}/{p['n']}; "
              f"reading: {reading(p, x, y)}")
    for a in ARMS:
        rs = [runs[(a, s)] for s in SEEDS]
        ev = lambda r, i: next(x["eval_success"] for x in r if x.get("iteration") == i and "eval_success" in x)  # noqa: E731
        collapsed = {s: collapsed_at(r) for s, r in zip(SEEDS, rs) if collapsed_at(r) is not None}
        ages = Counter(x["batch_age"] for r in rs for x in r if "loss" in x)
        print(f"\n{a}: validation before {statistics.mean(ev(r, 0) for r in rs):.3f}, at 15 "
              f"{statistics.mean(ev(r, 15) for r in rs):.3f}; training success over the last 3 iterations "
              f"{statistics.mean(statistics.mean(x['success'] for x in r[-3:]) for r in rs):.3f}; optimizer "
              f"updates a run {statistics.mean(r[-1]['updates'] for r in rs):.1f}; collapsed runs "
              f"{collapsed or 'none'}; ages of the on-policy batches {dict(sorted(ages.items()))}")
        h = replayed(rs)
        if h:
            n = sum(c for c, _ in h.values())
            mean_age = sum(g * c for g, (c, _) in h.items()) / n
            old = sum(c for g, (c, _) in h.items() if g > 8) / n
            ess = statistics.mean(x["is_ess"] for r in rs for x in r if "is_ess" in x)
            print(f"  replayed: {n} trajectories, mean generation age {mean_age:.2f}, older than 8 versions "
                  f"{old:.3f}, IS-weight ESS {ess:.3f}")
            print("  by generation age (share, mean KL to the current policy per token): " +
                  ", ".join(f"{g}: {c / n:.3f} {kl / c:.4f}" for g, (c, kl) in sorted(h.items())))


if __name__ == "__main__":
    main()

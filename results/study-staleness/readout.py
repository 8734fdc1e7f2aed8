"""The registered readout of "Pre-registered study: keep stale rollouts or drop them"
(REGISTRATION.md), from the runs' metrics alone:

    python results/study-staleness/readout.py

Primary: final validation avg@4 (`final_eval_success`), stale-decay minus stale-gate, paired by
seed: mean, 90% and 95% t-intervals, and the reading by the registered rule. Secondaries:
stale-decay minus stale-is and minus synchronous, the same way; the gate's share of generated
episodes dropped. Descriptive, per arm: validation before and at iteration 15, training success
over the last 3 iterations, runs that collapsed (training success 0 over their last 3
iterations, and the first iteration from which it stayed 0), the mean age of the batches that
reached their update and of those trained on (the gate drops some), the mean decay weight,
and the training ages' histogram. Until every registered run has its DONE file it prints how many
have, and no figure of any run.
"""
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

from scipy import stats

ROOT = Path(__file__).resolve().parents[1] / "compare-study-staleness"
ARMS = ("synchronous", "stale-gate", "stale-is", "stale-decay")
SEEDS = range(1100, 1116)
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
    for label, (x, y) in {"primary: stale-decay - stale-gate": ("stale-decay", "stale-gate"),
                          "stale-decay - stale-is": ("stale-decay", "stale-is"),
                          "stale-decay - synchronous": ("stale-decay", "synchronous"),
                          "stale-gate - synchronous": ("stale-gate", "synchronous"),
                          "stale-is - synchronous": ("stale-is", "synchronous")}.items():
        p = paired(final[x], final[y])
        print(f"{label}: {p['mean']:+.3f} (SD {p['sd']:.3f}), 90% [{p[0.90][0]:+.3f}, {p[0.90][1]:+.3f}], "
              f"95% [{p[0.95][0]:+.3f}, {p[0.95][1]:+.3f}], {x} higher on {p['higher']}/{p['n']}; "
              f"reading: {reading(p, x, y)}")
    for a in ARMS:
        rs = [runs[(a, s)] for s in SEEDS]
        ev = lambda r, i: next(x["eval_success"] for x in r if x.get("iteration") == i and "eval_success" in x)  # noqa: E731
        # the batches that reached their iteration (trained or dropped); lockstep also generates a
        # few ahead that the budget's end leaves untrained, reported apart ("tail")
        reached = sum(len(r) for r in rs) * 32
        tail = sum(x.get("episodes_generated", 0) for r in rs for x in r) - reached
        dropped = sum(r[-1].get("episodes_dropped_total", 0) for r in rs)
        ages = Counter(x["batch_age"] for r in rs for x in r if "loss" in x)  # the gate's dropped have no loss
        mean_age = statistics.mean(x["batch_age"] for r in rs for x in r)
        collapsed = {s: collapsed_at(r) for s, r in zip(SEEDS, rs) if collapsed_at(r) is not None}
        print(f"{a}: validation before {statistics.mean(ev(r, 0) for r in rs):.3f}, at 15 "
              f"{statistics.mean(ev(r, 15) for r in rs):.3f}; training success over the last 3 iterations "
              f"{statistics.mean(statistics.mean(x['success'] for x in r[-3:]) for r in rs):.3f}; "
              f"mean age of the batches that reached their update {mean_age:.2f} "
              f"(trained on: {statistics.mean(ages.elements()):.2f}), mean decay weight "
              f"{statistics.mean(x['batch_weight'] for r in rs for x in r):.3f}; dropped {dropped} of the {reached} "
              f"episodes that reached their update ({dropped / reached:.3f}); generated ahead and never reached "
              f"{tail}; collapsed runs {collapsed or 'none'}; "
              f"ages of the batches trained on {dict(sorted(ages.items()))}")


if __name__ == "__main__":
    main()

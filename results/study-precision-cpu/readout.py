"""The registered readout of "Pre-registered study: bf16 against float32 on the CPU"
(REGISTRATION.md), from the runs' metrics alone:

    python results/study-precision-cpu/readout.py

Primary: final validation avg@4 (`final_eval_success`), bf16 minus float32, paired by seed; its
mean, the 90% t-interval (two one-sided tests at 5% against the margin) and the 95% t-interval,
and the reading by the registered rule. Descriptive: validation before, training success over
the last 3 iterations, the runs' training seconds (compute_seconds: every timed phase but
validation and checkpoints; two runs at once, one thread each), per arm. Until every
registered run has its DONE file it prints how many have, and no figure of any run.
"""
import json
import statistics
import sys
from pathlib import Path

from scipy import stats

from freshper.trainer.train.metrics import compute_seconds

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"float32": ROOT / "compare-precision-float32", "bf16": ROOT / "compare-precision-bf16"}
SEEDS = range(1000, 1016)
MARGIN = 0.10


def run(arm: str, seed: int) -> list[dict] | None:
    folder = ARMS[arm] / f"freshper-s{seed}"
    if not (folder / "DONE").exists():
        return None
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]


def interval(d: list[float], level: float) -> tuple[float, float]:
    m, se = statistics.mean(d), statistics.stdev(d) / len(d) ** 0.5
    h = stats.t.ppf(0.5 + level / 2, len(d) - 1) * se
    return m - h, m + h


def reading(lo90: float, hi90: float, lo95: float, hi95: float) -> str:
    if -MARGIN < lo90 and hi90 < MARGIN:
        return "equivalent within the margin"
    if hi90 < -MARGIN:
        return "bf16 worse by more than the margin"
    if hi95 < 0:
        return "bf16 learns less (not equivalent)"
    if lo95 > 0:
        return "bf16 learns more (not shown equivalent)"
    return "inconclusive: neither equivalence nor a difference shown"


def main():
    runs = {(a, s): run(a, s) for a in ARMS for s in SEEDS}
    missing = [f"{a}-s{s}" for (a, s), r in runs.items() if r is None]
    print(f"runs done: {len(runs) - len(missing)} of {len(runs)}")
    if missing:  # no figure of any run before all are in, as registered
        print("incomplete: no readout until every registered run is in; missing " + ", ".join(missing))
        sys.exit(0)
    final = {k: r[-1]["final_eval_success"] for k, r in runs.items() if r is not None}
    print("| arm | " + " | ".join(f"s{s}" for s in SEEDS) + " | mean |")
    print("|---|" + "---|" * (len(SEEDS) + 1))
    for a in ARMS:
        vals = [final.get((a, s)) for s in SEEDS]
        done = [v for v in vals if v is not None]
        print(f"| {a} | " + " | ".join("–" if v is None else f"{v:.3f}" for v in vals) +
              f" | {statistics.mean(done) if done else float('nan'):.3f} |")
    for a in ARMS:
        rs = [r for (b, _), r in runs.items() if b == a and r is not None]
        if not rs:
            continue
        before = statistics.mean(next(x["eval_success"] for x in r if "eval_success" in x) for r in rs)
        last3 = statistics.mean(statistics.mean(x["success"] for x in r[-3:]) for r in rs)
        secs = statistics.median(sum(compute_seconds(x) for x in r) for r in rs)
        print(f"{a}: validation before {before:.3f}, training success over the last 3 iterations {last3:.3f}, "
              f"median training seconds {secs:.0f} ({len(rs)} runs)")
    d = [final[("bf16", s)] - final[("float32", s)] for s in SEEDS]
    lo90, hi90 = interval(d, 0.90)
    lo95, hi95 = interval(d, 0.95)
    print(f"bf16 - float32, paired over {len(d)} seeds: mean {statistics.mean(d):+.3f}, SD {statistics.stdev(d):.3f}, "
          f"90% [{lo90:+.3f}, {hi90:+.3f}], 95% [{lo95:+.3f}, {hi95:+.3f}], bf16 higher on "
          f"{sum(x > 0 for x in d)}/{len(d)}")
    print(f"reading (margin +-{MARGIN}): {reading(lo90, hi90, lo95, hi95)}")


if __name__ == "__main__":
    main()

"""The registered readouts, recomputed from the runs' metrics.jsonl alone, apart from
`freshper compare`'s code: each run's final validation avg@4 (`final_eval_success`, all 31
held-out problems x 4 replies after the last iteration), paired by seed, mean difference and its
95% t-interval (scipy's t quantile, not trainer/intervals.py's table), and the reading rule of
the registration (results/study-multiply/REGISTRATION.md) applied to each contrast it names. Then, for
the result's description (RESULTS.md, results/study-multiply/README.md), each arm's mean
validation by iteration and its median run time.

    python results/compare-study-multiply/readout.py [FOLDER]   (default: this file's folder;
    needs scipy, in the dev extra)
"""
import json
import statistics
import sys
from pathlib import Path

from scipy.stats import t

ARMS = ("on-policy-matched", "uniform", "per-gate", "per", "freshper")
# (arm, baseline), primary first; the rest are the registration's secondary contrasts.
CONTRASTS = (("freshper", "on-policy-matched"), ("uniform", "on-policy-matched"),
             ("per-gate", "on-policy-matched"), ("per", "on-policy-matched"),
             ("freshper", "per"), ("freshper", "per-gate"))


def metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def final_eval(run: Path) -> float:
    last = [r["final_eval_success"] for r in metrics(run) if "final_eval_success" in r]
    if len(last) != 1:
        raise ValueError(f"{run}: expected one final validation, found {len(last)}")
    return last[0]


def reading(lo: float, hi: float) -> str:
    if lo > 0:
        return "beats"
    if hi < 0:
        return "worse"
    return "no difference detected"


def main(folder: Path):
    seeds = sorted({int(p.parent.name.rsplit("-s", 1)[1]) for p in folder.glob("*-s*/DONE")})
    val = {a: {s: final_eval(folder / f"{a}-s{s}") for s in seeds} for a in ARMS}
    print("final validation avg@4 by seed\n\n| arm | " + " | ".join(f"s{s}" for s in seeds)
          + " | mean |\n|---|" + "---|" * (len(seeds) + 1))
    for a in ARMS:
        v = [val[a][s] for s in seeds]
        print(f"| {a} | " + " | ".join(f"{x:.3f}" for x in v) + f" | {statistics.fmean(v):.3f} |")
    print("\npaired differences, mean and 95% t-interval\n\n"
          "| contrast | seeds | mean | 95% interval | higher on | reading |\n|---|---|---|---|---|---|")
    for a, b in CONTRASTS:
        d = [val[a][s] - val[b][s] for s in seeds]
        m, n = statistics.fmean(d), len(d)
        h = t.ppf(0.975, n - 1) * statistics.stdev(d) / n ** 0.5
        print(f"| {a} - {b} | {n} | {m:+.3f} | [{m - h:+.3f}, {m + h:+.3f}] | {sum(x > 0 for x in d)}/{n} "
              f"| {reading(m - h, m + h)} |")
    print("\nmean validation avg@4 over the seeds by iteration, and median run seconds (DONE) over seeds 1-9\n"
          "(uniform-s1's and per-gate-s1's DONE hold only their resumed part: machines.md)\n\n"
          "| arm | it. 0 | it. 10 | it. 20 | final | median run s |\n|---|---|---|---|---|---|")
    for a in ARMS:
        by_it: dict[int, list[float]] = {}
        for s in seeds:
            for r in metrics(folder / f"{a}-s{s}"):
                if "eval_success" in r:
                    by_it.setdefault(r["iteration"], []).append(r["eval_success"])
        secs = [float((folder / f"{a}-s{s}" / "DONE").read_text().split()[0]) for s in seeds if s >= 1]
        cols = " | ".join(f"{statistics.fmean(by_it[i]):.3f}" for i in sorted(by_it))
        print(f"| {a} | {cols} | {statistics.fmean(val[a].values()):.3f} | {statistics.median(secs):.0f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)

"""The game study's registered readouts (results/study-frozenlake/REGISTRATION.md, "Pre-registered
study: FreshPER on FrozenLake"), recomputed from the runs' metrics.jsonl alone, apart from
`freshper compare`'s code. Written before any study run had finished.

- Primary: final validation success (`final_eval_success`: 32 held-out states x 2 replies after
  the last iteration), freshper-group minus the control, paired by seed, mean and 95% t-interval
  (scipy's t quantile), read by the registered rule; then the secondary contrasts by the same rule.
- Did staleness arise: PER's mean replayed age and KL(mu || pi) per token over its replay
  updates, and its drift time 1/(2r), r fitted through the origin on the age-binned KL the runs
  log (each bin at its mean age for ages drawn evenly within it), mean over seeds; criteria (a)
  age >= drift time and (b) KL >= 0.1.
- For the description: each arm's mean validation by iteration, the warm start's validation (each
  seed's iteration 0: the same weights in every run), and the median run time (DONE).

    python results/compare-study-frozenlake/readout.py [FOLDER]   (default: this file's folder;
    needs scipy, in the dev extra)
"""
import json
import statistics
import sys
from pathlib import Path

from scipy.stats import t

CONTROL = "on-policy-matched"
ARMS = (CONTROL, "uniform", "per", "freshper", "freshper-group")
# (arm, baseline), primary first; the rest are the registration's secondary contrasts
CONTRASTS = (("freshper-group", CONTROL), ("uniform", CONTROL), ("per", CONTROL), ("freshper", CONTROL),
             ("freshper", "per"), ("freshper-group", "freshper"))
NAMES = {"freshper-group": "FreshPER with whole-group replay", "freshper": "FreshPER", "per": "PER",
         "uniform": "uniform replay", CONTROL: "the update-matched control"}


def metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def final_eval(rows: list[dict], run: Path) -> float:
    last = [r["final_eval_success"] for r in rows if "final_eval_success" in r]
    if len(last) != 1:
        raise ValueError(f"{run}: expected one final validation, found {len(last)}")
    return last[0]


def interval(d: list[float]) -> tuple[float, float]:
    m, n = statistics.fmean(d), len(d)
    return m, t.ppf(0.975, n - 1) * statistics.stdev(d) / n ** 0.5


def reading(a: str, b: str, lo: float, hi: float) -> str:
    if lo > 0:
        return f"{NAMES[a]} beats {NAMES[b]}"
    if hi < 0:
        return f"{NAMES[a]} is worse than {NAMES[b]}"
    return "no difference detected"


def staleness(rows: list[dict]) -> tuple[float, float, float]:
    """(mean replayed age, mean KL per token, drift time 1/(2r)) of one replay run."""
    rep = [r for r in rows if "replay_kl_by_age" in r]
    num = den = 0.0
    for r in rep:
        for low, (kl, n) in r["replay_kl_by_age"].items():
            low = int(low)
            age = 0.0 if low == 0 else (low + 2 * low - 1) / 2  # ages low .. 2*low-1, midpoint
            num += n * age * kl
            den += n * age * age
    rate = num / den if den else float("nan")
    return (statistics.fmean(r["replay_age_mean"] for r in rep), statistics.fmean(r["replay_kl"] for r in rep),
            1 / (2 * rate) if rate > 0 else float("inf"))


def main(folder: Path):
    seeds = sorted({int(p.parent.name.rsplit("-s", 1)[1]) for p in folder.glob("*-s*/DONE")})
    rows = {(a, s): metrics(folder / f"{a}-s{s}") for a in ARMS for s in seeds}
    val = {a: {s: final_eval(rows[a, s], folder / f"{a}-s{s}") for s in seeds} for a in ARMS}
    print("final validation success by seed\n\n| arm | " + " | ".join(f"s{s}" for s in seeds)
          + " | mean |\n|---|" + "---|" * (len(seeds) + 1))
    for a in ARMS:
        v = [val[a][s] for s in seeds]
        print(f"| {a} | " + " | ".join(f"{x:.3f}" for x in v) + f" | {statistics.fmean(v):.3f} |")
    print("\npaired differences, mean and 95% t-interval (the first is the primary readout)\n\n"
          "| contrast | seeds | mean | 95% interval | higher on | reading |\n|---|---|---|---|---|---|")
    for a, b in CONTRASTS:
        d = [val[a][s] - val[b][s] for s in seeds]
        m, h = interval(d)
        print(f"| {a} - {b} | {len(d)} | {m:+.3f} | [{m - h:+.3f}, {m + h:+.3f}] | {sum(x > 0 for x in d)}/{len(d)} "
              f"| {reading(a, b, m - h, m + h)} |")
    print("\ndid staleness arise: PER over the whole run, mean over seeds")
    per = [staleness(rows["per", s]) for s in seeds]
    age, kl, tau = (statistics.fmean(x[i] for x in per) for i in range(3))
    print(f"  mean replayed age {age:.2f} iterations, drift time 1/(2r) {tau:.1f}: "
          f"(a) {'holds' if age >= tau else 'fails'}")
    print(f"  mean KL(mu||pi) {kl:.4f} nats/token: (b) {'holds' if kl >= 0.1 else 'fails'}")
    # a seed's arms read iteration 0 with the same weights and random numbers: one reading a seed
    start = [rows[CONTROL, s][0]["eval_success"] for s in seeds]
    print(f"\nthe warm start's validation (iteration 0, the same weights in every run): mean "
          f"{statistics.fmean(start):.3f}, SD {statistics.stdev(start):.3f} over {len(start)} seeds")
    print("\nmean validation success over the seeds by iteration, and median run seconds (DONE)\n\n"
          "| arm | by iteration | final | median run s |\n|---|---|---|---|")
    for a in ARMS:
        by_it: dict[int, list[float]] = {}
        for s in seeds:
            for r in rows[a, s]:
                if "eval_success" in r:
                    by_it.setdefault(r["iteration"], []).append(r["eval_success"])
        secs = [float((folder / f"{a}-s{s}" / "DONE").read_text().split()[0]) for s in seeds]
        curve = ", ".join(f"{i}: {statistics.fmean(v):.3f}" for i, v in sorted(by_it.items()))
        print(f"| {a} | {curve} | {statistics.fmean(val[a].values()):.3f} | {statistics.median(secs):.0f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)

"""Pilot 7's readouts for the game study's registration, from the runs' metrics alone: each run's
validation at the start (iteration 0, the shared warm-started weights) and at the end, the paired
difference FreshPER minus the control by seed, its SD, and what that SD implies for the number
of seeds (power of a two-sided paired t-test at alpha 0.05). Also the noise of one validation
(64 replies) from the spread of the iteration-0 readings, which all measure the same weights.

Run: python results/pilot-corners/pilot7.py [FOLDER]   (default: results/pilot-corners/pilot7)
"""
import json
import statistics
import sys
from pathlib import Path

from scipy import optimize, stats

folder = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "pilot7")
CONTROL, ARM = "on-policy-matched", "freshper"


def readings(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    curve = [(r["env_steps"], r["eval_success"]) for r in rows if "eval_success" in r]
    # seconds per iteration after the first (first calls, warm caches): both update passes, generation
    updates = [r["time_onpolicy_update"] + r.get("time_replay_update", 0.0) for r in rows[1:]]
    return {"start": rows[0]["eval_success"], "final": last["final_eval_success"], "env_steps": last["env_steps"],
            "iterations": len(rows), "curve": curve, "updates": updates,
            "generate": [r["time_generate"] for r in rows[1:]],
            "eval": [r["time_eval"] for r in rows if "time_eval" in r]}


def power(sd: float, effect: float, n: int, alpha: float = 0.05) -> float:
    """Power of a two-sided paired t-test with n pairs when the differences have SD `sd`."""
    df, nc = n - 1, effect / (sd / n ** 0.5)
    crit = stats.t.ppf(1 - alpha / 2, df)
    p = float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))
    # scipy's noncentral t gives nan far out in the tail, where the power is 1 to many digits
    return p if p == p else float(stats.norm.sf(crit - nc))


runs = {p.name: readings(p) for p in sorted(folder.iterdir()) if (p / "DONE").exists()}
seeds = sorted({int(name.rsplit("-s", 1)[1]) for name in runs})
print("run: validation at the start -> at the end (env steps, iterations); the curve (env steps, validation)")
for name, r in runs.items():
    print(f"  {name}: {r['start']:.3f} -> {r['final']:.3f} ({r['env_steps']}, {r['iterations']}); {r['curve']}")

# a seed's arms read iteration 0 with the same weights and the same random numbers: one reading a seed
cost = {k: [x for r in runs.values() for x in r[k]] for k in ("updates", "generate", "eval")}
print("seconds: " + "; ".join(f"{k} {min(v):.0f}-{max(v):.0f}" for k, v in cost.items())
      + " (updates: both passes of an iteration; iterations after the first; eval: one validation)")

starts = [runs[f"{CONTROL}-s{s}"]["start"] for s in seeds if f"{CONTROL}-s{s}" in runs]
print(f"\niteration 0 (the same weights in every run; one reading a seed, its arms read alike): "
      f"{', '.join(f'{x:.3f}' for x in starts)}; mean {statistics.mean(starts):.3f}, SD {statistics.stdev(starts):.3f} "
      f"(one validation's noise)")
for arm in (CONTROL, ARM):
    rise = [runs[f"{arm}-s{s}"]["final"] - runs[f"{arm}-s{s}"]["start"] for s in seeds if f"{arm}-s{s}" in runs]
    finals = [runs[f"{arm}-s{s}"]["final"] for s in seeds if f"{arm}-s{s}" in runs]
    print(f"{arm}: final mean {statistics.mean(finals):.3f} (SD {statistics.stdev(finals):.3f}); "
          f"rise from its own start {statistics.mean(rise):+.3f} (per seed {', '.join(f'{x:+.3f}' for x in rise)})")

diff = [runs[f"{ARM}-s{s}"]["final"] - runs[f"{CONTROL}-s{s}"]["final"] for s in seeds
        if f"{ARM}-s{s}" in runs and f"{CONTROL}-s{s}" in runs]
sd = statistics.stdev(diff)
print(f"\nfinal validation, {ARM} minus {CONTROL}, by seed: {', '.join(f'{d:+.3f}' for d in diff)}; "
      f"mean {statistics.mean(diff):+.3f}, SD {sd:.3f} ({len(diff)} pairs)")
# The SD of 3 pairs is itself uncertain: its 80% upper confidence bound sizes the study too.
upper = sd * ((len(diff) - 1) / stats.chi2.ppf(0.2, len(diff) - 1)) ** 0.5
print(f"80% upper bound of that SD (chi-square, {len(diff) - 1} df): {upper:.3f}")
for label, s_ in (("SD", sd), ("its 80% upper bound", upper)):
    for effect in (0.10, 0.15, 0.20):
        need = next((n for n in range(3, 200) if power(s_, effect, n) >= 0.8), None)
        print(f"  {label} {s_:.3f}, effect {effect:.2f}: power at 10 seeds {power(s_, effect, 10):.2f}, "
              f"at 12 {power(s_, effect, 12):.2f}; 80% power needs {need} seeds")
    # the smallest difference a 10-seed study detects with 80% power (the game registration's figure)
    smallest = optimize.brentq(lambda e, s_=s_: power(s_, e, 10) - 0.8, 0.01, 0.5)
    print(f"  {label} {s_:.3f}: the smallest effect with 80% power at 10 seeds is {smallest:.3f}")

"""Did staleness arise? The pre-registration's two criteria (results/study-multiply/REGISTRATION.md,
"Did staleness arise?"),
from each replay run's metrics.jsonl: the mean replayed age and the mean per-token KL(mu || pi)
of replayed trajectories (k3) over the run's last 10 iterations, and the run's drift time
1/(2r) from its KL-by-age line (trainer/replay_stats.replay_summary, as freshper compare's table).

    python results/compare-study-multiply/staleness.py [FOLDER]   (default: this file's folder)
"""
import json
import math
import statistics
import sys
from pathlib import Path

from freshper.trainer.replay_stats import replay_summary

ARMS = ("uniform", "per-gate", "per", "freshper")


def last10(rows, key):
    vals = [r[key] for r in rows if key in r][-10:]
    return statistics.fmean(vals)


def main(folder: Path):
    print("| arm | seeds | age replayed, last 10 it. | KL/token replayed, last 10 it. | ESS factor exp(-2 KL) "
          "| drift time 1/(2r) |\n|---|---|---|---|---|---|")
    for arm in ARMS:
        runs = sorted(folder.glob(f"{arm}-s*/DONE"))
        if not runs:
            continue
        age, kl, drift = [], [], []
        for done in runs:
            rows = [json.loads(x) for x in (done.parent / "metrics.jsonl").read_text().splitlines()]
            rows = [r for r in rows if "replay_age_mean" in r]
            age.append(last10(rows, "replay_age_mean"))
            kl.append(last10(rows, "replay_kl"))
            drift.append(replay_summary(rows)["drift_time"])
        k = statistics.fmean(kl)
        print(f"| {arm} | {len(runs)} | {statistics.fmean(age):.2f} (per seed {min(age):.1f}-{max(age):.1f}) "
              f"| {k:.3f} (per seed {min(kl):.3f}-{max(kl):.3f}) | {math.exp(-2 * k):.2f} "
              f"| {statistics.fmean(drift):.1f} (per seed {min(drift):.1f}-{max(drift):.1f}) |")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)

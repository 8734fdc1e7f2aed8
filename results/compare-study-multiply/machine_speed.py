"""Seconds of training work per iteration (every timed phase but validation and checkpoints,
as freshper compare counts compute), median over iterations 1-29, for the arms that ran on both
machine types: the figure behind RESULTS.md's amendment. Reads timing columns only.

    python results/compare-study-multiply/machine_speed.py
"""
import json
import statistics
from pathlib import Path

from freshper.trainer.train.metrics import compute_seconds

HERE = Path(__file__).parent
for arm in ("on-policy-matched", "uniform"):
    med = {}
    for seed in (0, 1):
        rows = [json.loads(x) for x in (HERE / f"{arm}-s{seed}" / "metrics.jsonl").read_text().splitlines()]
        med[seed] = statistics.median(compute_seconds(r) for r in rows[1:])
    print(f"{arm}: s0 (AVX2-only) {med[0]:.1f} s, s1 (AVX-512) {med[1]:.1f} s an iteration; "
          f"s1/s0 = {med[1] / med[0]:.2f}")

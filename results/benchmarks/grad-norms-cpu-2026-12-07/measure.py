"""Pre-clip gradient norms of every CPU preset: how often `algo.grad_clip` (1.0) clips an update.

Runs each preset for a few iterations at its own settings (no validation, one torch thread) and
prints, per preset, the median and range of the on-policy update's pre-clip norm (`grad_norm`)
and of the replay updates' (`replay_grad_norm`), and the share of updates above the clip. A
norm of 0 is an update with no signal (every advantage 0); those are counted apart.

    python results/benchmarks/grad-norms-cpu-2026-12-07/measure.py [--iterations 6] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PRESETS = ("tiny", "frozenlake", "sokoban-simple", "sokoban-hard", "math-cpu", "search-cpu", "frozenlake-vlm-cpu",
           "sokoban-vlm-cpu", "geoqa-cpu", "smollm2-135m-math", "smollm2-135m-multiply", "smollm2-135m-frozenlake",
           "smollm2-135m-sokoban")


def summary(values: list[float], clip: float) -> str:
    g = np.array(values, dtype=float)
    nz = g[g > 0]
    if not nz.size:
        return f"{len(g)} updates, all without signal"
    return (f"median {np.median(nz):.2f}, range {nz.min():.2f}-{nz.max():.2f}, above the clip {np.mean(nz > clip):.0%} "
            f"of {len(nz)} (and {len(g) - len(nz)} without signal)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--out", default="")
    p.add_argument("--presets", default=",".join(PRESETS))
    args = p.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="grad-norms-"))
    for preset in args.presets.split(","):
        run = out / preset
        if not (run / "metrics.jsonl").exists():
            cmd = [sys.executable, "-m", "freshper.trainer.cli", "train", "--preset", preset,
                   f"--train.iterations={args.iterations}", "--eval.every=0", "--train.threads=1",
                   "--train.progress=false", f"--train.run_dir={out}", f"--train.name={preset}"]
            with open(out / f"{preset}.log", "w") as log:
                rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
            if rc:
                print(f"{preset}: failed (exit {rc}), see {out / (preset + '.log')}", flush=True)
                continue
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        clip = 1.0
        on = [r["grad_norm"] for r in rows if "grad_norm" in r]
        rep = [r["replay_grad_norm"] for r in rows if "replay_grad_norm" in r]
        print(f"{preset}: on-policy {summary(on, clip)}" + (f"; replay {summary(rep, clip)}" if rep else ""),
              flush=True)


if __name__ == "__main__":
    main()

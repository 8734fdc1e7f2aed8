"""Asynchronous generation against synchronous, on this machine: one preset's iterations, runs
alternated so both see the same machine state.

    python -m freshper.profiling.bench_async [--preset smollm2-135m-math] [--iterations 4]
        [--skip 1] [--rounds 3] [--threads 2] [--max-lag 2] [--first sync|async] [--args "..."]
        [--keep DIR]

The synchronous runs use all `--threads` for the trainer; the asynchronous ones split them, half
to the trainer (train.threads) and half to the generation worker (rollout.worker_threads). Each
run is `freshper train` with validation off in a fresh folder. The first `--skip` iterations are
left out: iteration 0 (the worker's start, first calls) by default; max_lag + 1 also leaves out
the worker's head start (it may generate batches 0..max_lag before the first update, so where
generation is the slower side, iterations up to max_lag find their batch waiting). An
iteration's seconds are the trainer's phases summed (trainer/train/metrics.py compute_seconds):
for an asynchronous run its rollout phase is the time it waited for the worker.

After each run one line: its median iteration seconds and episodes per second, and every
iteration's batch age (metrics.jsonl's `batch_age`: 0 throughout a synchronous run). Then, per
mode, the median iteration seconds and episodes per second over all rounds, the mean batch age,
for the asynchronous runs the trainer's and the worker's idle seconds per iteration, and the
speed-up. `--first async` runs the asynchronous mode first in each round (the GPU call's order:
the path never run on a GPU gets the time first). A run that fails is reported in its line and
the other runs go on; the exit status is then 1. `--keep DIR` copies each run's metrics.jsonl
there.
"""
import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from freshper.profiling.bench_iteration_at import run
from freshper.trainer.train.metrics import compute_seconds


def summary(rows: list[dict], skip: int = 1) -> dict:
    """Per-iteration lists over rows[skip:]: seconds, episodes, batch age, the trainer's wait and
    the worker's idle seconds."""
    body = rows[skip:]
    secs = [compute_seconds(r) for r in body]
    return {"seconds": secs, "episodes": [r["episodes"] - p["episodes"] for p, r in zip(rows[skip - 1:], body)],
            "age": [r.get("batch_age", 0) for r in body], "wait": [r.get("trainer_wait_s", 0.0) for r in body],
            "idle": [r.get("worker_idle_s", 0.0) for r in body]}


def per_second(g: dict) -> float:
    """Median episodes per second over the iterations of `summary`'s (or several merged) lists."""
    return statistics.median(e / s for e, s in zip(g["episodes"], g["seconds"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--preset", default="smollm2-135m-math")
    ap.add_argument("--iterations", type=int, default=4, help="per run; the first --skip are left out")
    ap.add_argument("--skip", type=int, default=1,
                    help="iterations left out at the start of each run (1: iteration 0, the worker's start; "
                         "max-lag + 1 leaves out the batches the worker may have made before the first update)")
    ap.add_argument("--rounds", type=int, default=3, help="both modes, this many times (--first: which first)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in all (async: half each)")
    ap.add_argument("--max-lag", type=int, default=2, help="rollout.max_lag of the asynchronous runs")
    ap.add_argument("--args", default="", help="more train options for both, as one string")
    ap.add_argument("--first", choices=("sync", "async"), default="sync", help="the mode each round runs first")
    ap.add_argument("--keep", type=Path, default=None, help="copy each run's metrics.jsonl to this folder")
    a = ap.parse_args(argv)
    if a.skip < 1 or a.iterations <= a.skip or a.rounds < 1:
        ap.error("--skip must be >= 1 (iteration 0 is the worker's start), --iterations > --skip, --rounds >= 1")
    if a.threads < 2:
        ap.error("--threads must be >= 2: the asynchronous runs give half to each process")
    extra = a.args.split()
    modes = {"sync": (a.threads, []),
             "async": (a.threads // 2, ["--rollout.asynchronous", "true", "--rollout.worker_threads",
                                        str(a.threads - a.threads // 2), "--rollout.max_lag", str(a.max_lag)])}
    got = {m: {"seconds": [], "episodes": [], "age": [], "wait": [], "idle": []} for m in modes}
    order = ("async", "sync") if a.first == "async" else ("sync", "async")
    failed = 0
    for i in range(a.rounds):
        for m in order:
            threads, more = modes[m]
            with tempfile.TemporaryDirectory() as d:
                try:
                    rows = run(sys.executable, a.preset, a.iterations, threads, Path(d), [*more, *extra])
                except subprocess.CalledProcessError as e:  # its log went to stderr above; the other mode still runs
                    print(f"round {i} {m}: FAILED with exit status {e.returncode} (its log is above)", flush=True)
                    failed += 1
                    continue
                if a.keep:
                    a.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(Path(d) / "run" / "metrics.jsonl", a.keep / f"{m}{i}.jsonl")
            one = summary(rows, a.skip)
            for k, v in one.items():
                got[m][k] += v
            print(f"round {i} {m}: iteration {statistics.median(one['seconds']):.2f} s, episodes/s "
                  f"{per_second(one):.2f}, batch ages {' '.join(str(r.get('batch_age', 0)) for r in rows)}", flush=True)
    print(f"\n{a.preset}, {a.iterations - a.skip} iterations (from iteration {a.skip}) x {a.rounds} rounds per mode, "
          f"{a.threads} threads in all")
    rate = {}
    for m in order:
        g = got[m]
        if not g["seconds"]:
            print(f"{m:5s}  no run finished")
            continue
        rate[m] = per_second(g)
        line = (f"{m:5s}  iteration {statistics.median(g['seconds']):6.2f} s  episodes/s {rate[m]:6.2f}"
                f"  batch age {statistics.mean(g['age']):.2f}")
        if m == "async":
            line += (f"  trainer waits {statistics.mean(g['wait']):.2f} s"
                     f"  worker idle {statistics.mean(g['idle']):.2f} s")
        print(line)
    if len(rate) == 2:
        print(f"async / sync episodes per second: {rate['async'] / rate['sync']:.2f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

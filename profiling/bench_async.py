"""Asynchronous generation against synchronous, on this machine: one preset's iterations, runs
alternated so both see the same machine state.

    python -m freshper.profiling.bench_async [--preset smollm2-135m-math] [--iterations 4]
        [--rounds 3] [--threads 2] [--max-lag 2] [--keep DIR]

The synchronous runs use all `--threads` for the trainer; the asynchronous ones split them, half
to the trainer (train.threads) and half to the generation worker (rollout.worker_threads). Each
run is `freshper train` with validation off in a fresh folder; iteration 0 is left out (the
worker's start, first calls). An iteration's seconds are the trainer's phases summed
(trainer/train/metrics.py compute_seconds): for an asynchronous run its rollout phase is the time
it waited for the worker. Prints, per mode, the median iteration seconds and episodes per second
over all rounds, the speed-up, and for the asynchronous runs the mean batch age and the trainer's
and the worker's idle seconds per iteration. `--keep DIR` copies each run's metrics.jsonl there.
"""
import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from freshper.profiling.bench_iteration_at import run
from freshper.trainer.train.metrics import compute_seconds


def summary(rows: list[dict]) -> dict:
    body = rows[1:]
    secs = [compute_seconds(r) for r in body]
    return {"seconds": secs, "episodes": [r["episodes"] - p["episodes"] for p, r in zip(rows, body)],
            "age": [r.get("batch_age", 0) for r in body], "wait": [r.get("trainer_wait_s", 0.0) for r in body],
            "idle": [r.get("worker_idle_s", 0.0) for r in body]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--preset", default="smollm2-135m-math")
    ap.add_argument("--iterations", type=int, default=4, help="per run; iteration 0 is left out")
    ap.add_argument("--rounds", type=int, default=3, help="synchronous then asynchronous, this many times")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in all (async: half each)")
    ap.add_argument("--max-lag", type=int, default=2, help="rollout.max_lag of the asynchronous runs")
    ap.add_argument("--args", default="", help="more train options for both, as one string")
    ap.add_argument("--keep", type=Path, default=None, help="copy each run's metrics.jsonl to this folder")
    a = ap.parse_args(argv)
    if a.threads < 2:
        ap.error("--threads must be >= 2: the asynchronous runs give half to each process")
    extra = a.args.split()
    modes = {"sync": (a.threads, []),
             "async": (a.threads // 2, ["--rollout.asynchronous", "true", "--rollout.worker_threads",
                                        str(a.threads - a.threads // 2), "--rollout.max_lag", str(a.max_lag)])}
    got = {m: {"seconds": [], "episodes": [], "age": [], "wait": [], "idle": []} for m in modes}
    for i in range(a.rounds):
        for m, (threads, more) in modes.items():
            with tempfile.TemporaryDirectory() as d:
                rows = run(sys.executable, a.preset, a.iterations, threads, Path(d), [*more, *extra])
                if a.keep:
                    a.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(Path(d) / "run" / "metrics.jsonl", a.keep / f"{m}{i}.jsonl")
            for k, v in summary(rows).items():
                got[m][k] += v
            print(f"round {i} {m}: iteration {statistics.median(summary(rows)['seconds']):.2f} s", flush=True)
    print(f"\n{a.preset}, {a.iterations - 1} iterations x {a.rounds} rounds per mode, {a.threads} threads in all")
    rate = {}
    for m, g in got.items():
        med = statistics.median(g["seconds"])
        rate[m] = statistics.median(e / s for e, s in zip(g["episodes"], g["seconds"]))
        line = f"{m:5s}  iteration {med:6.2f} s  episodes/s {rate[m]:6.2f}"
        if m == "async":
            line += (f"  batch age {statistics.mean(g['age']):.2f}  trainer waits {statistics.mean(g['wait']):.2f} s"
                     f"  worker idle {statistics.mean(g['idle']):.2f} s")
        print(line)
    print(f"async / sync episodes per second: {rate['async'] / rate['sync']:.2f}x")


if __name__ == "__main__":
    main()

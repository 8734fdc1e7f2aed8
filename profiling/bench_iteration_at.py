"""One training iteration, phase by phase, of the freshper installed in each of two Python
environments (e.g. the venv of a `git worktree` of an older commit, and the current one), in
processes run alternately on one machine, so both see the same machine state.

    python -m freshper.profiling.bench_iteration_at PYTHON_A PYTHON_B [--preset smollm2-135m-math]
        [--iterations 4] [--rounds 2] [--threads 2] [--args-a "..."] [--args-b "..."] [--keep DIR]

PYTHON_A and PYTHON_B may be the same, with --args-b giving B other options (e.g.
"--rollout.engine vllm"), to time one option against another.

Each run is `PYTHON -m freshper.trainer.cli train --preset P` with validation off, in a fresh
folder. Iteration 0 is left out (first calls, warm caches). Prints the median seconds of each
phase over the remaining iterations of all rounds, the iteration's total (the sum of the
phases), the ratio A/B, and the largest difference of the runs' numbers (loss, rewards, grad
norm), which is zero when a change only removed redundant work. `--keep DIR` copies each run's
metrics.jsonl to DIR/A0.jsonl, DIR/B0.jsonl, ... (the raw data behind a BENCHMARKS.md row).
"""
import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from freshper.trainer.train.metrics import compute_seconds

SAME = ("loss", "reward", "success", "grad_norm", "replay_loss", "gen_tokens")


def run(python: str, preset: str, iterations: int, threads: int, folder: Path, extra: list[str]) -> list[dict]:
    """The metrics rows of one run (one dict per iteration)."""
    cmd = [python, "-m", "freshper.trainer.cli", "train", "--preset", preset,
           "--train.iterations", str(iterations), "--eval.every", "0", "--train.threads", str(threads),
           "--train.progress", "false", "--train.run_dir", str(folder), "--train.name", "run", *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]


def phases(rows: list[dict]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in rows[1:]:
        for k, v in r.items():
            if k.startswith("time_") and k != "time_eval":
                out.setdefault(k[5:], []).append(v)
        out.setdefault("iteration", []).append(compute_seconds(r))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("python_a", help="the Python of environment A (its freshper is the one benchmarked)")
    ap.add_argument("python_b", help="the Python of environment B")
    ap.add_argument("--preset", default="smollm2-135m-math")
    ap.add_argument("--iterations", type=int, default=4, help="per run; iteration 0 is left out")
    ap.add_argument("--rounds", type=int, default=2, help="A then B, this many times")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per run")
    ap.add_argument("--args-a", default="", help="more train options for A's runs, as one string")
    ap.add_argument("--args-b", default="", help="more train options for B's runs, as one string")
    ap.add_argument("--keep", type=Path, default=None,
                    help="copy each run's metrics.jsonl here as A0.jsonl, B0.jsonl, ...")
    a = ap.parse_args(argv)
    if a.iterations < 2 or a.rounds < 1:
        ap.error("--iterations must be >= 2 and --rounds >= 1")
    times = {"A": {}, "B": {}}
    rows = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            for name, py, extra in (("A", a.python_a, a.args_a), ("B", a.python_b, a.args_b)):
                folder = Path(tmp) / f"{name}{i}"
                r = run(py, a.preset, a.iterations, a.threads, folder, shlex.split(extra))
                if a.keep is not None:
                    a.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(folder / "run" / "metrics.jsonl", a.keep / f"{name}{i}.jsonl")
                rows[name].append(r)
                p = phases(r)
                for k, v in p.items():
                    times[name].setdefault(k, []).extend(v)
                print(f"round {i} {name}: {statistics.median(p['iteration']):.2f} s an iteration", flush=True)
    print(f"\n{a.preset}, {a.threads} threads, medians over iterations 1-{a.iterations - 1} of {a.rounds} runs each")
    print(f"{'phase':<20}{'A (s)':>10}{'B (s)':>10}{'A/B':>8}")
    for k in sorted(set(times["A"]) | set(times["B"]), key=lambda k: (k == "iteration", k)):
        ma = statistics.median(times["A"][k]) if k in times["A"] else 0.0
        mb = statistics.median(times["B"][k]) if k in times["B"] else 0.0
        ratio = f"{ma / mb:8.2f}" if mb > 0.005 else f"{'-':>8}"
        print(f"{k:<20}{ma:10.3f}{mb:10.3f}{ratio}")
    diff = max((abs(ra.get(k, 0.0) - rb.get(k, 0.0)) for run_a, run_b in zip(rows["A"], rows["B"])
                for ra, rb in zip(run_a, run_b) for k in SAME), default=0.0)
    print(f"largest difference in {', '.join(SAME)} between A's and B's runs: {diff:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`freshper compare`: arms x seeds at one environment-step budget, then a table and a plot.

    freshper compare --preset frozenlake --arms on-policy,per,freshper --seeds 3 [--budget ENV_STEPS]
    freshper compare --preset frozenlake --arms freshper --tau-sweep 100,250,500,1000,2000

Every run is `freshper train` in its own process (at most --parallel at once, one torch thread
each), in runs/compare-NAME/ARM-sSEED/. Seeds fix the model init and the environments: seed s
gives every arm the same initial states at the same iteration. A run stops at the budget; a
re-run of the same command skips finished runs and resumes interrupted ones from their latest
checkpoint. The tables and plots are trainer/compare_report.py's. Runs use a
constant learning rate after warm-up: a run that stops at an env-step budget has no known
horizon for a cosine schedule.
`--report-only` redraws the table and plots from the runs' metrics.jsonl without running.
"""
from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .compare_report import report

ARMS = {
    "on-policy": {"algo.mode": "on-policy"},
    "per": {"algo.mode": "per"},
    "freshper": {"algo.mode": "freshper"},
    "freshper-auto": {"algo.mode": "freshper", "algo.tau_auto": "true"},
    "uniform": {"algo.mode": "uniform"},
    # FreshPER variants: whole-group replay, stored advantages, and the insertion rule of
    # before 2026-12-01 (new trajectories at the maximum until replayed: "PER plus decay")
    "freshper-group": {"algo.mode": "freshper", "algo.replay_unit": "group"},
    "freshper-stored": {"algo.mode": "freshper", "algo.replay_advantage": "stored"},
    "freshper-max": {"algo.mode": "freshper", "algo.insert_priority": "max"},
}
ENV_PRESETS = {"frozenlake": ("frozenlake", 12_000), "sokoban-simple": ("sokoban-simple", 20_000),
               "sokoban-hard": ("sokoban-hard", 30_000), "math-cpu": ("math-cpu", 12_800),
               "frozenlake-vlm-cpu": ("frozenlake-vlm-cpu", 12_000), "geoqa-cpu": ("geoqa-cpu", 12_800),
               "search-cpu": ("search-cpu", 20_000), "sokoban-vlm-cpu": ("sokoban-vlm-cpu", 20_000),
               "smollm2-135m-math": ("smollm2-135m-math", 800)}


def _run_one(cmd: list[str], log_path: Path) -> int:
    with open(log_path, "a") as log:
        log.write(f"\n$ {shlex.join(cmd)}\n")
        log.flush()
        return subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)


def plan(out: Path, env: str, arms: list[str], seeds: int, budget: int, extra: list[str],
         taus: list[float] | None) -> list[dict]:
    """The runs of a comparison, seed by seed (every arm of seed 0, then of seed 1, ...), so one cut
    short holds whole seeds; finished runs are skipped, checkpointed ones resumed."""
    preset = ENV_PRESETS[env][0]
    jobs = []
    variants = [(a, None) for a in arms] if not taus else [(arms[0], t) for t in taus]
    for s in range(seeds):
        for arm, tau in variants:
            label = arm if tau is None else f"{arm}-tau{tau:g}"
            run = out / f"{label}-s{s}"
            over = {**ARMS[arm], "train.seed": s, "train.env_step_budget": budget, "train.iterations": 100_000,
                    "algo.lr_schedule": "constant",
                    "train.checkpoint_every": 10, "train.progress": "false", "train.threads": 1,
                    "train.run_dir": str(out), "train.name": run.name}
            if tau is not None:
                over["algo.tau"] = tau
            args = [x for k, v in over.items() for x in (f"--{k}", str(v))]
            if (run / "DONE").exists():
                cmd = None
            elif (run / "checkpoints" / "latest").exists():
                cmd = [sys.executable, "-m", "freshper.trainer.cli", "train", "--resume", str(run), *extra]
            else:
                cmd = [sys.executable, "-m", "freshper.trainer.cli", "train", "--preset", preset, *args, *extra]
            jobs.append({"label": label, "seed": s, "run": run, "cmd": cmd, "tau": tau})
    return jobs


def main(argv) -> int:
    p = argparse.ArgumentParser(prog="freshper compare", description=__doc__.split("\n\n")[0],
                                epilog="Other --section.field VALUE arguments are passed to every run.")
    p.add_argument("--preset", "--env", dest="env", default="frozenlake",
                   help=f"the task, a preset with a comparison budget: one of {list(ENV_PRESETS)} (--env is the "
                        "old spelling)")
    p.add_argument("--keep-weights", action="store_true",
                   help="keep each finished run's checkpoints/ and final/ (by default removed once the run is DONE: "
                        "a pretrained model's checkpoint is over 1 GB, the comparison needs the metrics)")
    p.add_argument("--arms", default="on-policy,per,freshper", help=f"comma-separated, from {list(ARMS)}")
    p.add_argument("--seeds", type=int, default=3, help="seeds per arm (0..N-1)")
    p.add_argument("--budget", type=int, default=0, help="env steps per run (default: the env's)")
    p.add_argument("--parallel", type=int, default=2, help="runs at once (one torch thread each)")
    p.add_argument("--name", default="", help="runs/compare-NAME (default: the env, or the env and 'tau-sweep')")
    p.add_argument("--run-dir", default="runs", help="parent folder")
    p.add_argument("--tau-sweep", default="", help="comma-separated taus for the single arm in --arms")
    p.add_argument("--report-only", action="store_true", help="redraw the table and plots from existing runs")
    args, extra = p.parse_known_args(argv)
    if args.env not in ENV_PRESETS:
        p.error(f"--preset must be one of {list(ENV_PRESETS)}, got {args.env!r}")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        p.error(f"unknown arms {bad}; arms: {list(ARMS)}")
    taus = None
    if args.tau_sweep:
        try:
            taus = [float(t) for t in args.tau_sweep.split(",")]
        except ValueError:
            p.error(f"--tau-sweep must be comma-separated numbers, got {args.tau_sweep!r}")
        if len(arms) != 1 or ARMS[arms[0]].get("algo.mode") not in ("freshper",) or any(t <= 0 for t in taus):
            p.error("--tau-sweep needs exactly one freshper arm and taus > 0")
    if args.seeds < 1 or args.parallel < 1:
        p.error("--seeds and --parallel must be >= 1")
    from . import config as C
    from .flags import parse_overrides

    try:  # fail on a bad pass-through override now, not in every child
        C.load(ENV_PRESETS[args.env][0], None, parse_overrides(extra))
    except ValueError as e:
        p.error(str(e))
    budget = args.budget or ENV_PRESETS[args.env][1]
    name = args.name or (args.env + ("-tau-sweep" if taus else ""))
    out = Path(args.run_dir) / f"compare-{name}"
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["freshper", "compare", *argv])
    if args.report_only and (out / "command.txt").exists():  # keep the command that made the runs
        command = (out / "command.txt").read_text().strip()
    jobs = plan(out, args.env, arms, args.seeds, budget, extra, taus)
    todo = [] if args.report_only else [j for j in jobs if j["cmd"]]
    if args.report_only and not all((j["run"] / "metrics.jsonl").exists() for j in jobs):
        p.error(f"--report-only: some runs in {out} have no metrics.jsonl yet")
    print(f"{len(jobs)} runs in {out}: {len(jobs) - len(todo)} done, {len(todo)} to run, {args.parallel} at a time",
          flush=True)
    t0 = time.time()

    def work(j):
        if "--resume" not in j["cmd"] and j["run"].exists():
            shutil.rmtree(j["run"])  # died before its first checkpoint: start it again from scratch
        started = time.time()
        rc = _run_one(j["cmd"], out / f"{j['run'].name}.log")
        if rc == 0:  # DONE holds this process's wall time (a resumed run's last part only)
            (j["run"] / "DONE").write_text(f"{time.time() - started:.0f} s\n")
            if not args.keep_weights:
                for sub in ("checkpoints", "final"):
                    shutil.rmtree(j["run"] / sub, ignore_errors=True)
        status = "done" if rc == 0 else f"failed (exit {rc}), see {out / (j['run'].name + '.log')}"
        print(f"  {j['run'].name}: {status} after {time.time() - t0:.0f} s", flush=True)
        return rc

    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        codes = list(pool.map(work, todo))
    if any(codes):
        print("some runs failed; fix the cause and re-run the same command to resume", file=sys.stderr)
        return 1
    table = report(out, jobs, budget, command, sweep=bool(taus))
    print(table)
    print(f"\n{out}/table.md, {out}/curves.png, {out}/results.json, {out}/command.txt")
    return 0

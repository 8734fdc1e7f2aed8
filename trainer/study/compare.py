"""`freshper compare`: arms x seeds at one environment-step budget, then a table and a plot.

    freshper compare --preset frozenlake --arms on-policy-matched,per,freshper --seeds 3 [--budget ENV_STEPS]
    freshper compare --preset frozenlake --arms freshper --tau-sweep 100,250,500,1000,2000

Every run is `freshper train` in its own process (at most --parallel at once, one torch thread
each unless --train.threads says otherwise), in runs/compare-NAME/ARM-sSEED/. The first arm is the
control the paired tables compare with: on-policy-matched (on-policy with 1 + K passes over each
fresh batch, as many updates as a replay arm) is the control a replay study needs. Seeds fix
the model init and the environments: seed s gives every arm the same initial states at the same
iteration. A run stops at the budget; a re-run of the same command skips finished runs and
resumes interrupted ones from their latest checkpoint. The tables and plots are
trainer/study/report.py's. Runs use a constant learning rate after warm-up: a run that stops
at an env-step budget has no known horizon for a cosine schedule.
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

from .report import report

MATCHED = "1+K"  # an arm's algo.onpolicy_passes: one more than the replay arms' K (algo.replay_updates)
ARMS = {
    "on-policy": {"algo.mode": "on-policy"},
    # the update-matched control: as many optimizer steps per iteration as a replay arm, all of
    # them on the fresh batch (fresh data used 1 + K times instead of replay)
    "on-policy-matched": {"algo.mode": "on-policy", "algo.onpolicy_passes": MATCHED},
    # hard staleness gates: replay only trajectories at most --max-age iterations old
    "uniform-gate": {"algo.mode": "uniform", "algo.max_age": "MAX_AGE"},
    "per-gate": {"algo.mode": "per", "algo.max_age": "MAX_AGE"},
    "per": {"algo.mode": "per"},
    "freshper": {"algo.mode": "freshper"},
    "freshper-auto": {"algo.mode": "freshper", "algo.tau_auto": "true"},
    "uniform": {"algo.mode": "uniform"},
    # FreshPER variants: whole-group replay, stored advantages, and new trajectories at the maximum
    # until replayed ("PER plus decay", where the authors' FreshPER arm drops the boost each step)
    "freshper-group": {"algo.mode": "freshper", "algo.replay_unit": "group"},
    "freshper-stored": {"algo.mode": "freshper", "algo.replay_advantage": "stored"},
    "freshper-max": {"algo.mode": "freshper", "algo.insert_priority": "max"},
    # staleness (docs/asynchronous.md): the user's algo.mode, batches generated with the lags drawn
    # from --lag-probs (lockstep: reproducible by seed) and trained as algo.staleness says
    "synchronous": {},
    "stale-none": {"rollout.lag_probs": "LAG_PROBS", "algo.staleness": "none"},
    "stale-gate": {"rollout.lag_probs": "LAG_PROBS", "algo.staleness": "gate", "algo.stale_max_age": "MAX_AGE"},
    "stale-is": {"rollout.lag_probs": "LAG_PROBS", "algo.staleness": "is"},
    "stale-decay": {"rollout.lag_probs": "LAG_PROBS", "algo.staleness": "decay"},
    "stale-ess": {"rollout.lag_probs": "LAG_PROBS", "algo.staleness": "ess"},
}
# The env-step budget of a comparison on the CPU presets, where the preset's own iterations are
# not the comparison's; any other preset (the GPU presets, the paper's settings) defaults to its
# own train.iterations x rollout.episodes.
BUDGETS = {"frozenlake": 12_000, "sokoban-simple": 20_000, "sokoban-hard": 30_000, "math-cpu": 12_800,
           "frozenlake-vlm-cpu": 12_000, "geoqa-cpu": 12_800, "search-cpu": 20_000, "sokoban-vlm-cpu": 20_000,
           "smollm2-135m-math": 800, "smollm2-135m-multiply": 480,
           "smollm2-135m-frozenlake": 560}


def default_budget(preset: str) -> int:
    """The env steps a comparison on `preset` spends per run unless --budget says otherwise."""
    from .. import config as C

    if preset in BUDGETS:
        return BUDGETS[preset]
    cfg = C.apply(C.Config(), C.PRESETS[preset])  # the preset's values (its data files may be missing here)
    return cfg.train.iterations * cfg.rollout.episodes


def _run_one(cmd: list[str], log_path: Path) -> int:
    with open(log_path, "a") as log:
        log.write(f"\n$ {shlex.join(cmd)}\n")
        log.flush()
        return subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)


# What every run gets unless the user's flags say otherwise (theirs win), and the keys compare
# itself owns (set by its own flags: given as --section.field they are refused up front).
RUN_DEFAULTS = {"algo.lr_schedule": "constant", "train.checkpoint_every": 10, "train.progress": False,
                "train.threads": 1}
OWNED = {"train.seed": "--seeds and --first-seed", "train.env_step_budget": "--budget", "train.iterations": "--budget",
         "train.run_dir": "--run-dir", "train.name": "--name"}


def check_overrides(arms: list[str], given: dict, taus) -> None:
    """ValueError in one line for a pass-through flag compare sets itself, or one that an arm
    defines (it would make that arm another arm)."""
    for key in given:
        if key in OWNED:
            raise ValueError(f"--{key} is set by freshper compare for each run; use {OWNED[key]}")
        if key == "algo.tau" and taus:
            raise ValueError("--algo.tau is set by --tau-sweep for each run")
        if key in ("algo.max_age", "algo.stale_max_age") and any(ARMS[a].get(key) == "MAX_AGE" for a in arms):
            raise ValueError(f"--{key} defines the gate arms; use --max-age")
        if key == "rollout.lag_probs" and any(ARMS[a].get(key) == "LAG_PROBS" for a in arms):
            raise ValueError("--rollout.lag_probs defines the stale arms; use --lag-probs")
        defined = [a for a in arms if key in ARMS[a]]
        if defined:
            raise ValueError(f"--{key} defines arm {defined[0]!r} ({key}={ARMS[defined[0]][key]!r}); "
                             f"choose arms instead of overriding it")


def arm_settings(arm: str, cfg, max_age: int, lag_probs: str = "") -> dict:
    """The arm's overrides with its placeholders resolved against the run's config `cfg`."""
    out = dict(ARMS[arm])
    if out.get("rollout.lag_probs") == "LAG_PROBS":
        if not lag_probs:
            raise ValueError(f"arm {arm!r} draws its batches' lags: give --lag-probs (e.g. 0.4,0.3,0.2,0.1)")
        out["rollout.lag_probs"] = lag_probs
    if out.get("algo.onpolicy_passes") == MATCHED:
        out["algo.onpolicy_passes"] = 1 + cfg.algo.replay_updates
    for key in ("algo.max_age", "algo.stale_max_age"):  # the replay gate's, the staleness gate's
        if out.get(key) == "MAX_AGE":
            out[key] = max_age
    return out


def plan(out: Path, env: str, arms: list[str], seeds: int, budget: int, given: dict,
         taus: list[float] | None, max_age: int = 4, first_seed: int = 0, lag_probs: str = "") -> list[dict]:
    """The runs of a comparison, seed by seed (every arm of seed 0, then of seed 1, ...), so one cut
    short holds whole seeds; finished runs are skipped, checkpointed ones resumed. `given`: the
    user's pass-through overrides, {'section.field': value}, applied to every run."""
    from .. import config as C

    preset = env
    cfg = C.load(preset, None, given)
    jobs = []
    variants = [(a, None) for a in arms] if not taus else [(arms[0], t) for t in taus]
    for s in range(first_seed, first_seed + seeds):
        for arm, tau in variants:
            label = arm if tau is None else f"{arm}-tau{tau:g}"
            run = out / f"{label}-s{s}"
            over = {**RUN_DEFAULTS, **given, **arm_settings(arm, cfg, max_age, lag_probs), "train.seed": s,
                    "train.env_step_budget": budget, "train.iterations": 100_000,
                    "train.run_dir": str(out), "train.name": run.name}
            if tau is not None:
                over["algo.tau"] = tau
            # --key=value: a value such as -1e-3 is not taken for a flag
            args = [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in over.items()]
            if (run / "DONE").exists():
                cmd = None
            elif (run / "checkpoints" / "latest").exists():
                cmd = [sys.executable, "-m", "freshper.trainer.cli", "train", "--resume", str(run)]
            else:
                cmd = [sys.executable, "-m", "freshper.trainer.cli", "train", "--preset", preset, *args]
            jobs.append({"label": label, "seed": s, "run": run, "cmd": cmd, "tau": tau})
    return jobs


def parser() -> argparse.ArgumentParser:
    """compare's own arguments; the rest are config flags passed to every run."""
    p = argparse.ArgumentParser(prog="freshper compare", description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                epilog="Other --section.field VALUE arguments are passed to every run.")
    p.add_argument("--preset", "--env", dest="env", default="frozenlake",
                   help="the task: any preset of freshper train (--env is the old spelling); the budget defaults to "
                        f"{BUDGETS} on those, else the preset's train.iterations x rollout.episodes")
    p.add_argument("--keep-weights", action="store_true",
                   help="keep each finished run's checkpoints/ and final/ (by default removed once the run is DONE: "
                        "a pretrained model's checkpoint is over 1 GB, the comparison needs the metrics)")
    p.add_argument("--arms", default="on-policy,per,freshper", help=f"comma-separated, from {list(ARMS)}")
    p.add_argument("--seeds", type=int, default=3, help="seeds per arm (FIRST..FIRST+N-1)")
    p.add_argument("--first-seed", type=int, default=0,
                   help="the first seed (a pilot on seeds a study does not use; more seeds for a study later)")
    p.add_argument("--budget", type=int, default=0, help="env steps per run (default: the env's)")
    p.add_argument("--parallel", type=int, default=2, help="runs at once (one torch thread each)")
    p.add_argument("--name", default="", help="runs/compare-NAME (default: the env, or the env and 'tau-sweep')")
    p.add_argument("--run-dir", default="runs", help="parent folder")
    p.add_argument("--tau-sweep", default="", help="comma-separated taus for the single arm in --arms")
    p.add_argument("--report-only", action="store_true", help="redraw the table and plots from existing runs")
    p.add_argument("--max-age", type=int, default=4,
                   help="the gate arms' age limit in iterations (algo.max_age of uniform-gate and per-gate, "
                        "algo.stale_max_age of stale-gate; 4 is TRL's async GRPO max_staleness)")
    p.add_argument("--lag-probs", default="",
                   help="the stale arms' lag distribution, P(lag=0),...,P(lag=K), or a run folder whose staleness "
                        "they replay (its batch ages' shares; rollout.lag_probs: lockstep)")
    return p


def parse(argv: list[str]):
    """(parser, args, arms, taus, given) of a compare command line; every check that can fail is made here,
    before a folder is made or a run starts (an error exits through argparse, one line)."""
    p = parser()
    args, extra = p.parse_known_args(argv)
    from .. import config as C

    if args.env not in C.PRESETS:
        p.error(f"--preset must be one of {list(C.PRESETS)}, got {args.env!r}")
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
    if args.seeds < 1 or args.parallel < 1 or args.max_age < 1:
        p.error("--seeds, --parallel and --max-age must be >= 1")
    if args.first_seed < 0:
        p.error("--first-seed must be >= 0")
    stale = [a for a in arms if ARMS[a].get("rollout.lag_probs") == "LAG_PROBS"]
    try:
        args.lag_probs = C.resolve_lag_probs(args.lag_probs)  # a run folder: its probabilities, given to each run
        if stale and not C.parse_lag_probs(args.lag_probs):
            p.error(f"arms {stale} draw their batches' lags: give --lag-probs (e.g. 0.4,0.3,0.2,0.1)")
    except ValueError as e:
        p.error(str(e).replace("rollout.lag_probs", "--lag-probs"))
    from ..flags import parse_overrides

    try:  # fail on a bad or conflicting pass-through override now, not in every child
        given = {C.resolve_key(k): v for k, v in parse_overrides(extra).items()}
        check_overrides(arms, given, taus)
        C.load(args.env, None, given)
    except ValueError as e:
        p.error(str(e))
    return p, args, arms, taus, given


def main(argv) -> int:
    p, args, arms, taus, given = parse(argv)
    budget = args.budget or default_budget(args.env)
    name = args.name or (args.env + ("-tau-sweep" if taus else ""))
    out = Path(args.run_dir) / f"compare-{name}"
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["freshper", "compare", *argv])
    if args.report_only and (out / "command.txt").exists():  # keep the command that made the runs
        command = (out / "command.txt").read_text().strip()
    jobs = plan(out, args.env, arms, args.seeds, budget, given, taus, args.max_age, args.first_seed, args.lag_probs)
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
        print(f"  {j['run'].name}: {status} after {time.time() - started:.0f} s ({time.time() - t0:.0f} s since "
              "compare began)", flush=True)
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

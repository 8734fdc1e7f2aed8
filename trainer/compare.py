"""`freshper compare`: arms x seeds at one environment-step budget, then a table and a plot.

    freshper compare --env frozenlake --arms on-policy,per,freshper --seeds 3 [--budget ENV_STEPS]
    freshper compare --env frozenlake --arms freshper --tau-sweep 100,250,500,1000,2000

Every run is `freshper train` in its own process (at most --parallel at once, one torch thread
each), in runs/compare-NAME/ARM-sSEED/. Seeds fix the model init and the environments: seed s
gives every arm the same initial states at the same iteration. A run stops at the budget; a
re-run of the same command skips finished runs and resumes interrupted ones from their latest
checkpoint. Summary per arm: final success (mean over the last 10% of the budget) and the area
under the success-vs-env-steps curve divided by the budget (the mean success over training),
each as mean and 95% t-interval across seeds.
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .metrics import read

ARMS = {
    "on-policy": {"algo.mode": "on-policy"},
    "per": {"algo.mode": "per"},
    "freshper": {"algo.mode": "freshper"},
    "freshper-auto": {"algo.mode": "freshper", "algo.tau_auto": "true"},
    "uniform": {"algo.mode": "uniform"},
}
ENV_PRESETS = {"frozenlake": ("frozenlake", 12_000), "sokoban-simple": ("sokoban-simple", 20_000)}
# two-sided 95% Student t quantiles by degrees of freedom (a fact table; df > 30 uses 1.96)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t975(df: int) -> float:
    keys = [k for k in sorted(T975) if k <= df]
    return T975[keys[-1]] if keys and df <= 30 else 1.96


def mean_ci(xs: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval); half-width nan for one value."""
    x = np.asarray(xs, dtype=float)
    if x.size < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), float(t975(x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))


def curve(rows: list[dict], grid: np.ndarray) -> np.ndarray:
    """Success rate interpolated onto env-step `grid` (each iteration's success placed at the
    env-step count reached by its end)."""
    x = np.array([r["env_steps"] for r in rows], dtype=float)
    y = np.array([r["success"] for r in rows], dtype=float)
    return np.interp(grid, x, y)


def summarize(rows: list[dict], budget: int) -> dict:
    grid = np.linspace(0, budget, 201)
    c = curve(rows, grid)
    final = float(c[grid >= 0.9 * budget].mean())
    auc = float(np.trapezoid(c, grid) / budget) if hasattr(np, "trapezoid") else float(np.trapz(c, grid) / budget)
    return {"final_success": final, "auc": auc, "env_steps": rows[-1]["env_steps"], "iterations": len(rows),
            "final_reward": float(np.mean([r["reward"] for r in rows[-max(1, len(rows) // 10):]]))}


def _run_one(cmd: list[str], log_path: Path) -> int:
    with open(log_path, "a") as log:
        log.write(f"\n$ {shlex.join(cmd)}\n")
        log.flush()
        return subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)


def plan(out: Path, env: str, arms: list[str], seeds: int, budget: int, extra: list[str],
         taus: list[float] | None) -> list[dict]:
    preset = ENV_PRESETS[env][0]
    jobs = []
    variants = [(a, None) for a in arms] if not taus else [(arms[0], t) for t in taus]
    for arm, tau in variants:
        label = arm if tau is None else f"{arm}-tau{tau:g}"
        for s in range(seeds):
            run = out / f"{label}-s{s}"
            over = {**ARMS[arm], "train.seed": s, "train.env_step_budget": budget, "train.iterations": 100_000,
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


def report(out: Path, jobs: list[dict], budget: int, command: str, sweep: bool) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_label: dict[str, list] = {}
    for j in jobs:
        rows = read(j["run"])
        by_label.setdefault(j["label"], []).append((j, rows, summarize(rows, budget)))
    lines = [f"budget: {budget} env steps per run; final = mean success over the last 10% of the budget; "
             f"AUC = mean success over the budget; mean ± 95% t-interval over seeds", "",
             "| arm | seeds | final success | AUC (success) | final reward | iterations |", "|---|---|---|---|---|---|"]
    summary = {}
    for label, items in by_label.items():
        fin = mean_ci([s["final_success"] for _, _, s in items])
        auc = mean_ci([s["auc"] for _, _, s in items])
        rew = mean_ci([s["final_reward"] for _, _, s in items])
        its = np.mean([s["iterations"] for _, _, s in items])
        summary[label] = {"final_success": fin, "auc": auc, "final_reward": rew,
                          "per_seed": [s for _, _, s in items]}
        lines.append(f"| {label} | {len(items)} | {fin[0]:.3f} ± {fin[1]:.3f} | {auc[0]:.3f} ± {auc[1]:.3f} | "
                     f"{rew[0]:.3f} ± {rew[1]:.3f} | {its:.0f} |")
    table = "\n".join(lines)
    grid = np.linspace(0, budget, 201)
    fig, axes = plt.subplots(1, 2 if sweep else 1, figsize=(11 if sweep else 6.5, 4))
    ax = axes[0] if sweep else axes
    for i, (label, items) in enumerate(by_label.items()):
        curves = np.stack([curve(rows, grid) for _, rows, _ in items])
        k = 9  # moving average over 9 grid points (4.5% of the budget)
        smooth = np.stack([np.convolve(np.pad(c, (k // 2, k // 2), mode="edge"), np.ones(k) / k, "valid")
                           for c in curves])
        m = smooth.mean(0)
        half = (t975(len(items) - 1) * smooth.std(0, ddof=1) / math.sqrt(len(items))) if len(items) > 1 else 0 * m
        ax.plot(grid, m, color=f"C{i}", label=label)
        # the band is the 95% interval of the mean, drawn within the feasible range [0, 1]
        ax.fill_between(grid, np.clip(m - half, 0, 1), np.clip(m + half, 0, 1), color=f"C{i}", alpha=0.2)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("success rate (mean, 95% band over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if sweep:
        taus = [items[0][0]["tau"] for items in by_label.values()]
        fins = [summary[label]["final_success"] for label in by_label]
        means = np.array([f[0] for f in fins])
        half = np.array([0.0 if math.isnan(f[1]) else f[1] for f in fins])
        lower, upper = means - np.clip(means - half, 0, 1), np.clip(means + half, 0, 1) - means
        axes[1].errorbar(taus, means, yerr=[lower, upper], marker="o", capsize=3)
        axes[1].set_xscale("log")
        axes[1].set_xticks(taus, [f"{t:g}" for t in taus])
        axes[1].minorticks_off()
        axes[1].set_xlabel("tau (iterations)")
        axes[1].set_ylabel("final success")
        axes[1].grid(alpha=0.3)
    fig.suptitle(out.name, fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    plt.close(fig)
    (out / "table.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    (out / "command.txt").write_text(command + "\n")
    return table


def main(argv) -> int:
    p = argparse.ArgumentParser(prog="freshper compare", description=__doc__.split("\n\n")[0],
                                epilog="Other --section.field VALUE arguments are passed to every run.")
    p.add_argument("--env", default="frozenlake", help=f"one of {list(ENV_PRESETS)}")
    p.add_argument("--arms", default="on-policy,per,freshper", help=f"comma-separated, from {list(ARMS)}")
    p.add_argument("--seeds", type=int, default=3, help="seeds per arm (0..N-1)")
    p.add_argument("--budget", type=int, default=0, help="env steps per run (default: the env's)")
    p.add_argument("--parallel", type=int, default=2, help="runs at once (one torch thread each)")
    p.add_argument("--name", default="", help="runs/compare-NAME (default: the env, or the env and 'tau-sweep')")
    p.add_argument("--run-dir", default="runs", help="parent folder")
    p.add_argument("--tau-sweep", default="", help="comma-separated taus for the single arm in --arms")
    args, extra = p.parse_known_args(argv)
    if args.env not in ENV_PRESETS:
        p.error(f"--env must be one of {list(ENV_PRESETS)}, got {args.env!r}")
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
    from .cli import _overrides

    try:  # fail on a bad pass-through override now, not in every child
        C.load(ENV_PRESETS[args.env][0], None, _overrides(extra))
    except ValueError as e:
        p.error(str(e))
    budget = args.budget or ENV_PRESETS[args.env][1]
    name = args.name or (args.env + ("-tau-sweep" if taus else ""))
    out = Path(args.run_dir) / f"compare-{name}"
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["freshper", "compare", *argv])
    jobs = plan(out, args.env, arms, args.seeds, budget, extra, taus)
    todo = [j for j in jobs if j["cmd"]]
    print(f"{len(jobs)} runs in {out}: {len(jobs) - len(todo)} done, {len(todo)} to run, {args.parallel} at a time",
          flush=True)
    t0 = time.time()

    def work(j):
        if "--resume" not in j["cmd"] and j["run"].exists():
            shutil.rmtree(j["run"])  # died before its first checkpoint: start it again from scratch
        rc = _run_one(j["cmd"], out / f"{j['run'].name}.log")
        if rc == 0:
            (j["run"] / "DONE").write_text(f"{time.time() - t0:.0f} s\n")
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

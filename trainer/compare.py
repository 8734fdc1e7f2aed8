"""`freshper compare`: arms x seeds at one environment-step budget, then a table and a plot.

    freshper compare --env frozenlake --arms on-policy,per,freshper --seeds 3 [--budget ENV_STEPS]
    freshper compare --env frozenlake --arms freshper --tau-sweep 100,250,500,1000,2000

Every run is `freshper train` in its own process (at most --parallel at once, one torch thread
each), in runs/compare-NAME/ARM-sSEED/. Seeds fix the model init and the environments: seed s
gives every arm the same initial states at the same iteration. A run stops at the budget; a
re-run of the same command skips finished runs and resumes interrupted ones from their latest
checkpoint. Summary per arm, each as mean and 95% t-interval across seeds: final training
success (mean over the last 10% of the budget) and its AUC (the area under the
success-vs-env-steps curve over the budget: the mean success over training); and, from the
validation rollouts (`eval.every`), the last eval success and eval score and their AUCs.
A second table gives the replay diagnostics of trainer/replay_stats.py (replayed ages, KL,
IS-weight ESS, clipped share, drift rate and exponent). Plots: training success, eval
success, KL(mu || pi) per token of replayed trajectories against their age, the age
distribution of replayed trajectories, and the ESS fraction over training. Runs use a
constant learning rate after warm-up: a run that stops at an env-step budget has no known
horizon for a cosine schedule.
`--report-only` redraws the table and plots from the runs' metrics.jsonl without running.
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
from .replay_stats import age_shares, kl_by_age, replay_summary

ARMS = {
    "on-policy": {"algo.mode": "on-policy"},
    "per": {"algo.mode": "per"},
    "freshper": {"algo.mode": "freshper"},
    "freshper-auto": {"algo.mode": "freshper", "algo.tau_auto": "true"},
    "uniform": {"algo.mode": "uniform"},
}
ENV_PRESETS = {"frozenlake": ("frozenlake", 12_000), "sokoban-simple": ("sokoban-simple", 20_000),
               "sokoban-hard": ("sokoban-hard", 30_000), "math-cpu": ("math-cpu", 12_800)}
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


def curve(rows: list[dict], grid: np.ndarray, key: str = "success") -> np.ndarray:
    """`key` interpolated onto env-step `grid` (each row's value placed at the env-step count
    reached by the end of its iteration); rows without `key` are skipped."""
    pts = [(r["env_steps"], r[key]) for r in rows if key in r]
    if not pts:
        return np.full(grid.shape, np.nan)
    x, y = np.array(pts, dtype=float).T
    return np.interp(grid, x, y)


def _auc(c: np.ndarray, grid: np.ndarray, budget: int) -> float:
    trap = np.trapezoid if hasattr(np, "trapezoid") else np.trapz
    return float(trap(c, grid) / budget)


def summarize(rows: list[dict], budget: int) -> dict:
    grid = np.linspace(0, budget, 201)
    c = curve(rows, grid)
    out = {"final_success": float(c[grid >= 0.9 * budget].mean()), "auc": _auc(c, grid, budget),
           "env_steps": rows[-1]["env_steps"], "iterations": len(rows),
           "final_reward": float(np.mean([r["reward"] for r in rows[-max(1, len(rows) // 10):]]))}
    evals = [r for r in rows if "eval_success" in r]
    for key in ("eval_success", "eval_score"):
        out[f"final_{key}"] = float(evals[-1][key]) if evals else float("nan")
        out[f"auc_{key}"] = _auc(curve(rows, grid, key), grid, budget) if evals else float("nan")
    return out


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


def _smooth(c: np.ndarray, k: int) -> np.ndarray:
    """Moving average over k grid points (9 of 201: 4.5% of the budget); edges padded."""
    return np.convolve(np.pad(c, (k // 2, k // 2), mode="edge"), np.ones(k) / k, "valid")


def report(out: Path, jobs: list[dict], budget: int, command: str, sweep: bool) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_label: dict[str, list] = {}
    for j in jobs:
        rows = read(j["run"])
        by_label.setdefault(j["label"], []).append((j, rows, summarize(rows, budget)))
    lines = [f"budget: {budget} env steps per run; final = mean training success over the last 10% of the budget; "
             f"AUC = mean over the budget; eval = validation rollouts (fixed held-out initial states); "
             f"mean ± 95% t-interval over seeds", "",
             "| arm | seeds | final success | AUC (success) | final eval success | AUC (eval success) | "
             "final eval score | AUC (eval score) | final reward | iterations |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    summary = {}
    for label, items in by_label.items():
        stats = {k: mean_ci([s[k] for _, _, s in items]) for k in
                 ("final_success", "auc", "final_eval_success", "auc_eval_success", "final_eval_score",
                  "auc_eval_score", "final_reward")}
        its = np.mean([s["iterations"] for _, _, s in items])
        summary[label] = {**stats, "per_seed": [s for _, _, s in items]}
        cells = " | ".join(f"{m:.3f} ± {h:.3f}" for m, h in stats.values())
        lines.append(f"| {label} | {len(items)} | {cells} | {its:.0f} |")
    lines += ["", "Replay diagnostics (replay arms), per run then mean ± 95% t-interval over seeds: mean age of "
              "replayed trajectories (iterations), mean per-token KL(mu || pi) of replayed trajectories, IS-weight "
              "ESS fraction, share of replayed tokens at a clip bound, drift rate r (KL per token per iteration of "
              "age, line through the origin), exponent p of KL ∝ age^p (1: linear), drift time 1/(2r).", "",
              "| arm | age replayed | KL/token replayed | IS ESS | clipped share | drift rate r | exponent p | "
              "drift time |", "|---|---|---|---|---|---|---|---|"]
    for label, items in by_label.items():
        reps = [replay_summary(rows) for _, rows, _ in items]
        reps = [r for r in reps if r]
        if not reps:
            continue
        diag = {k: mean_ci([r[k] for r in reps]) for k in reps[0]}
        summary[label]["replay"] = {**diag, "per_seed": reps}
        cells = " | ".join(f"{m:.3g} ± {h:.2g}" for m, h in diag.values())
        lines.append(f"| {label} | {cells} |")
    table = "\n".join(lines)
    grid = np.linspace(0, budget, 201)
    panels = ["success", "eval_success", "kl", "ages", "ess"] + (["tau"] if sweep else [])
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    ax = dict(zip(panels, axes.flat))
    for a in list(axes.flat)[len(panels):]:
        a.set_visible(False)
    for i, (label, items) in enumerate(by_label.items()):
        for key in ("success", "eval_success"):
            curves = np.stack([curve(rows, grid, key) for _, rows, _ in items])
            if np.isnan(curves).all():
                continue
            smooth = np.stack([_smooth(c, 9 if key == "success" else 1) for c in curves])
            m = np.nanmean(smooth, 0)
            half = (t975(len(items) - 1) * np.nanstd(smooth, 0, ddof=1) / math.sqrt(len(items))
                    if len(items) > 1 else 0 * m)
            ax[key].plot(grid, m, color=f"C{i}", label=label)
            # the band is the 95% interval of the mean, drawn within the feasible range [0, 1]
            ax[key].fill_between(grid, np.clip(m - half, 0, 1), np.clip(m + half, 0, 1), color=f"C{i}", alpha=0.2)
        kl = kl_by_age([r for _, rows, _ in items for r in rows])
        if kl:
            ages = [max(a, 0.5) for a in kl]  # age 0 drawn at 0.5 on the log axis
            ax["kl"].plot(ages, [v[0] for v in kl.values()], marker="o", color=f"C{i}", label=label)
            shares = age_shares(kl)
            ax["ages"].plot(ages, list(shares.values()), marker="o", color=f"C{i}", label=label)
            ess = np.nanmean(np.stack([_smooth(curve(rows, grid, "is_ess"), 9) for _, rows, _ in items]), 0)
            ax["ess"].plot(grid, ess, color=f"C{i}", label=label)
    for key, name in (("success", "training success"), ("eval_success", "eval success (validation states)")):
        ax[key].set_xlabel("environment steps")
        ax[key].set_ylabel(f"{name}, mean and 95% band")
        ax[key].grid(alpha=0.3)
        ax[key].legend(fontsize=8)
    ax["kl"].set_xscale("log")
    ax["kl"].set_xlabel("age of the replayed trajectory (iterations; 0 drawn at 0.5)")
    ax["kl"].set_ylabel("KL(mu || pi) per token, mean")
    ax["kl"].grid(alpha=0.3)
    ax["kl"].legend(fontsize=8)
    ax["ages"].set_xscale("log")
    ax["ages"].set_xlabel("age bin of replayed trajectories (lowest age; 0 drawn at 0.5)")
    ax["ages"].set_ylabel("share of replayed trajectories")
    ax["ages"].grid(alpha=0.3)
    ax["ess"].set_xlabel("environment steps")
    ax["ess"].set_ylabel("IS-weight ESS fraction, mean over seeds")
    ax["ess"].grid(alpha=0.3)
    if sweep:
        taus = [items[0][0]["tau"] for items in by_label.values()]
        fins = [summary[label]["final_success"] for label in by_label]
        means = np.array([f[0] for f in fins])
        half = np.array([0.0 if math.isnan(f[1]) else f[1] for f in fins])
        lower, upper = means - np.clip(means - half, 0, 1), np.clip(means + half, 0, 1) - means
        ax["tau"].errorbar(taus, means, yerr=[lower, upper], marker="o", capsize=3)
        ax["tau"].set_xscale("log")
        ax["tau"].set_xticks(taus, [f"{t:g}" for t in taus])
        ax["tau"].minorticks_off()
        ax["tau"].set_xlabel("tau (iterations)")
        ax["tau"].set_ylabel("final success")
        ax["tau"].grid(alpha=0.3)
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
    p.add_argument("--report-only", action="store_true", help="redraw the table and plots from existing runs")
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
    from .cli import parse_overrides

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

"""The report of `freshper compare`: per-run summaries, tables with 95% intervals, and plots.

Summary per arm, each as mean and 95% t-interval across seeds: final training success (mean
over the last 10% of the budget) and its AUC (the area under the success-vs-env-steps curve
over the budget: the mean success over training); from the validation rollouts, the last eval
success and eval score and their AUCs. A second table gives the replay diagnostics of
trainer/study/replay_stats.py. The plots, only those some run has data for, are
trainer/study/curves.py's.
A third table pairs each arm's seeds with the first arm's: seed s gives every arm the same
initial states, so the per-seed difference removes what the states contribute. A fourth holds
the readouts at equal optimizer updates and equal compute (trainer/study/readouts.py).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..train.intervals import mean_ci
from ..train.metrics import points, read
from .curves import curve, plot
from .readouts import matched_table
from .replay_stats import replay_summary, signal_by_window
from .staleness import staleness_table


def _cell(mean: float, half: float, digits: int | None = None) -> str:
    """"mean ± half-width", or the mean and "(n=1)" where no interval exists (one seed)."""
    m = f"{mean:.{digits}g}" if digits else f"{mean:.3f}"
    if math.isnan(half):
        return f"{m} (—)"
    return f"{m} ± {half:.{digits - 1}g}" if digits else f"{m} ± {half:.3f}"


def _auc(c: np.ndarray, grid: np.ndarray, budget: int) -> float:
    trap = np.trapezoid if hasattr(np, "trapezoid") else np.trapz
    return float(trap(c, grid) / budget)


def summarize(rows: list[dict], budget: int) -> dict:
    grid = np.linspace(0, budget, 201)
    c = curve(rows, grid)
    out = {"final_success": float(c[grid >= 0.9 * budget].mean()), "auc": _auc(c, grid, budget),
           "env_steps": rows[-1]["env_steps"], "iterations": len(rows),
           "final_reward": float(np.mean([r["reward"] for r in rows[-max(1, len(rows) // 10):]]))}
    for key in ("eval_success", "eval_score"):
        evals = points(rows, key)
        out[f"final_{key}"] = float(evals[-1][1]) if evals else float("nan")
        out[f"auc_{key}"] = _auc(curve(rows, grid, key), grid, budget) if evals else float("nan")
    return out


def tables(by_label: dict[str, list]) -> tuple[str, dict]:
    """The markdown tables and the results.json summary from {label: [(job, rows, summary), ...]}."""
    lines = ["final = mean training success over the last 10% of the budget; AUC = mean over the budget; "
             "eval = validation rollouts (fixed held-out initial states); mean ± 95% t-interval over seeds", "",
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
        cells = " | ".join(_cell(m, h) for m, h in stats.values())
        lines.append(f"| {label} | {len(items)} | {cells} | {its:.0f} |")
    lines += ["", "Replay diagnostics (replay arms), per run then mean ± 95% t-interval over seeds: mean age of "
              "replayed trajectories (iterations), mean per-token KL(mu || pi) of replayed trajectories (k3 "
              "estimator, or k1 where a run logged only that), IS-weight ESS fraction, share of replayed tokens at a "
              "clip bound, share of replayed episodes alone in their group in the batch (group advantage 0), share "
              "of replayed tokens with a non-zero advantage before whitening, drift rate r (KL per token per "
              "iteration of age, line through the origin), exponent p of KL ∝ age^p (1: linear), drift time "
              "1/(2r).", "",
              "| arm | age replayed | KL/token replayed | IS ESS | clipped share | singletons | adv ≠ 0 tokens | "
              "drift rate r | exponent p | drift time |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, items in by_label.items():
        reps = [r for r in (replay_summary(rows) for _, rows, _ in items) if r]
        if not reps:
            continue
        diag = {k: mean_ci([r[k] for r in reps]) for k in reps[0]}
        summary[label]["replay"] = {**diag, "per_seed": reps}
        cells = " | ".join(_cell(m, h, 3) for m, h in diag.values())
        lines.append(f"| {label} | {cells} |")
    return "\n".join(lines), summary


def signal_table(by_label: dict, width: int = 40) -> str:
    """What the replay batches could teach, by window of iterations: the share of replayed
    episodes alone in their group in the batch, and of replayed tokens with a non-zero advantage
    before whitening, mean over seeds; empty when no run logged them."""
    lines = []
    for label, items in by_label.items():
        runs = [signal_by_window(rows, width) for _, rows, _ in items]
        runs = [r for r in runs if r]
        if not runs:
            continue
        n = min(len(r) for r in runs)
        single = " / ".join(f"{np.mean([r[i][1] for r in runs]):.2f}" for i in range(n))
        nonzero = " / ".join(f"{np.mean([r[i][2] for r in runs]):.3f}" for i in range(n))
        lines.append(f"| {label} | {len(runs)} | {single} | {nonzero} |")
    if not lines:
        return ""
    return ("\n\nReplay signal by window of " + str(width) + " iterations (mean over seeds): singleton share "
            "| non-zero-advantage token share\n\n| arm | seeds | singletons | adv ≠ 0 tokens |\n|---|---|---|---|\n"
            + "\n".join(lines))


PAIRED = ("auc", "final_success", "auc_eval_success", "final_eval_success")


def paired(by_label: dict) -> dict:
    """{label: {key: (mean, half-width, wins, n)}} for every arm after the first: the difference to
    the first arm on the seeds both ran, its 95% t-interval, and on how many of them it is > 0."""
    if len(by_label) < 2:
        return {}
    (_, items), *rest = by_label.items()
    ref = {j["seed"]: s for j, _, s in items}
    out = {}
    for label, its in rest:
        both = [(s, ref[j["seed"]]) for j, _, s in its if j["seed"] in ref]
        if not both:
            continue
        out[label] = {}
        for k in PAIRED:
            d = [s[k] - r[k] for s, r in both]
            out[label][k] = (*mean_ci(d), sum(x > 0 for x in d), len(d))
    return out


def paired_table(base: str, diffs: dict) -> str:
    """Markdown for `paired`'s `diffs` against arm `base`; empty when there are none."""
    if not diffs:
        return ""
    lines = [f"\n\nPaired by seed, difference to {base} (mean ± 95% t-interval over the seeds both ran; "
             "in brackets, on how many seeds the arm is higher)\n",
             "| arm | seeds | AUC (success) | final success | AUC (eval success) | final eval success |",
             "|---|---|---|---|---|---|"]
    for label, d in diffs.items():
        n = d[PAIRED[0]][3]
        cells = " | ".join(f"{_cell(m, h)} [{w}/{n}]" for m, h, w, _ in d.values())
        lines.append(f"| {label} | {n} | {cells} |")
    return "\n".join(lines)


def with_updates(rows: list[dict], run: Path) -> list[dict]:
    """Rows with the cumulative optimizer steps ("updates"); runs from before the trainer logged it
    get it from their config.yaml: algo.onpolicy_passes (1 before it existed) plus K replay updates
    (0 on-policy) per iteration."""
    if not rows or all("updates" in r for r in rows):
        return rows
    import yaml

    algo = yaml.safe_load((Path(run) / "config.yaml").read_text())["algo"]
    per = algo.get("onpolicy_passes", 1) + (0 if algo["mode"] == "on-policy" else algo["replay_updates"])
    return [{**r, "updates": per * (i + 1)} for i, r in enumerate(rows)]


def report(out: Path, jobs: list[dict], budget: int, command: str, sweep: bool) -> str:
    """Write table.md, results.json, curves.png and command.txt into `out`; return the tables."""
    by_label: dict[str, list] = {}
    for j in jobs:
        rows = with_updates(read(j["run"]), j["run"])
        by_label.setdefault(j["label"], []).append((j, rows, summarize(rows, budget)))
    table, summary = tables(by_label)
    diffs = paired(by_label)
    for label, d in diffs.items():
        summary[label]["paired"] = {k: dict(zip(("mean", "ci95", "higher", "seeds"), v)) for k, v in d.items()}
    readouts, js = matched_table(by_label, budget)
    for label, v in js.items():
        summary[label]["matched"] = v
    table = (f"budget: {budget} env steps per run; " + table + paired_table(next(iter(by_label)), diffs)
             + readouts + signal_table(by_label) + staleness_table(by_label))
    plot(out / "curves.png", by_label, summary, budget, sweep)
    (out / "table.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    (out / "command.txt").write_text(command + "\n")
    return table

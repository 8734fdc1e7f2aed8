"""What a comparison's runs did with stale batches (docs/asynchronous.md): per arm, the mean age of
the batches that reached their on-policy update (those the gate then dropped included), the weight
the decay gave them, the learning-rate factor sqrt(ESS / N) that algo.staleness ess gave each
trained batch's first update, the share of generated
episodes the gate dropped, and for asynchronous runs the seconds each side waited; per run, the
shares of its trained batches by age and the decay's weight by age (the curves' panels)."""
from __future__ import annotations

import numpy as np


def staleness_row(rows: list[dict]) -> dict | None:
    """One run's staleness figures, or None for a run that logged none (before lockstep existed)."""
    rows = [r for r in rows if "batch_age" in r]
    if not rows:
        return None
    generated = sum(r.get("episodes_generated", 0) for r in rows)
    dropped = rows[-1].get("episodes_dropped_total", 0)  # this run's, up to and with its last iteration
    return {"age": float(np.mean([r["batch_age"] for r in rows])), "age_max": max(r["batch_age"] for r in rows),
            "weight": float(np.mean([r.get("batch_weight", 1.0) for r in rows])),
            # over the batches trained (a batch the gate dropped has no step to scale); the factor of
            # each one's first update, the one the loop logs
            "lr_scale": float(np.mean([r.get("batch_lr_scale", 1.0) for r in trained_batches(rows)] or [1.0])),
            "dropped": dropped / generated if generated else 0.0,
            "wait": float(np.mean([r.get("trainer_wait_s", 0.0) for r in rows])),
            "idle": float(np.mean([r.get("worker_idle_s", 0.0) for r in rows]))}


def staleness_table(by_label: dict) -> str:
    """Markdown: per arm, the means over its seeds of staleness_row; empty when no arm was stale."""
    lines = []
    for label, items in by_label.items():
        runs = [x for x in (staleness_row(rows) for _, rows, _ in items) if x is not None]
        if not runs or not any(r["age_max"] for r in runs):
            continue
        m = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
        lines.append(f"| {label} | {len(runs)} | {m['age']:.2f} | {max(r['age_max'] for r in runs)} | "
                     f"{m['weight']:.3f} | {m['lr_scale']:.3f} | {m['dropped']:.3f} | "
                     f"{m['wait']:.2f} | {m['idle']:.2f} |")
    if not lines:
        return ""
    return ("\n\nStaleness of the on-policy batches (mean over seeds; age: of the batches that reached their "
            "update, dropped ones included; decay weight: on the batch's gradient in AdamW's first moment; ESS lr "
            "factor: sqrt(ESS / N) on the learning rate of a trained batch's first update; dropped: the gate's "
            "share of generated episodes; waits in seconds per iteration, asynchronous runs only)\n\n"
            "| arm | seeds | age | max age | decay weight | ESS lr factor | dropped | trainer waits | worker idle |\n"
            "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(lines))


def trained_batches(rows: list[dict]) -> list[dict]:
    """The rows whose on-policy batch was trained: logged with its age, not dropped by the gate."""
    return [r for r in rows if "batch_age" in r and not r.get("episodes_dropped", 0)]


def batch_age_shares(rows: list[dict]) -> dict[int, float]:
    """{age in versions: share of the run's trained batches of that age}, ages in order; {} for a
    run that logged no batch ages."""
    ages = [r["batch_age"] for r in trained_batches(rows)]
    return {a: ages.count(a) / len(ages) for a in sorted(set(ages))}


def weight_by_age(rows: list[dict]) -> dict[int, float]:
    """{age in versions: mean weight the decay gave the trained batches of that age} (batch_weight,
    1 where nothing weights them), ages in order."""
    by: dict[int, list[float]] = {}
    for r in trained_batches(rows):
        by.setdefault(r["batch_age"], []).append(r.get("batch_weight", 1.0))
    return {a: float(np.mean(w)) for a, w in sorted(by.items())}

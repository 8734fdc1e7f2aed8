"""metrics.jsonl per run, and the learning-curve plot."""
from __future__ import annotations

import json
from pathlib import Path


class MetricsLog:
    """Appends one JSON object per iteration. On resume, lines past the checkpoint's iteration
    (written after it, then lost with the crash) are dropped so the file never repeats one."""

    def __init__(self, path: Path, resume_from: int | None = None):
        self.path = Path(path)
        if resume_from is not None and self.path.exists():
            keep = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("iteration", -1) < resume_from]
            self.path.write_text("".join(line + "\n" for line in keep))

    def write(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()


SUMMED = ("buffer_size", "gen_tokens")  # per-rank amounts: the run's is their sum
SLOWEST = ("engine_trainer_logp_maxdiff", "weight_sync_s")  # and every time_* key: the slowest rank's


def merge_rows(rows: list[dict]) -> dict:
    """One metrics row from every rank's row of the same iteration: amounts summed, times and
    worst cases the maximum, values all ranks agree on (global counters, losses, replay and
    validation figures, computed over all ranks) kept, and the per-rank rollout means (equal
    numbers of episodes on each rank) averaged."""
    out = {}
    for key, first in rows[0].items():
        vals = [r.get(key, first) for r in rows]
        if key in SUMMED:
            out[key] = sum(vals)
        elif not isinstance(first, (int, float)) or isinstance(first, bool) or all(v == first for v in vals):
            out[key] = first
        elif key in SLOWEST or key.startswith("time_"):
            out[key] = max(vals)
        else:
            out[key] = sum(vals) / len(vals)
    return out


def read(path) -> list[dict]:
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no metrics.jsonl at {path}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def points(rows: list[dict], key: str) -> list[tuple[float, float]]:
    """(env steps, value) of `key` over a run's rows. Training metrics sit at the env steps reached
    by the end of their iteration; validation metrics (eval_*) at the env steps spent when the
    validation ran (before the iteration's rollout), plus the final one after the last iteration
    (final_eval_*). Rows written before validation moved (no eval_env_steps) keep their own."""
    pts = []
    for r in rows:
        if key in r:
            pts.append((r.get("eval_env_steps", r["env_steps"]) if key.startswith("eval_") else r["env_steps"], r[key]))
        if key.startswith("eval_") and f"final_{key}" in r:
            pts.append((r["final_eval_env_steps"], r[f"final_{key}"]))
    return pts


def plot(run_dir, out: str | None = None) -> Path:
    """Training success and reward against environment steps, with the validation rollouts'
    eval_success and eval_score (no format penalties) as points; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read(run_dir)
    if not rows:
        raise ValueError(f"{run_dir}/metrics.jsonl holds no iterations yet")
    x = [r["env_steps"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    panels = ((axes[0], "success", "success rate", "eval_success"), (axes[1], "reward", "episode reward", "eval_score"))
    for ax, key, label, ev in panels:
        y = [r[key] for r in rows]
        ax.plot(x, y, alpha=0.35, color="C0")
        k = max(1, len(y) // 15)
        smooth = [sum(y[max(0, i - k + 1):i + 1]) / len(y[max(0, i - k + 1):i + 1]) for i in range(len(y))]
        ax.plot(x, smooth, color="C0", label=f"training {label} (mean of {k})")
        pts = points(rows, ev)
        if pts:
            ax.plot(*zip(*pts), "o-", color="C1", label=f"validation ({ev})")
        ax.set_xlabel("environment steps")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    fig.suptitle(f"{run_dir.name}", fontsize=10)
    fig.tight_layout()
    out_path = Path(out) if out else run_dir / "learning_curve.png"
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path


NOT_TRAINING = ("eval", "checkpoint")  # validation and checkpoints: timed, but not training work


def compute_seconds(row: dict) -> float:
    """Seconds of training work in one metrics row (its `time_<phase>` keys, seconds): every timed
    phase but validation and checkpoints, each second once. An enclosing phase counts as itself
    (its parts and the glue between them) and its parts are then left out (the nesting that
    freshper.profiling.nvtx.Phases allows, ENCLOSING)."""
    from freshper.profiling.nvtx import ENCLOSING

    times = {k[5:]: float(v) for k, v in row.items() if k.startswith("time_") and k[5:] not in NOT_TRAINING}
    inner = {p for outer, parts in ENCLOSING.items() if outer in times for p in parts}
    return sum(v for k, v in times.items() if k not in inner)

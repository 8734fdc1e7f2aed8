"""Experiment trackers beside metrics.jsonl (which stays the source of truth): TensorBoard and
Weights & Biases through their own libraries, every metric of every row, with the resolved config.

`train.log_to` names them ("tensorboard,wandb"); each is an optional extra
(`pip install 'freshper[tensorboard]'`, `'freshper[wandb]'`) checked when the run starts. W&B
works offline (`WANDB_MODE=offline`: the run is written under RUN_DIR/wandb and `wandb sync`
uploads it later). Nested metrics (the KL-by-age bins) are flattened to "replay_kl_by_age/4".
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb"}  # name -> module it needs


def parse(spec: str) -> list[str]:
    """'tensorboard, wandb' -> ['tensorboard', 'wandb']; ValueError naming an unknown one."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in TRACKERS]
    if bad:
        raise ValueError(f"train.log_to: unknown tracker {bad[0]!r}; choose from {', '.join(TRACKERS)} "
                         f"(comma-separated), or empty")
    return names


def check_installed(names: list[str]) -> None:
    """ImportError naming the extra to install, before a run starts."""
    for n in names:
        if importlib.util.find_spec(TRACKERS[n]) is None:
            raise ImportError(f"train.log_to={n} needs the {n} package: pip install 'freshper[{n}]'")


def scalars(row: dict, prefix: str = "") -> dict[str, float]:
    """Every number in a metrics row, nested dicts flattened with '/', [mean, count] pairs to the mean."""
    out = {}
    for k, v in row.items():
        key = f"{prefix}{k}"
        if isinstance(v, (bool, int, float)):
            out[key] = float(v)
        elif isinstance(v, dict):
            out.update(scalars(v, key + "/"))
        elif isinstance(v, (list, tuple)) and v and isinstance(v[0], (int, float)):
            out[key] = float(v[0])
    return out


class Trackers:
    """Fan a metrics row out to the chosen trackers; `close` flushes them."""

    def __init__(self, names: list[str], run_dir: Path, config: dict, resume: bool):
        check_installed(names)
        self.writers = []
        name = Path(run_dir).name
        if "tensorboard" in names:
            import yaml
            from torch.utils.tensorboard import SummaryWriter

            tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))
            tb.add_text("config", "```\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)
            self.writers.append(("tensorboard", tb))
        if "wandb" in names:
            import wandb

            run = wandb.init(project="freshper", name=name, dir=str(run_dir), config=config, id=_wandb_id(run_dir),
                             resume="allow" if resume else None)
            self.writers.append(("wandb", run))

    def write(self, row: dict) -> None:
        values = scalars(row)
        step = int(row["iteration"])
        for kind, w in self.writers:
            if kind == "tensorboard":
                for k, v in values.items():
                    w.add_scalar(k, v, step)
            else:
                w.log(values, step=step)

    def close(self) -> None:
        for kind, w in self.writers:
            if kind == "tensorboard":
                w.flush()
                w.close()
            else:
                w.finish()
        self.writers = []


def _wandb_id(run_dir) -> str:
    """One W&B run per run folder, so a resumed run continues it: an id kept in the folder."""
    import uuid

    path = Path(run_dir) / "wandb_id.txt"
    if path.exists():
        return path.read_text().strip()
    rid = uuid.uuid4().hex[:12]
    path.write_text(rid)
    return rid

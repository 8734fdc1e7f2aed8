"""TensorBoard and W&B (offline) beside metrics.jsonl: every scalar of every row, and the config."""
import glob
import json

import pytest

from freshper.trainer import config
from freshper.trainer.train.loop import Trainer
from freshper.trainer.train.trackers import parse, scalars


def test_scalars_flatten_rows():
    row = {"iteration": 3, "loss": 0.5, "ok": True, "replay_kl_by_age": {"0": [0.01, 4], "4": [0.2, 1]}, "s": "x"}
    assert scalars(row) == {"iteration": 3.0, "loss": 0.5, "ok": 1.0, "replay_kl_by_age/0": 0.01,
                            "replay_kl_by_age/4": 0.2}
    with pytest.raises(ValueError, match="unknown tracker 'mlflow'"):
        parse("tensorboard, mlflow")


def test_tensorboard_and_offline_wandb_get_every_metric(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = config.load("tiny", None, {"algo.mode": "freshper", "train.iterations": 2, "algo.tau": 123.25,
                                     "train.log_to": "tensorboard,wandb"})
    run = tmp_path / "tb"
    Trainer(cfg, run).run()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    want = set().union(*(scalars(r) for r in rows))
    assert want <= tags, sorted(want - tags)
    assert [e.value for e in acc.Scalars("reward")] == pytest.approx([r["reward"] for r in rows])
    blob = open(glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb"))[0], "rb").read()
    for key in ("replay_singleton_frac", "replay_adv_nonzero_frac", "sampling_logp_gap", "123.25"):
        assert key.encode() in blob, key


def test_a_missing_tracker_package_stops_the_start(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'freshper\[wandb\]'"):
        Trainer(config.load("tiny", None, {"train.log_to": "wandb"}), tmp_path / "w")

"""A run is a function of (config, seed): the model cache's state must not change it.

Checked to fail before the fix: building the tiny model on a cold cache consumed the global
torch RNG after the trainer had seeded it, so iteration 0 differed between a first and a
second run (reward -0.141 vs -0.178 on the default run).
"""
import torch

from freshper.trainer import config
from freshper.trainer.train.loop import Trainer

from .test_loop import stable

OVER = {"train.iterations": 2, "algo.mode": "freshper", "rollout.episodes": 4, "train.seed": 3}


def test_cold_and_warm_cache_give_the_same_run(tmp_path, monkeypatch):
    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))  # empty: the first run builds the model
    cold = Trainer(config.load("tiny", None, OVER), tmp_path / "cold").run()
    warm = Trainer(config.load("tiny", None, OVER), tmp_path / "warm").run()  # loads what the first built
    assert [stable(r) for r in cold] == [stable(r) for r in warm]


def test_arms_of_one_seed_start_from_the_same_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    first = Trainer(config.load("tiny", None, {**OVER, "algo.mode": "on-policy"}), tmp_path / "a")
    second = Trainer(config.load("tiny", None, {**OVER, "algo.mode": "per"}), tmp_path / "b")
    for (n, a), (_, b) in zip(first.model.state_dict().items(), second.model.state_dict().items()):
        assert torch.equal(a, b), n

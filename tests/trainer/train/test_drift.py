"""Adaptive tau from policy drift."""
import math

import pytest
import torch

from freshper.trainer import config
from freshper.trainer.train.drift import DriftTau
from freshper.trainer.train.loop import Trainer


def test_tau_from_a_known_drift_rate():
    d = DriftTau(tau=500.0, tau_min=1.0, tau_max=1e6, ema=0.0)
    age = torch.arange(1, 50).double()
    d.observe(age, 0.01 * age)  # KL grows 0.01 per iteration of age
    assert d.update() == pytest.approx(1 / (2 * 0.01))
    # the decay halves where the ESS fraction exp(-2 r age) halves
    assert math.exp(-2 * 0.01 * d.tau * math.log(2.0)) == pytest.approx(0.5)


def test_bounds_smoothing_and_no_data():
    d = DriftTau(tau=300.0, tau_min=20.0, tau_max=1000.0, ema=0.5)
    assert d.update() == 300.0  # nothing observed yet
    d.observe(torch.tensor([1.0, 2.0]), torch.tensor([-1.0, -2.0]))  # negative drift (noise)
    assert d.update() == 1000.0
    d.observe(torch.tensor([1.0]), torch.tensor([10.0]))
    assert d.update() == 20.0  # rate 0.5*(-1) + 0.5*10 = 4.5 -> 1/9, below tau_min
    with pytest.raises(ValueError, match="tau_min"):
        DriftTau(1.0, 0.0, 1.0)


def test_freshper_auto_sets_the_buffer_tau(tmp_path):
    cfg = config.load("tiny", None, {"algo.tau_auto": "true", "train.iterations": 3, "algo.tau_max": 777.0,
                                     "algo.insert_priority": "own"})  # own: replay reaches aged trajectories
    tr = Trainer(cfg, tmp_path / "auto")
    rows = tr.run()
    assert "tau" in rows[-1] and tr.buffer.tau == rows[-1]["tau"]
    # a drift that is there: the policy moved (seed 0 of the tiny preset updates in iterations 0 and
    # 2), replayed KL grows with age, and the measured rate pulls tau below its upper bound (with
    # the drift observations zeroed, tau stays at tau_max and this fails)
    assert rows[0]["grad_norm"] > 0 and rows[-1]["drift_rate"] > 0
    assert cfg.algo.tau_min <= rows[-1]["tau"] < 777.0
    state = tr.drift.state()
    resumed = Trainer(cfg, tmp_path / "auto", resume=True)
    assert resumed.drift.state() == state and resumed.buffer.tau == tr.buffer.tau

"""A CPU run with a sync-free replay buffer (--algo.buffer_sync_free on): the trainer builds it
(sampler "scan", no host sync in add, draw or update) and reaches its buffer.check() after each
replay update, where bad input the buffer took on the device raises."""
import pytest

from freshper import ReplayBuffer
from freshper.trainer import config
from freshper.trainer.train.loop import Trainer

OVER = {"algo.mode": "freshper", "train.iterations": 2, "algo.buffer_sync_free": "on"}


def test_a_cpu_run_builds_a_sync_free_buffer_and_checks_it(tmp_path, monkeypatch):
    seen = []
    check = ReplayBuffer.check

    def counted(self):
        seen.append(self.sync_free)
        return check(self)

    monkeypatch.setattr(ReplayBuffer, "check", counted)
    tr = Trainer(config.load("tiny", None, OVER), tmp_path / "on")
    tr.run()
    assert tr.buffer.sync_free and tr.buffer.sampler == "scan"
    assert seen and all(seen), seen  # once per replay update


def test_a_bad_priority_is_caught_at_the_trainers_check(tmp_path, monkeypatch):
    """A NaN priority handed to update_priorities is taken on the device and raised by check(),
    in its words. Wrong variant seen to fail: buffer_sync_free off (the host raises at once, in
    other words)."""
    def nan_priority(self, reward, adv):
        return reward.double() * float("nan")

    monkeypatch.setattr(Trainer, "_priority", nan_priority)
    tr = Trainer(config.load("tiny", None, OVER), tmp_path / "bad")
    with pytest.raises(ValueError, match=r"bad input to an earlier add / update_priorities .*priority must be finite"):
        tr.run()


def test_auto_is_off_on_the_cpu_and_on_needs_fifo(tmp_path):
    tr = Trainer(config.load("tiny", None, {"algo.mode": "freshper", "train.iterations": 1}), tmp_path / "auto")
    tr.run()
    assert not tr.buffer.sync_free and tr.buffer.sampler == "tree"
    with pytest.raises(ValueError, match="sync_free=True needs eviction 'fifo'"):
        ReplayBuffer(8, sampler="scan", sync_free=True, eviction="stalest")
    assert not ReplayBuffer(8, sampler="scan", eviction="stalest", device="cpu").sync_free


def test_a_resumed_run_keeps_its_sync_free_buffer(tmp_path):
    """The checkpoint carries the buffer's sync_free setting: a resumed CPU run samples with the
    scan again, not the tree (before, a state came back with the device's default)."""
    over = {**OVER, "rollout.episodes": 4, "train.iterations": 2}
    Trainer(config.load("tiny", None, over), tmp_path / "r").run(iterations=1)
    resumed = Trainer(config.load("tiny", None, over), tmp_path / "r", resume=True)
    assert resumed.buffer.sync_free and resumed.buffer.sampler == "scan"
    resumed.run()

"""rollout.lag 1 (the authors' async_generation_ratio 1): iteration t trains on a batch generated
with the weights of iteration t-1, the batch in flight survives a checkpoint, and nothing is
generated that no update trains on."""
import copy

import pytest
import torch

from freshper.trainer import config
from freshper.trainer.train import checkpoint as ckpt
from freshper.trainer.train.loop import Trainer

from .premise import assert_updates

UNPROCESSED = {"rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0}
OVER = {**UNPROCESSED, "train.iterations": 3, "algo.mode": "freshper", "rollout.episodes": 8,
        "algo.replay_updates": 1, "algo.lr": 3e-3}


def stable(row):
    return {k: v for k, v in row.items() if not k.startswith(("time_", "weight_sync_s"))}


def test_the_batch_in_flight_comes_from_the_weights_before_the_update(tmp_path):
    tr = Trainer(config.load("tiny", None, {**OVER, "rollout.lag": 1}), tmp_path / "run")
    before = copy.deepcopy(tr.model.state_dict())
    rows = tr.run(iterations=1)
    assert_updates(rows)
    assert rows[0]["rollout_lag"] == 0, "the first batch has no earlier weights to come from"
    assert list(tr.batches.pending) == [1]
    ep = tr.batches.pending[1].episodes
    assert len(ep) == 8
    under_now = tr.policy.logprobs(ep.tokens, ep.mask)
    tr.model.load_state_dict(before)
    under_before = tr.policy.logprobs(ep.tokens, ep.mask)
    m = ep.mask
    # float32 sampling against a float32 recompute of the same weights: ~1e-6 (the lag 0 runs' gap)
    assert (under_before - ep.engine_logp)[m].abs().max() < 1e-4
    assert (under_now - ep.engine_logp)[m].abs().max() > 1e-3, "the update moved the policy on these tokens"


@pytest.mark.parametrize("lag", [0, 1])
def test_the_logp_gap_is_the_lag(tmp_path, lag):
    rows = Trainer(config.load("tiny", None, {**OVER, "rollout.lag": lag}), tmp_path / "run").run()
    assert [r["rollout_lag"] for r in rows] == [0, lag, lag]
    gaps = [r["engine_trainer_logp_maxdiff"] for r in rows]
    assert gaps[0] < 1e-4
    assert all((g > 1e-3) == bool(lag) for g in gaps[1:]), gaps


def test_lag_0_and_1_agree_until_the_first_stale_batch(tmp_path):
    r0 = Trainer(config.load("tiny", None, {**OVER, "rollout.lag": 0}), tmp_path / "a").run()
    r1 = Trainer(config.load("tiny", None, {**OVER, "rollout.lag": 1}), tmp_path / "b").run()
    keys = ("reward", "success", "loss", "grad_norm", "gen_tokens")
    assert {k: r0[0][k] for k in keys} == {k: r1[0][k] for k in keys}
    assert {k: r0[1][k] for k in keys} != {k: r1[1][k] for k in keys}
    assert r0[-1]["env_steps"] > 0 and r0[-1]["episodes"] == r1[-1]["episodes"] == 24


def test_resume_keeps_the_batch_in_flight(tmp_path):
    over = {**OVER, "rollout.lag": 1}
    full = Trainer(config.load("tiny", None, over), tmp_path / "full")
    rows_full = full.run()
    assert not full.batches.pending, "the last iteration generates nothing ahead"
    part = Trainer(config.load("tiny", None, over), tmp_path / "part")
    part.run(iterations=2)
    saved = ckpt.latest(tmp_path / "part" / "checkpoints")
    assert (saved / "pending.pt").exists()
    del part
    resumed = Trainer(config.load("tiny", None, over), tmp_path / "part", resume=True)
    assert list(resumed.batches.pending) == [2]
    rows_res = resumed.run()
    assert stable(rows_res[0]) == stable(rows_full[2])
    for (n, a), (_, b) in zip(full.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), n


def test_a_pending_batch_resumes_only_at_its_number_of_ranks(tmp_path):
    path = tmp_path / "iter_000001"
    path.mkdir()
    (path / "state.json").write_text('{"world_size": 2, "iteration": 1}')
    torch.save({"x": torch.zeros(1)}, path / "pending_rank0.pt")
    with pytest.raises(ckpt.CheckpointError, match="split over 2 rank"):
        ckpt.load_pending(path)
    (path / "state.json").write_text('{"world_size": 1, "iteration": 1}')
    assert ckpt.load_pending(path) is None


@pytest.mark.parametrize("lag", [0, 1])
def test_replay_logs_the_age_since_generation(tmp_path, lag):
    """Under lag 1 a batch enters the buffer one update after the weights that generated it: the
    generation age is the buffer age plus that one (except the first batch, generated in place)."""
    # algo.staleness none: the authors' code, where the age counts from arrival (test_lockstep has the others)
    tr = Trainer(config.load("tiny", None, {**OVER, "rollout.lag": lag, "train.iterations": 4,
                                            "algo.staleness": "none"}), tmp_path / "run")
    rows = tr.run()
    b = tr.buffer.sample(64, step=tr.iteration)
    assert torch.equal(b.gen_lag.long(), (b.birth > 0).long() * lag)
    gaps = [r["replay_gen_age_mean"] - r["replay_age_mean"] for r in rows]
    assert all(0 <= g <= lag for g in gaps) and (max(gaps) > 0) == bool(lag), gaps
    for r in rows:  # the exact histogram agrees with the batch statistics it is made from
        h = r["replay_by_gen_age"]
        count = sum(c for c, _, _ in h.values())
        assert count == r["replay_rows"] * tr.K
        assert sum(int(g) * c for g, (c, _, _) in h.items()) / count == pytest.approx(r["replay_gen_age_mean"])
        assert max(int(g) for g in h) == r["replay_gen_age_max"]
        assert sum(k * c for c, k, _ in h.values()) / count == pytest.approx(r["replay_kl"], rel=1e-3, abs=1e-6)
    assert all(r["replay_grad_norm"] >= 0 for r in rows), "logged each iteration (0: a replay batch without signal)"

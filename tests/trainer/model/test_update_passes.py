"""The on-policy update without the separate log-prob forward, several passes over a fresh batch
(the update-matched control), and the hard staleness gate (algo.max_age)."""
import pytest
import torch

from freshper.trainer import config
from freshper.trainer.train.loop import Trainer

from ..train.premise import assert_updates

OVER = {"train.iterations": 3, "rollout.episodes": 8, "algo.replay_updates": 1, "algo.lr": 3e-3,
        "rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0}


def stable(row):
    return {k: v for k, v in row.items() if not k.startswith(("time_", "weight_sync_s"))}


def train(tmp_path, name, recompute, **over):
    tr = Trainer(config.load("tiny", None, {**OVER, **over}), tmp_path / name)
    tr.recompute_old_logp = recompute
    rows = tr.run()
    return tr, rows


@pytest.mark.parametrize("over", [{"algo.mode": "freshper"}, {"algo.mode": "freshper", "rollout.lag": 1},
                                  {"algo.mode": "on-policy", "algo.onpolicy_passes": 3},
                                  {"algo.mode": "per", "algo.behaviour_logp": "after", "algo.micro_batch": 3}])
def test_no_recompute_forward_changes_no_number(tmp_path, over):
    """The update's first forward gives the old policy's log-probs: every metric, the buffer's
    stored log-probs and the final weights are those of a run with the separate forward, to the bit."""
    a, ra = train(tmp_path, "cut", False, **over)
    b, rb = train(tmp_path, "recompute", True, **over)
    assert_updates(ra)
    assert [stable(r) for r in ra] == [stable(r) for r in rb]
    assert "time_logprob_recompute" in rb[0] and "time_logprob_recompute" not in ra[0]
    for (k, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(x, y), k
    if a.buffer is not None:
        assert torch.equal(a.buffer._fields["old_logp"], b.buffer._fields["old_logp"])


def test_passes_make_the_updates_of_a_replay_arm(tmp_path):
    _, on = train(tmp_path, "on", False, **{"algo.mode": "on-policy", "algo.onpolicy_passes": 2})
    _, rep = train(tmp_path, "rep", False, **{"algo.mode": "uniform"})
    assert [r["updates"] for r in on] == [r["updates"] for r in rep] == [2, 4, 6]
    # the second pass trains on the batch its first pass already moved away from
    assert all(abs(r["pass_ratio_mean"] - 1) > 1e-4 for r in on) and all(abs(r["ratio_mean"] - 1) < 1e-6 for r in on)
    _, one = train(tmp_path, "one", False, **{"algo.mode": "on-policy"})
    assert [r["updates"] for r in one] == [1, 2, 3] and "pass_loss" not in one[0]


def test_the_gate_replays_nothing_older_than_max_age(tmp_path):
    tr, rows = train(tmp_path, "gate", False, **{"algo.mode": "uniform", "algo.max_age": 1,
                                                 "train.iterations": 4})
    assert max(r["replay_age_max"] for r in rows) == 1
    assert [r["buffer_size"] for r in rows] == [8, 16, 16, 16]
    _, free = train(tmp_path, "free", False, **{"algo.mode": "uniform", "train.iterations": 4})
    assert max(r["replay_age_max"] for r in free) > 1 and free[-1]["buffer_size"] == 32


def test_a_run_records_the_commit_it_ran(tmp_path):
    import json
    import subprocess

    from freshper.trainer.train.provenance import source_commit

    tr = Trainer(config.load("tiny", None, {"train.iterations": 1}), tmp_path / "run")
    info = json.loads((tmp_path / "run" / "source.json").read_text())
    sha, dirty = source_commit()
    here = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=__file__.rsplit("/", 3)[0]).stdout.strip()
    assert info["commit"] == sha == here and info["dirty"] == dirty and info["torch"] == torch.__version__
    assert info["machine"]["cpu"] and info["machine"]["simd"] in ("avx512", "avx2", "other")
    assert info["machine"]["cores"] >= 1
    del tr
    Trainer(config.load("tiny", None, {"train.iterations": 1}), tmp_path / "run2").run()
    Trainer(config.load("tiny", None, {"train.iterations": 2}), tmp_path / "run2", resume=True)
    assert json.loads((tmp_path / "run2" / "source.json").read_text())["resumed"][0]["commit"] == sha

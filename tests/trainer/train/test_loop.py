"""End to end on the tiny model: one run per arm, resume equality, checkpoint errors."""
import json
import shutil

import pytest
import torch

from freshper.trainer import config
from freshper.trainer.cli import main
from freshper.trainer.train.checkpoint import CheckpointError
from freshper.trainer.train.loop import Trainer

from .premise import assert_updates

VOLATILE = ("time_", "weight_sync_s")


def stable(row):
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


@pytest.mark.parametrize("mode", ["on-policy", "per", "freshper", "uniform"])
def test_one_run_per_mode(tmp_path, mode):
    cfg = config.load("tiny", None, {"algo.mode": mode, "train.iterations": 2})
    tr = Trainer(cfg, tmp_path / mode)
    rows = tr.run()
    assert_updates(rows, replay=mode != "on-policy")
    assert [r["iteration"] for r in rows] == [0, 1]
    for r in rows:
        assert r["env_steps"] > 0 and 0 <= r["success"] <= 1 and r["gen_tokens"] > 0
        assert all(v == v for v in r.values() if isinstance(v, float)), "no NaN in metrics"
    if mode == "on-policy":
        assert tr.buffer is None and "is_ess" not in rows[-1]
    else:
        assert rows[-1]["buffer_size"] == 2 * cfg.rollout.episodes
        assert 0 < rows[-1]["is_ess"] <= 1 and rows[-1]["replay_age_max"] <= 1
    run = tmp_path / mode
    assert (run / "config.yaml").exists() and (run / "learning_curve.png").exists()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run / "checkpoints" / "latest").read_text().strip() == "iter_000002"


def test_resume_equals_uninterrupted(tmp_path):
    over = {"train.iterations": 3, "algo.mode": "freshper", "rollout.episodes": 4, "algo.replay_updates": 2}
    full = Trainer(config.load("tiny", None, over), tmp_path / "full")
    start = {k: v.clone() for k, v in full.model.state_dict().items()}
    rows_full = full.run()
    assert_updates(rows_full, replay=True)
    assert any(not torch.equal(start[k], v) for k, v in full.model.state_dict().items()), "the weights moved"

    part = Trainer(config.load("tiny", None, over), tmp_path / "part")
    part.run(iterations=2)
    del part
    resumed = Trainer(config.load("tiny", None, over), tmp_path / "part", resume=True)
    assert resumed.iteration == 2 and len(resumed.buffer) == 8
    rows_res = resumed.run()
    assert [r["iteration"] for r in rows_res] == [2]
    assert stable(rows_res[0]) == stable(rows_full[2])
    for (n, a), (_, b) in zip(full.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), n
    assert torch.equal(full.buffer.probabilities(), resumed.buffer.probabilities())
    lines = [json.loads(x)["iteration"] for x in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert lines == [0, 1, 2]


def test_resume_errors(tmp_path):
    cfg = config.load("tiny", None, {"train.iterations": 1})
    with pytest.raises(CheckpointError, match="no checkpoint"):
        Trainer(cfg, tmp_path / "empty", resume=True)
    Trainer(cfg, tmp_path / "r").run()
    ck = tmp_path / "r" / "checkpoints"
    (ck / "iter_000001" / "optim.pt").unlink()
    with pytest.raises(CheckpointError, match="incomplete"):
        Trainer(cfg, tmp_path / "r", resume=True)
    shutil.rmtree(ck / "iter_000001")
    Trainer(cfg, tmp_path / "r2").run()
    (tmp_path / "r2" / "checkpoints" / "iter_000001" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="could not be loaded"):
        Trainer(cfg, tmp_path / "r2", resume=True)


def test_cli_train_and_resume(tmp_path, capsys):
    assert main(["train", "--preset", "tiny", "--train.run_dir", str(tmp_path), "--train.name", "cli",
                 "--train.iterations", "1"]) == 0
    run = tmp_path / "cli"
    assert (run / "checkpoints" / "latest").exists()
    assert main(["train", "--resume", str(run), "--train.iterations", "2"]) == 0
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert main(["plot", str(run)]) == 0
    assert capsys.readouterr().out.strip().endswith("learning_curve.png")


@pytest.mark.parametrize("argv,msg", [
    (["--preset", "nope"], "presets: frozenlake"),
    (["--algo.nope", "1"], "unknown config key 'algo.nope'"),
    (["--algo.mode", "sometimes"], "algo.mode must be one of"),
    (["--algo.tau", "abc"], "algo.tau must be a number"),
    (["--rollout.episodes", "5"], "multiple of rollout.group_size"),
    (["--tau"], "expected one argument"),
    (["--resume", "/nonexistent"], "no config.yaml"),
])
def test_cli_errors_list_valid_choices(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", *argv])
    assert e.value.code == 2
    assert msg in capsys.readouterr().err


def test_cli_help_lists_every_field(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for key in config.field_table():
        assert f"--{key}" in out
    assert main(["bogus"]) == 2


def test_config_file_and_precedence(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("algo:\n  tau: 123\n  mode: per\ntrain:\n  iterations: 7\n")
    cfg = config.load("sokoban-simple", str(f), {"iterations": "9"})
    assert (cfg.env.name, cfg.algo.tau, cfg.algo.mode, cfg.train.iterations) == ("sokoban", 123.0, "per", 9)
    f.write_text("algo:\n  taux: 1\n")
    with pytest.raises(ValueError, match="taux"):
        config.load("frozenlake", str(f))


def test_profile_on_cpu_writes_a_chrome_trace_with_phase_ranges(tmp_path, capsys):
    assert main(["profile", "--preset", "tiny", "--train.run_dir", str(tmp_path), "--train.name", "p",
                 "--train.iterations", "3", "--iterations", "1:1"]) == 0
    trace = tmp_path / "p" / "profile" / "trace_iters_1_1.json"
    assert str(trace) in capsys.readouterr().out
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    for phase in ("rollout", "generate", "env_step", "onpolicy_update", "buffer_add", "sample",
                  "replay_update", "priority_update", "weight_sync"):
        assert phase in names, phase
    assert "logprob_recompute" not in names, "the update's own forward gives the old log-probs"
    with pytest.raises(SystemExit):
        main(["profile", "--preset", "tiny", "--iterations", "5:2"])


def test_evaluation_rows_and_evaluation_does_not_change_training(tmp_path):
    over = {"train.iterations": 3, "rollout.episodes": 4, "eval.episodes": 3}
    with_eval = Trainer(config.load("tiny", None, {**over, "eval.every": 2}), tmp_path / "e").run()
    without = Trainer(config.load("tiny", None, {**over, "eval.every": 0}), tmp_path / "n").run()
    assert [("eval_success" in r) for r in with_eval] == [True, False, True]  # every 2, and the last
    for r in with_eval:
        if "eval_success" in r:
            assert 0 <= r["eval_success"] <= 1 and r["eval_score"] <= 1
    strip = lambda r: {k: v for k, v in stable(r).items() if not k.startswith(("eval_", "final_eval_"))}  # noqa: E731
    assert [strip(r) for r in with_eval] == [strip(r) for r in without]


@pytest.mark.parametrize("env", ["frozenlake", "search"])
def test_validation_played_in_chunks_measures_what_it_measures_at_once(tmp_path, env):
    """eval.batch bounds how many states play at once (memory), not what is measured: greedy
    replies give the same figures, an uneven last chunk and the per-episode extras (search's
    answer scores) included."""
    preset = {"frozenlake": "tiny", "search": "search-cpu"}[env]
    # with the tiny models' warm starts, so that replies are valid and score something
    over = {"eval.episodes": 5, "eval.samples": 1, "eval.temperature": 0.0}
    whole = Trainer(config.load(preset, None, over), tmp_path / "a").evaluate()
    chunked = Trainer(config.load(preset, None, {**over, "eval.batch": 2}), tmp_path / "b").evaluate()
    assert whole["eval_valid_action"] > 0.5, "replies that score something, or the equality says little"
    assert chunked == whole


def test_resume_with_other_buffer_settings_names_them(tmp_path):
    cfg = config.load("tiny", None, {"train.iterations": 1})
    Trainer(cfg, tmp_path / "r").run()
    other = config.load("tiny", None, {"train.iterations": 2, "algo.capacity": 64, "algo.alpha": 0.7})
    with pytest.raises(ValueError, match="algo.capacity is 32 in the checkpoint, 64 now.*algo.alpha"):
        Trainer(other, tmp_path / "r", resume=True)


@pytest.mark.parametrize("is_weights,insert,expect_weights,expect_update", [
    (False, "max", False, True), (True, "own", True, False)])
def test_is_weights_and_priority_updates_follow_the_options(tmp_path, monkeypatch, is_weights, insert,
                                                            expect_weights, expect_update):
    cfg = config.load("tiny", None, {"train.iterations": 1, "algo.is_weights": str(is_weights),
                                     "algo.insert_priority": insert})
    tr = Trainer(cfg, tmp_path / "w")
    seen, updates = [], []
    update = tr.policy.update
    monkeypatch.setattr(tr.policy, "update", lambda *a, **k: seen.append(a[4]) or update(*a, **k))
    monkeypatch.setattr(tr.buffer, "update_priorities", lambda *a, **k: updates.append(a))
    tr.run()
    assert seen[0] is None  # the on-policy update never has IS weights
    assert (seen[1] is not None) == expect_weights
    assert bool(updates) == expect_update

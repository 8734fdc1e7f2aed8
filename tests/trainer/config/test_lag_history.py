"""rollout.lag_probs from a run that ran (trainer/config/lag_history.py): a run folder, or its
metrics.jsonl, becomes the shares of its batches' ages 0..max, kept and recorded in the new run's
config.yaml; anything else is refused in one line naming the option, before anything is written."""
import json
import shutil

import pytest

from freshper.trainer import config as C
from freshper.trainer.cli import main
from freshper.trainer.flags import parse_overrides
from freshper.trainer.train.loop import Trainer


@pytest.fixture(scope="module")
def lockstep_run(tmp_path_factory):
    """A real lockstep run: 8 iterations, each batch's lag drawn as 0 or 1 (seed 0)."""
    run = tmp_path_factory.mktemp("lagged") / "run"
    cfg = C.load("tiny", None, {"rollout.lag_probs": "0.5,0.5", "train.iterations": 8, "eval.every": 0,
                                "algo.mode": "on-policy", "train.progress": False})
    Trainer(cfg, run).run()
    return run


def ages_of(run) -> list[int]:
    return [json.loads(line)["batch_age"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_run_folder_and_its_metrics_give_the_shares_of_its_batch_ages(lockstep_run):
    ages = ages_of(lockstep_run)
    assert len(ages) == 8 and set(ages) == {0, 1}, "premise: the run trained batches of both ages"
    want = [ages.count(0) / 8, ages.count(1) / 8]
    for given in (str(lockstep_run), str(lockstep_run / "metrics.jsonl")):
        got = C.load("tiny", None, {"rollout.lag_probs": given}).rollout.lag_probs
        assert C.parse_lag_probs(got) == pytest.approx(want, abs=1e-11)
        assert parse_overrides(["--rollout.lag_probs", given]) == {"rollout.lag_probs": got}, "the flag alike"


def test_the_ages_are_counted_from_zero_to_the_largest(tmp_path):
    """Ages never seen below the largest are 0, the largest ends the list; a batch the gate dropped
    counts (its lag is how old it arrived); a row without batch_age (a run from before runs
    recorded it) is not a batch."""
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"batch_age": 3, "episodes_dropped": 4}, {"batch_age": 0}, {"iteration": 9}, {"batch_age": 3},
        {"batch_age": 1}]))
    assert C.resolve_lag_probs(str(tmp_path)) == "0.25,0.25,0,0.5"


def test_the_probabilities_are_recorded_so_a_resume_needs_no_other_folder(lockstep_run, tmp_path, capsys):
    copy = tmp_path / "copied"
    shutil.copytree(lockstep_run, copy)
    want = C.resolve_lag_probs(str(copy))
    assert main(["train", "--preset", "tiny", "--rollout.lag_probs", str(copy), "--train.iterations", "1",
                 "--eval.every", "0", "--train.run_dir", str(tmp_path), "--train.name", "replayed"]) == 0
    shutil.rmtree(copy)
    recorded = tmp_path / "replayed" / "config.yaml"
    assert f"lag_probs: {want}\n" in recorded.read_text()
    assert C.load("tiny", str(recorded), run_config=True).rollout.lag_probs == want
    capsys.readouterr()


@pytest.mark.parametrize("metrics, says", [
    (None, "no such file or folder"),                  # no folder
    ("", "no such file"),                              # a folder without metrics.jsonl
    ('{"iteration": 0}\n', "no rows with batch_age"),  # a run from before batch_age
    ('{"batch_age": 65}\n', "up to 64"),               # older than lockstep draws
])
def test_bad_input_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys, metrics, says):
    given = tmp_path / "given"
    if metrics is not None:
        given.mkdir()
        if metrics:
            (given / "metrics.jsonl").write_text(metrics)
    with pytest.raises(SystemExit):
        main(["train", "--preset", "tiny", "--rollout.lag_probs", str(given),
              "--train.run_dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "rollout.lag_probs" in err and says in err and "run folder" in err
    assert not (tmp_path / "runs").exists()

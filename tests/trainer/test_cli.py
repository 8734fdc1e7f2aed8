"""The command line a user meets in the first hour: resume, errors, help, console output."""
import json

import pytest
import yaml

from freshper.trainer import config
from freshper.trainer.cli import main

TINY = ["--preset", "tiny", "--train.iterations", "1"]


def run_once(tmp_path, name="r", *extra):
    assert main(["train", *TINY, "--train.run_dir", str(tmp_path), "--train.name", name, *extra]) == 0
    return tmp_path / name


@pytest.mark.parametrize("flag", [["--algo.alpha", "0.9"], ["--train.seed", "3"], ["--train.name", "other"],
                                  ["--train.run_dir", "elsewhere"], ["--rollout.episodes", "8"],
                                  ["--rollout.group_size", "4"]])
def test_a_resume_refuses_what_its_checkpoint_fixed_in_one_line(tmp_path, capsys, flag):
    """The run's data, groups, seeds and folder cannot change on resume (a new seed changes the
    environments mid-run, new group sizes collide group ids, a new name is ignored but would be
    recorded): refused before anything is written, naming the field."""
    run = run_once(tmp_path)
    before = (run / "config.yaml").read_text()
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["train", "--resume", str(run), *flag, "--train.iterations", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert f"{flag[0][2:]} cannot change within a run" in err[-1] and "train.iterations" in err[-1]
    assert (run / "config.yaml").read_text() == before, "a refused resume writes nothing"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1


def test_resuming_a_finished_run_says_so_and_overrides_reach_config_yaml(tmp_path, capsys):
    run = run_once(tmp_path)
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 0
    assert "nothing to do: " in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--train.iterations", "2"]) == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["iterations"] == 2
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2


def test_preset_or_config_with_resume_is_an_error(tmp_path, capsys):
    run = run_once(tmp_path)
    with pytest.raises(SystemExit):
        main(["train", "--resume", str(run), "--preset", "frozenlake"])
    assert "--preset and --config do not apply" in capsys.readouterr().err


def test_run_folders_are_named_after_the_preset(tmp_path):
    assert main(["train", *TINY, "--train.run_dir", str(tmp_path)]) == 0
    assert (tmp_path / "tiny-freshper-s0" / "metrics.jsonl").exists()


@pytest.mark.parametrize("argv,msg", [
    (["--help-me"], "unknown config key 'help-me'"),  # named as a key, not "needs a value"
    (["--train.iterations", "3", "--iterations", "4"], "--train.iterations is given twice"),
])
def test_flag_errors(argv, msg, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--preset", "tiny", *argv])
    assert msg in capsys.readouterr().err


@pytest.mark.parametrize("text,msg", [
    ("train:\n  iterations: \"3\"\n", "train.iterations must be an integer, got '3'"),
    ("train: 3\n", "train is a section and needs a mapping of its fields"),
])
def test_yaml_values_keep_their_types(tmp_path, text, msg):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match=msg):
        config.load("tiny", str(f))


def test_help_fits_100_columns_and_never_splits_a_preset_name(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    listed = out[out.index("presets: "):].replace("\n", " ")
    for name in config.PRESETS:
        assert f" {name}," in listed or listed.rstrip().endswith(f" {name}"), name


def test_console_output_of_a_short_run(tmp_path, capsys):
    """No transformers progress bars or font-cache lines, a wall time in seconds, and with the
    progress bar on, every log line on a line of its own (not glued to the bar)."""
    run_once(tmp_path, "c", "--train.progress", "true")
    err = capsys.readouterr().err
    assert "Loading weights" not in err and "Writing model shards" not in err and "fontManager" not in err
    assert "0.0 min wall" not in err and " s wall" in err
    assert err.count("warm start:") == 1, "the warm start is reported once"
    for line in err.splitlines():
        if " INFO " in line:
            assert line.index(" INFO ") == 23, f"a log line glued to something: {line!r}"  # after the timestamp
    rows = [json.loads(x) for x in (tmp_path / "c" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1

"""The command line a user meets in the first hour: resume, errors, help, console output, and the
start-up refusals made before anything is written (an occupied run folder, torchrun)."""
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


def test_existing_run_folder_is_not_overwritten(tmp_path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"iteration": 0}\n')
    with pytest.raises(SystemExit):
        main(["train", "--preset", "tiny", "--train.run_dir", str(tmp_path), "--train.name", "r"])
    err = capsys.readouterr().err
    assert "--resume" in err and "already holds a run" in err
    assert (run / "metrics.jsonl").read_text() == '{"iteration": 0}\n'


def test_failed_start_removes_the_half_made_folder(tmp_path, capsys):
    """A model folder that passes the option check but cannot be loaded: the start fails after
    the run folder was made, and the folder must not be left behind."""
    bad = tmp_path / "model"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(Exception):
        main(["train", "--preset", "tiny", "--model.path", str(bad), "--train.run_dir", str(tmp_path / "runs"),
              "--train.name", "x"])
    assert not (tmp_path / "runs" / "x").exists()
    assert "removed the half-made run folder" in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (["--algo.tua", "5"], "unknown config key 'algo.tua'; did you mean algo.tau?"),
    (["--rollout.tempreature", "1"], "did you mean rollout.temperature?"),
    (["--algo.capacity", "x"], "algo.capacity must be an integer, got 'x'"),
    (["--config", "/nonexistent/run.yaml"], "--config /nonexistent/run.yaml: no such file"),
])
def test_one_line_errors(argv, needle, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--train.run_dir", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and "Traceback" not in err, err


def test_yaml_with_an_indentation_error_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  tau: 5\n mode: per\n")
    with pytest.raises(SystemExit):
        main(["train", "--config", str(bad), "--train.run_dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"freshper train: error: --config {bad} is not valid YAML at line 3")


def test_help_shows_the_defaults_of_the_preset_it_runs(capsys):
    for argv, want in ((["--help"], ("'math'", "15")), (["--preset", "frozenlake", "--help"], ("'frozenlake'", "80"))):
        with pytest.raises(SystemExit):
            main(["train", *argv])
        out = capsys.readouterr().out
        env_help = out[out.index("--env.name"):out.index("--env.max_turns")]
        start = out.index("--train.iterations")
        iters_help = out[start:out.index("\n  --", start)]
        env_help, iters_help = " ".join(env_help.split()), " ".join(iters_help.split())  # wrapped lines
        assert f"default {want[0]}" in env_help and f"(default {want[1]})" in iters_help


def test_profile_under_torchrun_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as e:
        main(["profile", "--preset", "tiny", "--train.run_dir", str(tmp_path / "runs"), "--iterations", "0:1"])
    assert e.value.code == 2 and "WORLD_SIZE=2" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("cmd", ["compare", "chance", "export", "eval", "plot"])
def test_one_process_commands_under_torchrun_are_refused(monkeypatch, capsys, cmd):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main([cmd, "x"]) == 2 and "runs as one process" in capsys.readouterr().err


def test_a_configuration_several_ranks_cannot_split_is_refused_before_anything_is_written(tmp_path, monkeypatch,
                                                                                          capsys):
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SystemExit) as e:
        main(["train", "--preset", "tiny", "--train.run_dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "WORLD_SIZE=3" in err and "split evenly over 3 ranks" in err
    assert not (tmp_path / "runs").exists()

"""Every config field rejects a bad value before anything is built, naming the field."""
import pytest
import yaml

from freshper.trainer import config as C
from freshper.trainer.cli import main

# One refused value per field, declared beside the field (opt(..., bad=...)).
INVALID = C.invalid_examples()


def test_every_field_declares_a_value_it_refuses():
    assert set(INVALID) == set(C.field_table())


def test_a_rule_without_its_words_is_refused_where_it_is_declared():
    """A field with a rule must say in words what passes (its errors show them): opt() refuses
    one without, at import, so no field can reach a user with a wordless error."""
    with pytest.raises(TypeError, match="needs allowed="):
        C.opt(1, "a field", rule=lambda v: v > 0, bad="0")
    assert all(text for _, text in C.rules().values())


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FRESHPER_CACHE", str(cache))
    return cache


@pytest.mark.parametrize("key", sorted(INVALID))
def test_each_field_fails_fast_with_its_name(key, tmp_path, empty_cache, capsys):
    runs = tmp_path / "runs"
    argv = ["train", "--preset", "tiny", f"--{key}", INVALID[key]]
    if key != "train.run_dir":
        argv += ["--train.run_dir", str(runs)]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err, err
    assert not runs.exists(), "a run folder was made before the options were checked"
    assert not empty_cache.exists(), "the model was built before the options were checked"


@pytest.mark.parametrize("over,needle", [
    ({"rollout.episodes": 6, "rollout.group_size": 4}, "multiple of rollout.group_size"),
    ({"rollout.max_new_tokens": 200, "rollout.max_len": 160}, "rollout.max_len"),
    ({"algo.tau_min": 100.0, "algo.tau_max": 50.0}, "algo.tau_min"),
    ({"algo.replay_batch": 64, "algo.capacity": 32}, "algo.capacity"),
    ({"env.name": "sokoban", "env.size": 4, "env.boxes": 2}, "env.boxes"),
])
def test_cross_field_rules(over, needle):
    with pytest.raises(ValueError, match=needle):
        C.load("tiny", None, over)


def test_valid_values_pass():
    cfg = C.load("tiny", None, {"algo.tau": "inf", "model.path": "Qwen/Qwen2.5-0.5B-Instruct", "train.name": "x.1"})
    assert cfg.algo.tau == float("inf")


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


def test_a_preset_names_the_local_data_it_cannot_default(tmp_path):
    with pytest.raises(ValueError, match="preset qwen2.5-3b-nq-search needs --env.data and --env.eval_data"):
        C.load("qwen2.5-3b-nq-search")
    train = tmp_path / "train.parquet"
    train.write_bytes(b"")
    with pytest.raises(ValueError, match="needs --env.eval_data"):
        C.load("qwen2.5-3b-nq-search", None, {"env.data": str(train)})
    cfg = C.load("qwen2.5-3b-nq-search", None, {"env.data": str(train), "env.eval_data": str(train)})
    assert cfg.env.retriever.startswith("http://") and cfg.env.corpus == "", "the service brings its corpus"


def test_search_questions_need_passages_to_search(tmp_path):
    data = tmp_path / "q.parquet"
    data.write_bytes(b"")
    with pytest.raises(ValueError, match="env.data for search needs env.corpus"):
        C.load("search-cpu", None, {"env.data": str(data)})
    C.load("search-cpu", None, {"env.data": str(data), "env.retriever": "http://127.0.0.1:8100"})


@pytest.mark.parametrize("env,key,value", [("frozenlake", "env.boxes", 2), ("math", "env.max_turns", 3),
                                           ("sokoban", "env.p_frozen", 0.5), ("search", "env.digits", 3),
                                           ("geoqa", "env.top_k", 5), ("frozenlake-vlm", "env.prompts", "replay"),
                                           # at its default value too: given is given (it would be unused)
                                           ("frozenlake", "env.digits", 2), ("math", "env.size", 4)])
def test_an_option_of_another_environment_is_named(env, key, value):
    with pytest.raises(ValueError, match=f"{key}={value!r} is not an option of env.name={env!r}"):
        C.load("tiny", None, {"env.name": env, key: value})


def test_a_presets_options_for_its_own_environment_do_not_follow_another_one():
    cfg = C.load("tiny", None, {"env.name": "math"})  # tiny sets env.max_turns 3 for its FrozenLake
    assert cfg.env.max_turns == C.EnvConfig().max_turns
    with pytest.raises(ValueError, match="env.max_turns=3 is not an option of env.name='math'"):
        C.load("tiny", None, {"env.name": "math", "env.max_turns": 3})


def test_each_environment_declares_options_its_constructor_takes():
    import inspect

    from freshper.trainer.config import env_kwargs
    from freshper.trainer.envs import ENVS

    table = C.field_table()
    for name, cls in ENVS.items():
        assert all(f"env.{o}" in table for o in cls.OPTIONS), name
        cfg = C.load("tiny", None, {"env.name": name})
        params = inspect.signature(cls.__init__).parameters
        assert set(env_kwargs(cfg)) <= set(params), name
    assert C.env_options("math") == ("name", "format_penalty", "data", "eval_data", "question_key", "answer_key",
                                     "digits", "scorer", "operands", "operation", "held_out", "last_digits", "reward",
                                     "success_at")


def test_a_run_config_holds_its_environments_options_only_and_an_older_one_still_resumes(tmp_path, caplog):
    cfg = C.load("math-cpu")
    assert set(yaml.safe_load(C.to_yaml(cfg))["env"]) == set(C.env_options("math"))
    old = yaml.safe_load(C.to_yaml(cfg))
    old["env"].update(max_turns=1, size=4)  # what a run folder written before 2026-12-01 holds
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    with pytest.raises(ValueError, match="env.max_turns=1 is not an option"):
        C.load("frozenlake", str(path))
    with caplog.at_level("WARNING", logger="freshper"):
        again = C.load("frozenlake", str(path), run_config=True)
    assert again == cfg and "dropped env.max_turns=1" in caplog.text

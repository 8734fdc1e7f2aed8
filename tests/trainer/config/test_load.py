"""A config read from YAML (trainer/config/load.py): values keep their types, and a run's
config.yaml holds its environment's options only, an older one still resuming."""
import pytest
import yaml

from freshper.trainer import config as C


@pytest.mark.parametrize("text,msg", [
    ("train:\n  iterations: \"3\"\n", "train.iterations must be an integer, got '3'"),
    ("train: 3\n", "train is a section and needs a mapping of its fields"),
])
def test_yaml_values_keep_their_types(tmp_path, text, msg):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match=msg):
        C.load("tiny", str(f))


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


def test_a_yaml_files_numbers_as_people_write_them(tmp_path):
    """A YAML file's 1e-6 (no dot: a string to YAML 1.1's resolver) is a number, as in YAML 1.2;
    a quoted one stays a string, refused for a number field."""
    f = tmp_path / "c.yaml"
    f.write_text("algo:\n  lr: 1e-6\n  eps: 2E-7\n  replay_updates: 3\n")
    cfg = C.load("tiny", str(f))
    assert (cfg.algo.lr, cfg.algo.eps, cfg.algo.replay_updates) == (1e-6, 2e-7, 3)
    f.write_text("algo:\n  replay_updates: '3'\n")
    with pytest.raises(ValueError, match="algo.replay_updates must be an integer"):
        C.load("tiny", str(f))


def test_a_run_from_before_the_staleness_option_resumes_with_its_old_behaviour(tmp_path):
    """A run folder written before algo.staleness existed trained lagged batches as if fresh: its
    resume keeps that (none), while a new run's file keeps what it says."""
    old = tmp_path / "old.yaml"
    old.write_text("rollout:\n  lag: 1\nalgo:\n  mode: freshper\n")
    assert C.load("tiny", str(old), run_config=True).algo.staleness == "none"
    assert C.load("tiny", str(old)).algo.staleness == "is", "a --config file is not a run's: the default"
    new = tmp_path / "new.yaml"
    new.write_text("rollout:\n  lag: 1\nalgo:\n  staleness: decay\n")
    assert C.load("tiny", str(new), run_config=True).algo.staleness == "decay"


def test_a_gated_run_from_before_stale_max_age_resumes_with_its_old_gate(tmp_path):
    """Before algo.stale_max_age, algo.max_age was both the staleness gate and the replay buffer's
    age limit: such a run's config.yaml resumes with both as they were; a new file must name the
    gate's own limit."""
    old = tmp_path / "old.yaml"
    old.write_text("rollout:\n  lag_probs: 0.5,0.5\nalgo:\n  mode: per\n  staleness: gate\n  max_age: 4\n")
    a = C.load("tiny", str(old), run_config=True).algo
    assert (a.stale_max_age, a.max_age) == (4, 4)
    with pytest.raises(ValueError, match="algo.stale_max_age >= 1"):
        C.load("tiny", str(old))
    new = tmp_path / "new.yaml"
    new.write_text("rollout:\n  lag_probs: 0.5,0.5\nalgo:\n  staleness: gate\n  stale_max_age: 2\n")
    a = C.load("tiny", str(new), run_config=True).algo
    assert (a.stale_max_age, a.max_age) == (2, 0)

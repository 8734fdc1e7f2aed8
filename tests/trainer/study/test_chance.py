"""`freshper chance`: the random-reply policy's score, the chance level results are read against."""
import pytest

from freshper.trainer import config as C
from freshper.trainer.cli import main
from freshper.trainer.study.chance import chance


def test_math_chance_is_one_in_twenty():
    # one-digit a + b: the answer is one of 0..18 and the random reply one of 0..19, so 1/20
    out = chance(C.load("math-cpu"), 4000)
    sigma = (0.05 * 0.95 / 4000) ** 0.5
    assert abs(out["success"] - 0.05) < 4 * sigma and out["reward"] == out["success"]


def test_more_turns_more_free_successes_and_splits_differ():
    cfg = C.load("frozenlake", None, {"env.max_turns": 1})
    one = chance(cfg, 300)
    ten = chance(C.load("frozenlake"), 300)
    assert 0 < one["success"] < ten["success"] < 0.5
    assert chance(C.load("frozenlake"), 300) == ten  # a function of (config, seed)
    assert chance(C.load("frozenlake"), 300, "eval") != ten


@pytest.mark.parametrize("kwargs, name", [({"episodes": 0}, "episodes"), ({"episodes": 5, "split": "test"}, "split")])
def test_bad_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        chance(C.load("frozenlake"), **kwargs)


def test_cli(capsys):
    assert main(["chance", "--preset", "math-cpu", "--episodes", "200"]) == 0
    assert "success 0.0" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["chance", "--preset", "math-cpu", "--split", "nope"])
    assert e.value.code == 2 and "split must be one of" in capsys.readouterr().err

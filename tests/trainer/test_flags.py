"""The config fields as argparse flags (trainer/flags.py)."""
import pytest

from freshper.trainer import config as C
from freshper.trainer.flags import parse_overrides


def test_every_field_is_a_flag_and_its_default_as_text_comes_back_typed():
    table = C.field_table()
    text = {bool: lambda v: str(v).lower(), float: repr}
    argv = [x for key, (typ, default, _) in table.items() for x in (f"--{key}", text.get(typ, str)(default))]
    got = parse_overrides(argv)
    assert got == {key: default for key, (_, default, _) in table.items()}
    assert all(type(got[k]) is typ for k, (typ, _, _) in table.items())


@pytest.mark.parametrize("argv,want", [
    (["--algo.tau", "5"], {"algo.tau": 5.0}),
    (["--tau=5"], {"algo.tau": 5.0}),                       # a unique field name drops its section
    (["--env.format_penalty", "-0.2"], {"env.format_penalty": -0.2}),  # a negative number is a value
    (["--train.progress", "no"], {"train.progress": False}),
    (["--model.path", ""], {"model.path": ""}),
    ([], {}),
])
def test_parsed_values(argv, want):
    assert parse_overrides(argv) == want


@pytest.mark.parametrize("argv,msg", [
    (["--algo.tua", "5"], "unknown config key 'algo.tua'; did you mean algo.tau?"),
    (["--name", "x"], "config key 'name' is ambiguous: one of env.name, train.name"),
    (["--algo.mo", "per"], "unknown config key 'algo.mo'"),  # no abbreviations: argparse's default is off
    (["--tau", "1", "--algo.tau", "2"], "--algo.tau is given twice"),
    (["--algo.tau"], "expected one argument"),
    (["per"], "unexpected argument 'per'"),
    (["--algo.mode", "sometimes"], "algo.mode must be one of"),
    (["--algo.tau", "0"], "algo.tau must be > 0"),
    # a list of numbers that starts with a negative one is a value too, refused by its own rule
    (["--rollout.lag_probs", "-0.5,1.5"], "rollout.lag_probs must be empty, comma-separated probabilities >= 0"),
])
def test_errors_are_one_line_naming_the_flag(argv, msg):
    with pytest.raises(ValueError) as e:
        parse_overrides(argv)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_numbers_as_people_write_them():
    """A negative number in exponent form is a value, not a flag (a YAML file's numbers:
    tests/trainer/config/test_load.py)."""
    assert parse_overrides(["--env.format_penalty", "-1e-3", "--algo.lr", "1e-6"]) == {
        "env.format_penalty": -0.001, "algo.lr": 1e-6}

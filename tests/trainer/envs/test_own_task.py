"""A task defined outside the package trains through `freshper train`: an environment class named
by its import path with its own keywords, and a dataset with a reward function (TRL's
reward_funcs, verl's custom reward)."""
import dataclasses
import json
import re

import pytest

from freshper.trainer import config as C
from freshper.trainer.cli import main
from freshper.trainer.envs import QuestionEnv, StepResult

HERE = "tests.trainer.envs.test_own_task"


class Doubling(QuestionEnv):
    """"What is twice N?" with N below `limit`; a right answer scores `prize`."""

    name = "doubling"
    instruction = "Answer with the number only."
    OPTIONS = {"format_penalty": "format_penalty"}  # a built-in env.* field it takes

    def __init__(self, limit: int = 10, prize: float = 1.0, format_penalty: float = -0.1):
        super().__init__(1, format_penalty)
        self.limit, self.prize = limit, prize
        self.question, self.answer = "", ""

    def _reset(self, seed: int) -> None:
        n = seed % self.limit
        self.question, self.answer = f"What is twice {n}?", str(2 * n)
        self.correct = False

    def opening(self, state, max_words):
        return [{"role": "user", "content": f"{self.question}\n{self.instruction}"}]

    def random_reply(self, rng):
        return str(rng.randrange(2 * self.limit))

    def step(self, text):
        self.turn += 1
        self.done = True
        self.correct = text.strip().split()[:1] == [self.answer]
        reward = self.prize if self.correct else 0.0
        return StepResult(self.render(), reward, 0.0, True, True, self.correct, {})


class AlwaysRight(Doubling):
    """A step that reports success and reward 1 in its StepResult and keeps no tally of its own:
    the rollout must read the result (it used to read env.total_reward and train on 0)."""

    def step(self, text):
        self.turn, self.done = self.turn + 1, True
        return StepResult(self.render(), 1.0, 0.0, True, True, True, {})


class GymStyle(Doubling):
    """A gymnasium-style step: (observation, reward, terminated, truncated, info)."""

    def step(self, text):
        self.turn, self.done = self.turn + 1, True
        return self.render(), 1.0, True, False, {}


class NoneReward(Doubling):
    """A step whose StepResult has no reward (it ended in a TypeError traceback)."""

    def step(self, text):
        r = super().step(text)
        return StepResult(r.observation, None, r.penalty, r.done, r.valid, r.success, r.info)


class NanReward(Doubling):
    """A step whose reward is nan (it ended in "non-finite gradient norm nan; lower algo.lr")."""

    def step(self, text):
        r = super().step(text)
        return StepResult(r.observation, float("nan"), r.penalty, r.done, r.valid, r.success, r.info)


def last_number_reward(reply: str, answer: str) -> float:
    """A reward function as a GRPO user writes one, with a rule no built-in scorer has: 0.5 for a
    reply whose last number is the answer and that says nothing else, else 0."""
    found = re.findall(r"-?\d+", reply)
    return 0.5 if found and found[-1] == answer and reply.strip() == answer else 0.0


TINY = ["--preset", "tiny", "--train.iterations", "2", "--train.sft_steps", "2"]


def test_an_environment_class_by_import_path_trains(tmp_path):
    argv = ["train", *TINY, "--env.name", f"{HERE}:Doubling", "--env.kwargs", "{limit: 7, prize: 2}",
            "--env.format_penalty", "-0.2", "--train.run_dir", str(tmp_path), "--train.name", "own"]
    assert main(argv) == 0
    rows = [json.loads(x) for x in (tmp_path / "own" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[-1]["env_steps"] > 0
    # each of the 4 episodes scores 0 or the prize 2: the batch mean is a multiple of 2 / 4
    assert all(abs(r["reward"] * 2 - round(r["reward"] * 2)) < 1e-9 and 0 <= r["reward"] <= 2 for r in rows)
    cfg = C.load("tiny", str(tmp_path / "own" / "config.yaml"), run_config=True)
    assert cfg.env.name == f"{HERE}:Doubling" and cfg.env.kwargs == "{limit: 7, prize: 2}"
    from freshper.trainer.config import env_kwargs

    assert env_kwargs(cfg) == {"format_penalty": -0.2, "limit": 7, "prize": 2.0}


def test_the_reward_a_step_returns_is_the_reward_trained_on(tmp_path):
    argv = ["train", *TINY, "--env.name", f"{HERE}:AlwaysRight", "--train.run_dir", str(tmp_path),
            "--train.name", "right"]
    assert main(argv) == 0
    rows = [json.loads(x) for x in (tmp_path / "right" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["reward"] == 1.0 and r["success"] == 1.0 for r in rows), rows


def test_a_gymnasium_style_step_is_refused_in_one_line(tmp_path, capsys):
    argv = ["train", *TINY, "--env.name", f"{HERE}:GymStyle", "--train.run_dir", str(tmp_path),
            "--train.name", "gym"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "GymStyle.step must return freshper.trainer.envs.StepResult" in err[-1] and "tuple" in err[-1]


@pytest.mark.parametrize("cls,shown", [("NoneReward", "None"), ("NanReward", "nan")])
def test_a_step_results_unreadable_reward_is_refused_in_one_line(tmp_path, capsys, cls, shown):
    """Issue 77, defect 3: one line naming the environment, the field and the turn, no traceback."""
    argv = ["train", *TINY, "--env.name", f"{HERE}:{cls}", "--train.run_dir", str(tmp_path), "--train.name", cls]
    assert main(argv) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and "freshper train: " in last, err[-2000:]
    assert f"{cls}.step returned StepResult.reward={shown} in turn 1 of its episode: reward must be a finite " \
           "number" in last, last


@pytest.mark.parametrize("field,value", [("reward", None), ("reward", float("inf")), ("penalty", float("nan")),
                                         ("penalty", "0"), ("done", None), ("valid", 2), ("success", "yes")])
def test_checked_step_names_the_field_it_cannot_read(field, value):
    from freshper.trainer.envs.base import checked_step

    env = Doubling()
    env.reset(3)
    good = env.step
    env.step = lambda text: dataclasses.replace(good(text), **{field: value})
    with pytest.raises(ValueError, match=rf"^Doubling.step returned StepResult.{field}=.* in turn 1 of its episode"):
        checked_step(env, "6")
    env.reset(3)
    env.step = good
    assert checked_step(env, "6").reward == 1.0


@pytest.mark.parametrize("over,msg", [
    ({"env.kwargs": "{size: 3}"}, "'size' is not a keyword of Doubling; it takes limit, prize"),
    ({"env.kwargs": "{limit: many}"}, "env.kwargs: limit must be an integer"),
    ({"env.kwargs": "{limit: 7"}, "env.kwargs must be a YAML mapping"),
    ({"env.digits": 2}, "env.digits=2 is not an option of env.name="),
    ({"env.name": f"{HERE}:Nowhere"}, "has no 'Nowhere'"),
    ({"env.name": "tests.trainer.no_such_module:Doubling"}, "cannot import"),
    ({"env.name": f"{HERE}:last_number_reward"}, "is not a subclass of"),
])
def test_your_environments_options_are_checked_like_the_built_in_ones(over, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        C.load("tiny", None, {"env.name": f"{HERE}:Doubling", **over})


def test_env_kwargs_is_refused_for_a_built_in_environment():
    with pytest.raises(ValueError, match="env.kwargs=.* is not an option of env.name='math'"):
        C.load("math-cpu", None, {"env.kwargs": "{limit: 3}"})


def test_a_dataset_with_a_reward_function_trains(tmp_path):
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(20)))
    argv = ["train", *TINY, "--env.name", "math", "--env.data", str(data), "--env.reward",
            f"{HERE}:last_number_reward", "--train.run_dir", str(tmp_path), "--train.name", "data"]
    assert main(argv) == 0
    rows = [json.loads(x) for x in (tmp_path / "data" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    from freshper.trainer.envs import make_env

    env = make_env("math", data=str(data), reward=f"{HERE}:last_number_reward")
    env.reset(3)
    assert env.step(env.answer).reward == 0.5  # the function's value, not a scorer's 1
    env.reset(3)
    assert env.step(f"so it is \\boxed{{{env.answer}}}").reward == 0.0  # a scorer would pay this
    with pytest.raises(ValueError, match="has no 'nope'"):
        make_env("math", reward=f"{HERE}:nope")


def nan_reward(reply: str, answer: str) -> float:
    return float("nan") if "7" in reply else 1.0


def three_args(reply: str, answer: str, extra: str) -> float:
    return 0.0


def trl_reward(completions, answer, **kwargs) -> list[float]:
    """TRL's form: one call for the batch, the dataset's columns as keywords."""
    trl_reward.calls += 1
    return [3.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]


trl_reward.calls = 0


def test_a_non_finite_reward_is_refused_at_the_reply_that_gave_it():
    from freshper.trainer.envs import make_env

    env = make_env("math", digits=1, reward=f"{HERE}:nan_reward")
    env.reset(0)
    assert env.step("8").reward == 1.0
    env.reset(0)
    with pytest.raises(ValueError, match=r"env.reward .*nan_reward' returned nan for the reply 'it is 7'"):
        env.step("it is 7")


def test_a_reward_function_of_neither_form_fails_at_start_up(tmp_path, caplog, monkeypatch):
    from freshper.trainer.train import loop

    monkeypatch.setattr(loop, "load_policy", lambda *a: pytest.fail("the model was loaded before the refusal"))
    argv = ["train", *TINY, "--env.name", "math", "--env.reward", f"{HERE}:three_args", "--train.run_dir",
            str(tmp_path)]
    assert main(argv) == 2
    assert re.search(r"takes neither f\(reply, answer\) -> float nor TRL's", caplog.text)


def test_trls_batched_reward_is_called_once_per_batch_with_a_declared_success_threshold(tmp_path):
    """Rewards of 0 or 3: with env.success_at 3 a right reply counts as solved; at the default 1.0
    every reward of 3 would count too, so this checks the threshold is the declared one."""
    from freshper.trainer.envs import make_env
    from freshper.trainer.envs.math import Math

    envs = [make_env("math", digits=1, reward=f"{HERE}:trl_reward", success_at=3.0) for _ in range(4)]
    for i, e in enumerate(envs):
        e.reset(i)
    texts = [envs[0].answer, "wrong", envs[2].answer, "no"]
    trl_reward.calls = 0
    Math.score_batch(envs, texts)
    results = [e.step(t) for e, t in zip(envs, texts)]
    assert trl_reward.calls == 1
    assert [r.reward for r in results] == [3.0, 0.0, 3.0, 0.0]
    assert [r.success for r in results] == [True, False, True, False]
    high = make_env("math", digits=1, reward=f"{HERE}:trl_reward", success_at=4.0)
    high.reset(0)
    Math.score_batch([high], [high.answer])
    assert not high.step(high.answer).success
    argv = ["train", *TINY[:-1], "0", "--env.name", "math", "--env.reward", f"{HERE}:trl_reward",
            "--env.success_at", "3", "--train.run_dir", str(tmp_path), "--train.name", "trl"]
    assert main(argv) == 0  # the first run also builds the tiny model's tokenizer, which plays random replies
    trl_reward.calls = 0
    assert main(argv[:-1] + ["trl2"]) == 0
    assert trl_reward.calls == 2  # one rollout an iteration, one call each (validation is off in tiny)


@pytest.mark.parametrize("over,msg", [
    ({"env.held_out": 0.005}, "holds out none of the 100 problems"),
    ({"env.held_out": 0.9999}, "holds out all 100 problems"),
])
def test_a_held_out_fold_that_cannot_exist_fails_at_start_up(tmp_path, over, msg, caplog, monkeypatch):
    from freshper.trainer.train import loop

    monkeypatch.setattr(loop, "load_policy", lambda *a: pytest.fail("the model was loaded before the refusal"))
    argv = ["train", *TINY, "--env.name", "math", "--env.digits", "1", "--train.run_dir", str(tmp_path)]
    for k, v in over.items():
        argv += [f"--{k}", str(v)]
    assert main(argv) == 2
    assert msg in caplog.text


def test_held_out_with_data_is_refused(tmp_path):
    from freshper.trainer.envs import make_env

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{i}?", "answer": str(i)}) + "\n" for i in range(20)))
    with pytest.raises(ValueError, match="with data the split is eval_data"):
        make_env("math", data=str(data), held_out=0.3)


def test_the_tiny_models_cache_tells_users_classes_and_keywords_apart():
    """The tiny model's tokenizer is trained on the environment's own text: another class, or other
    keywords of the same class, get another cached model."""
    from freshper.trainer.model.load import tiny_model_dir

    base = C.load("tiny", None, {"env.name": f"{HERE}:Doubling"})
    other = C.load("tiny", None, {"env.name": f"{HERE}:Doubling", "env.kwargs": "{limit: 7}"})
    assert tiny_model_dir(base) != tiny_model_dir(other) != tiny_model_dir(C.load("tiny"))


def test_a_users_class_leaves_the_built_in_registry_as_it_was():
    """A user's class is found by its path without joining ENVS, whose names are the built-ins the
    config declares (it used to register there, so later tests saw one environment too many)."""
    from freshper.trainer.envs import ENVS, env_class

    before = dict(ENVS)
    assert env_class(f"{HERE}:Doubling") is Doubling
    assert env_class(f"{HERE}:Doubling") is Doubling  # imported once, then cached
    assert ENVS == before
    assert set(ENVS) == set(C.ENV_NAMES)


def short_trl_reward(completions, answer, **kwargs) -> list[float]:
    """TRL's batched form, one value short of the batch."""
    return [0.0] * (len(completions) - 1)


def test_late_errors_end_in_one_line(tmp_path, capsys, monkeypatch):
    """A batched reward of the wrong length: one `freshper train:` line naming the function, no
    traceback, whether it surfaces at start-up (building the tiny model's tokenizer plays replies)
    or mid-run in the rollout (it was a BadReward traceback there). A max_len too
    short for the first turn is refused before the model loads (it was a traceback from the
    rollout, after the model was built)."""
    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))  # no tiny model built yet: start-up first
    argv = ["train", *TINY[:-1], "0", "--env.name", "math", "--env.reward", f"{HERE}:short_trl_reward",
            "--train.run_dir", str(tmp_path), "--train.name"]
    for when in ("start-up", "mid-run"):  # the second finds the tiny model's tokenizer built
        assert main(argv + [when]) == 2
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert "Traceback" not in err and "freshper train: " in last
        assert re.search(r"short_trl_reward' returned \d+ rewards for \d+ completions", last), last
        if when == "start-up":  # build the tokenizer with a reward that works
            good = [f"{HERE}:trl_reward" if a.endswith(":short_trl_reward") else a for a in argv]
            assert main(good + ["built"]) == 0
    assert "error in iteration 0" in last
    assert main(["train", *TINY, "--rollout.max_len", "50", "--train.run_dir", str(tmp_path),
                 "--train.name", "long"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "rollout.max_len=50 cannot hold even the first turn" in err
    assert " on cpu, " not in err, "refused before the model loaded"

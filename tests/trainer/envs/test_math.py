"""The math environment: the scorer's equivalences and robustness, data loading, held-out problems."""
import json

import pytest

from freshper.trainer import config
from freshper.trainer.envs import make_env
from freshper.trainer.envs.base import EVAL_SEED_BASE
from freshper.trainer.envs.math import SCORERS, last_boxed, score


@pytest.mark.parametrize("response,answer", [
    ("so \\boxed{0.5}", "1/2"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{\\dfrac12}", "\\frac{1}{2}"),
    ("The answer is \\boxed{12}.", "12"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("first \\boxed{3}, then corrected: \\boxed{7}", "7"),  # the last box counts
    ("the final answer is 42", "42"),  # no box: math-verify's own final-answer extraction
    ("\\boxed{12}", "We add them... so the total is \\boxed{12}."),  # a full solution as the reference
])
def test_equivalent_answers_score_one(response, answer):
    assert score(response, answer) == 1.0


@pytest.mark.parametrize("response,answer", [
    ("\\boxed{0.6}", "1/2"),
    ("\\boxed{7}, no wait \\boxed{3}", "7"),  # the last box is 3
    ("", "5"),
    ("I do not know.", "5"),
    ("\\boxed{", "5"),
    ("\\boxed{}", "5"),
    ("}}}{{{\\boxed{{{", "5"),
])
def test_wrong_or_missing_answers_score_zero(response, answer):
    assert score(response, answer) == 0.0


@pytest.mark.parametrize("scorer", list(SCORERS))
def test_adversarial_replies_score_zero_or_one(scorer):
    huge = "\\boxed{" + "+".join(["x^{99999}"] * 5000) + "}"
    nested = "\\boxed{" + "\\frac{" * 300 + "1" + "}{2}" * 300 + "}"
    junk = "\\boxed{9" + "9" * 100_000 + "}"
    for bad in (huge, nested, junk, "\x00\\boxed{1}\x00", None, 12):
        assert score(bad, "1", scorer) in (0.0, 1.0)
    assert score("\\boxed{1}", None, scorer) == 0.0


# (reply, answer, verify: the authors' rule, boxed, last-number): where the three rules part
SCORER_CASES = [
    ("What is 5 + 6", "11", 1.0, 1.0, 0.0),  # restating the question: math-verify reads it as 11
    ("9 + 7 = 16", "16", 1.0, 1.0, 1.0),
    ("12 + 35 = 50\n\nThis is", "47", 0.0, 0.0, 0.0),
    ("\\boxed{5} ... \\boxed{7}", "7", 0.0, 1.0, 1.0),  # the authors' rule reads the first box
    ("\\boxed {9}", "9", 0.0, 1.0, 1.0),
    ("\\boxed{" + "1" * 301 + "}", "1" * 301, 1.0, 0.0, 0.0),  # a box over 300 characters
    ("The sum is 47.<|im_end|>", "47", 1.0, 1.0, 1.0),
]


@pytest.mark.parametrize("reply,answer,verify,boxed,last", SCORER_CASES)
def test_the_three_scorers(reply, answer, verify, boxed, last):
    assert (score(reply, answer, "verify"), score(reply, answer, "boxed"),
            score(reply, answer, "last-number")) == (verify, boxed, last)


def test_the_config_names_every_scorer():
    assert config.MATH_SCORERS == tuple(SCORERS)


def test_only_the_boxed_scorer_charges_the_format_penalty():
    for scorer, penalty in (("verify", 0.0), ("boxed", -0.15), ("last-number", 0.0)):
        env = make_env("math", digits=1, scorer=scorer)
        env.reset(3)
        r = env.step(f"It is {env.answer}.")
        assert r.reward == 1.0 and r.penalty == penalty and env.metrics() == {"score_errors": 0.0}


def test_a_scorer_error_is_counted_and_a_batch_of_errors_stops_the_run(monkeypatch, tmp_path):
    from freshper.trainer.envs import math as M
    from freshper.trainer.train.loop import Trainer

    def broken(response, answer):
        raise KeyError("a scorer bug")

    monkeypatch.setitem(M.SCORERS, "last-number", (broken, False))
    env = make_env("math", digits=1, scorer="last-number")
    env.reset(0)
    r = env.step("\\boxed{3}")
    assert r.reward == 0.0 and env.metrics() == {"score_errors": 1.0}
    cfg = config.load("math-cpu", None, {"env.scorer": "last-number", "train.iterations": 1, "rollout.episodes": 4,
                                         "rollout.group_size": 2, "model.tiny_hidden": 64, "model.tiny_layers": 1,
                                         "train.sft_steps": 0, "eval.every": 0, "train.progress": False})
    with pytest.raises(RuntimeError, match="scorer raised on every one of the 4 replies"):
        Trainer(cfg, tmp_path / "run").run()


def test_last_boxed_balances_braces():
    assert last_boxed("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{1} \\boxed {2}") == "2"
    assert last_boxed("none") is None and last_boxed("\\boxed{open") is None


def test_procedural_problems_seeded_and_covering_the_task():
    env = make_env("math", digits=1)
    assert len({env.reset(s) for s in range(2000)}) == 100
    assert len({env.reset(EVAL_SEED_BASE + s) for s in range(2000)}) == 100
    assert make_env("math", digits=2).reset(5) == env.__class__(digits=2).reset(5)
    env.reset(7)
    q, a = env.question, env.answer
    x, y = (int(t) for t in q.removeprefix("What is ").removesuffix("?").split(" + "))
    assert int(a) == x + y
    r = env.step(f"so the sum is \\boxed{{{a}}}")
    assert (r.reward, r.penalty, r.success, r.done) == (1.0, 0.0, True, True)
    env.reset(7)
    r = env.step("no box here")
    assert (r.reward, r.penalty, r.valid) == (0.0, -0.15, False)
    msgs = env.opening(env.reset(7), 16)
    assert msgs == [{"role": "user", "content": f"{q}\nPlease reason step by step, and put your final answer "
                                                "within \\boxed{}."}]


def test_dataset_files_keys_and_errors(tmp_path):
    rows = [{"question": f"What is {i} times 2?", "solution": f"It is \\boxed{{{2 * i}}}."} for i in range(20)]
    jl = tmp_path / "train.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in rows))
    env = make_env("math", data=str(jl), question_key="question", answer_key="solution")
    assert len(env.train_rows) == 18 and len(env.held_out_rows) == 2
    env.reset(3)
    assert env.question == "What is 3 times 2?" and env.step("\\boxed{6}").reward == 1.0
    env.reset(EVAL_SEED_BASE)
    assert env.question == "What is 18 times 2?"
    import datasets

    pq = tmp_path / "eval.parquet"
    datasets.Dataset.from_list(rows[:3]).to_parquet(str(pq))
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    env = make_env("math", data=str(saved), eval_data=str(pq), question_key="question", answer_key="solution")
    assert len(env.train_rows) == 20 and len(env.held_out_rows) == 3
    with pytest.raises(ValueError, match="env.question_key='problem' is not a column"):
        make_env("math", data=str(jl))
    with pytest.raises(ValueError, match="does not exist"):
        make_env("math", data=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="env.data"):
        config.load("math-cpu", None, {"env.data": str(tmp_path / "missing.jsonl")})


def test_math_cpu_iteration_reports_avg_and_pass_at_k(tmp_path):
    from freshper.trainer.train.loop import Trainer

    cfg = config.load("math-cpu", None, {"train.iterations": 1, "rollout.episodes": 8, "rollout.group_size": 4,
                                         "eval.every": 1, "eval.episodes": 4, "eval.samples": 3,
                                         "model.tiny_hidden": 64, "model.tiny_layers": 1, "train.sft_steps": 3,
                                         "train.progress": False, "algo.replay_batch": 8})
    rows = Trainer(cfg, tmp_path / "m").run()
    r = rows[0]
    assert r["env_steps"] == 8 and r["turns"] == 1.0
    assert 0 <= r["eval_success"] <= r["eval_pass_at_k"] <= 1
    with pytest.raises(ValueError, match="eval.temperature"):
        config.load("math-cpu", None, {"eval.temperature": 0.0})


def test_held_out_problems_are_disjoint_from_training_by_content():
    """With env.held_out f, no training seed draws a problem validation draws (commuted ones
    included), about f of the distinct problems are held out, and validation covers them."""
    import re

    from freshper.trainer.envs.base import EVAL_SEED_BASE

    env = make_env("math", digits=1, operands=3, held_out=0.2)

    def terms(seed):
        env.reset(seed)
        return tuple(sorted(int(x) for x in re.findall(r"\d+", env.question)))

    train = {terms(s) for s in range(5000)}
    held = {terms(EVAL_SEED_BASE + s) for s in range(2000)}
    assert not train & held
    share = len(held) / len(held | train)
    assert 0.12 < share < 0.28, share  # 220 multisets of three digits: the hash's fraction, within noise
    env.reset(EVAL_SEED_BASE + 7)
    a, b, c = (int(x) for x in re.findall(r"\d+", env.question))
    assert env.answer == str(a + b + c) and env.question.count("+") == 2
    # without the split, validation repeats training problems (the old one-digit a + b)
    plain = make_env("math", digits=1)
    seen = {plain.reset(s) for s in range(2000)}
    assert plain.reset(EVAL_SEED_BASE + 3) in seen


def test_multiplication_and_option_errors():
    env = make_env("math", digits=1, operation="multiply")
    env.reset(11)
    import re

    a, b = (int(x) for x in re.findall(r"\d+", env.question))
    assert "*" in env.question and env.answer == str(a * b)
    for kw, msg in [({"operation": "divide"}, "operation must be one of"), ({"operands": 5}, "operands must be"),
                    ({"held_out": 1.0}, "held_out must be")]:
        with pytest.raises(ValueError, match=msg):
            make_env("math", **kw)


def test_a_small_held_out_fold_is_enumerated():
    from freshper.trainer.envs.math import held_out_list

    fold = held_out_list((10, 10), 0.3)
    assert len(fold) == 31 and len(set(fold)) == 31
    env = make_env("math", digits=1, operation="multiply", held_out=0.3)
    questions = [env.reset(EVAL_SEED_BASE + i) for i in range(31)]
    assert len(set(questions)) == 31 and env.reset(EVAL_SEED_BASE + 31) == questions[0]
    assert held_out_list((1000,) * 3, 0.3) is None and held_out_list((10, 10), 0.0) is None
    env = make_env("math", digits=2, last_digits=1, operation="multiply", held_out=0.3)
    import re

    for i in range(50):
        a, b = (int(x) for x in re.findall(r"\d+", env.reset(EVAL_SEED_BASE + i).split("?")[0]))
        assert a < 100 and b < 10 and env.answer == str(a * b)

"""Single-turn math with a symbolic answer check: procedural arithmetic, or any dataset of problems.

`score(response, answer)` is the reward: 1.0 when the response's answer equals the reference
answer symbolically (math-verify: 1/2 = 0.5 = \\frac{1}{2} = \\dfrac12), else 0.0. The response's
answer is the content of its *last* \\boxed{...}; without a box, math-verify's own final-answer
extraction is tried. The scorer never raises and its time is bounded: inputs are cut to a few
thousand characters, a box to a few hundred, and math-verify's own timeouts apply where they can
(they use signals, so only on the main thread).

Problems come from
- the procedural task (`data` empty): "What is a + b?" with `digits`-digit operands drawn from
  the seed. Validation draws problems from the same distribution with seeds training never
  uses, as the games' validation does; with one digit there are only 100 problems, so it
  measures skill at the task, not generalisation to unseen problems (a tiny model trained
  from scratch does not learn addition itself in minutes; use `data` + `eval_data` for that);
- a dataset (`data`): a local parquet/jsonl/json file or a folder saved by `datasets`, or
  "hub:ORG/NAME" to let `datasets` fetch it on a machine that can; nothing is downloaded
  otherwise. `question_key`/`answer_key` name the columns (the answer may be a full solution
  with a \\boxed{} in it). `eval_data` is the held-out set; without it the last tenth of `data`.
Seeds at or above EVAL_SEED_BASE address the held-out problems.
"""
from __future__ import annotations

import functools
import random
import threading
from pathlib import Path

from .base import EVAL_SEED_BASE, QuestionEnv, StepResult, register

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
_MAX_RESPONSE = 4000  # characters of a response the scorer looks at (its end)
_MAX_BOX = 300  # characters of a boxed answer


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} in `text` (braces balanced), or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = text.find("{", start)
        if i != -1 and text[start + len("\\boxed"):i].strip() == "":
            depth = 0
            for j in range(i, len(text)):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    return text[i + 1:j]
        start = text.rfind("\\boxed", 0, start)
    return None


def _parse(text: str):
    from math_verify import parse

    main = threading.current_thread() is threading.main_thread()
    return parse(text, parsing_timeout=5 if main else None)


def score(response: str, answer: str) -> float:
    """1.0 if `response`'s final answer equals `answer` symbolically, else 0.0; never raises."""
    try:
        from math_verify import verify

        response, answer = str(response)[-_MAX_RESPONSE:], str(answer)[-_MAX_RESPONSE:]
        box = last_boxed(response)
        if box is not None:
            if len(box) > _MAX_BOX:
                return 0.0
            response = f"\\boxed{{{box}}}"
        gold_box = last_boxed(answer)
        gold = _parse(f"\\boxed{{{gold_box}}}" if gold_box is not None else f"${answer}$")
        pred = _parse(response)
        if not gold or not pred:
            return 0.0
        main = threading.current_thread() is threading.main_thread()
        return 1.0 if verify(gold, pred, timeout_seconds=5 if main else None) else 0.0
    except Exception:  # a scorer that raises would end the run over one odd reply
        return 0.0


@functools.lru_cache(maxsize=8)
def load_problems(path: str, question_key: str, answer_key: str) -> tuple[tuple[str, str], ...]:
    """(question, answer) pairs from a local file or saved dataset folder, or "hub:ORG/NAME"."""
    import datasets

    if path.startswith("hub:"):
        ds = datasets.load_dataset(path[4:], split="train")
    else:
        p = Path(path).expanduser()
        if not p.exists():
            raise ValueError(f"env.data: {path} does not exist (a parquet/jsonl/json file, a folder saved by "
                             f"datasets, or hub:ORG/NAME)")
        if p.is_dir():
            ds = datasets.load_from_disk(str(p))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds["train"] if "train" in ds else ds[next(iter(ds))]
        else:
            kind = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}.get(p.suffix)
            if kind is None:
                raise ValueError(f"env.data: {path} has an unknown format; use .parquet, .jsonl, .json or .csv")
            ds = datasets.load_dataset(kind, data_files=str(p), split="train")
    for key, name in ((question_key, "env.question_key"), (answer_key, "env.answer_key")):
        if key not in ds.column_names:
            raise ValueError(f"{name}={key!r} is not a column of {path}; columns: {ds.column_names}")
    if len(ds) == 0:
        raise ValueError(f"env.data: {path} has no rows")
    return tuple((str(q), str(a)) for q, a in zip(ds[question_key], ds[answer_key]))


class BoxedQuestion(QuestionEnv):
    """A single-turn question whose reply boxes its answer (`self.answer`), scored by `score`;
    a reply without a \\boxed{} pays the format penalty."""

    answer = ""

    def step(self, text: str) -> StepResult:
        if self.done:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset()")
        self.turn += 1
        valid = last_boxed(text) is not None
        reward = score(text, self.answer)
        penalty = 0.0 if valid else self.format_penalty
        self.correct = reward == 1.0
        self.done = True
        self.total_reward += reward
        self.total_penalty += penalty
        return StepResult(self.render(), reward, penalty, True, valid, self.correct, {"answer": self.answer})


@register
class Math(BoxedQuestion):
    name = "math"
    instruction = INSTRUCTION

    def __init__(self, max_turns: int = 1, format_penalty: float = -0.15, data: str = "", eval_data: str = "",
                 question_key: str = "problem", answer_key: str = "answer", digits: int = 2):
        super().__init__(1, format_penalty)
        self.digits = digits
        self.train, self.held_out = (), ()
        if data:
            rows = load_problems(data, question_key, answer_key)
            if eval_data:
                self.train, self.held_out = rows, load_problems(eval_data, question_key, answer_key)
            else:
                cut = max(1, len(rows) // 10)
                if len(rows) < 2:
                    raise ValueError(f"env.data: {data} has {len(rows)} row; give env.eval_data or more rows")
                self.train, self.held_out = rows[:-cut], rows[-cut:]
        self.question, self.answer = "", ""
        self.correct = False

    def _procedural(self, seed: int) -> tuple[str, str]:
        """a + b with `digits`-digit operands drawn from `seed`."""
        rng, n = random.Random(seed), 10 ** self.digits
        a, b = rng.randrange(n), rng.randrange(n)
        return f"What is {a} + {b}?", str(a + b)

    def _reset(self, seed: int) -> None:
        if not self.train:
            self.question, self.answer = self._procedural(seed)
        else:
            rows = self.held_out if seed >= EVAL_SEED_BASE else self.train
            base = EVAL_SEED_BASE if seed >= EVAL_SEED_BASE else 0
            self.question, self.answer = rows[(seed - base) % len(rows)]
        self.correct = False

    def opening(self, state: str, max_words: int) -> list[dict]:
        return [{"role": "user", "content": f"{self.question}\n{INSTRUCTION}"}]

    def random_reply(self, rng: random.Random) -> str:
        return f"The answer is \\boxed{{{rng.randrange(2 * 10 ** self.digits)}}}."

"""Single-turn math with a symbolic answer check: procedural arithmetic, or any dataset of problems.

`score(response, answer, scorer)` is the reward: 1.0 when the response's answer equals the
reference answer symbolically (math-verify: 1/2 = 0.5 = \\frac{1}{2} = \\dfrac12), else 0.0.
What the response's answer is depends on `scorer` (env.scorer):
- "verify": the authors' code (their math_rule_reward_worker): math-verify over the whole reply,
  no format penalty. It rewards a reply that restates the question ("What is 5 + 6" scores 1
  for 11), which a pretrained policy can learn;
- "boxed": the content of the reply's *last* \\boxed{...}, math-verify's own extraction without
  one, and the format penalty for a reply without a box (a stricter format than the authors');
- "last-number": the last \\boxed{} if any, else the last number the reply writes (the flexible
  extraction of GSM8K-style scorers), no format penalty.
Time is bounded: inputs are cut to a few thousand characters, a box to a few hundred, and
math-verify's own timeouts apply where they can (they use signals, so only on the main thread).

Problems come from
- the procedural task (`data` empty): "What is a + b?" (or `operands` terms, or a product with
  `operation` multiply) with `digits`-digit operands drawn from the seed. With `held_out` 0,
  validation draws problems from the same distribution with seeds training never uses, as the
  games' validation does: with one digit there are only 100 sums, so validation then repeats
  training problems and measures skill at the task, not generalisation. With `held_out` f > 0
  the problem space is split by content: a problem is held out when a hash of its sorted
  operands falls in the fraction f (so "3 + 5" and "5 + 3" are in the same fold); training
  never draws a held-out problem and validation draws only those (a space of at most 100,000
  problems lists its held-out fold: validation seed i takes its i-th problem, so eval.episodes
  equal to the fold's size, which `held_out_list` gives, visits each once);
- a dataset (`data`): a local parquet/jsonl/json file or a folder saved by `datasets`, or
  "hub:ORG/NAME" to let `datasets` fetch it on a machine that can; nothing is downloaded
  otherwise. `question_key`/`answer_key` name the columns (the answer may be a full solution
  with a \\boxed{} in it). `eval_data` is the held-out set; without it the last tenth of `data`.
Seeds at or above EVAL_SEED_BASE address the held-out problems.
"""
from __future__ import annotations

import functools
import logging
import math
import random
import re
import threading
from pathlib import Path

from .base import EVAL_SEED_BASE, QuestionEnv, StepResult, in_fold, register
from .user_reward import BadReward, UserReward

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


def _verify(gold, pred) -> bool:
    from math_verify import verify

    main = threading.current_thread() is threading.main_thread()
    return bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=5 if main else None)


def _gold(answer: str):
    gold_box = last_boxed(answer)
    return _parse(f"\\boxed{{{gold_box}}}" if gold_box is not None else f"${answer}$")


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
# The chat markers a decoded reply may hold; the authors' reward worker strips these three.
_MARKERS = ("<|endoftext|>", "<|im_end|>", "<pad>")


def last_number(text: str) -> str | None:
    """The last number written in `text` ("1,234" and "-3.5" count as one), or None."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def score_verify(response: str, answer: str) -> float:
    """The authors' rule (their math_rule_reward_worker): math-verify between the whole reply and
    `$answer$`, whatever the reply's form. Loose text is parsed for its final expression, so a
    reply that restates the question ("What is 5 + 6") can be scored as its sum."""
    for m in _MARKERS:
        response = response.replace(m, "")
    return 1.0 if _verify(_parse(f"${answer}$"), _parse(response)) else 0.0


def score_boxed(response: str, answer: str) -> float:
    """The last \\boxed{} of the reply against the answer (a full solution's last box, if it has
    one); a reply without a box is read by math-verify's own final-answer extraction."""
    box = last_boxed(response)
    if box is not None:
        if len(box) > _MAX_BOX:
            return 0.0
        response = f"\\boxed{{{box}}}"
    return 1.0 if _verify(_gold(answer), _parse(response)) else 0.0


def score_last_number(response: str, answer: str) -> float:
    """The last \\boxed{} if the reply has one, else the last number it writes, against the
    answer: the flexible extraction of GSM8K-style scorers. Restating the question scores its
    last operand, not its result."""
    box = last_boxed(response)
    if box is not None:
        pred = box if len(box) <= _MAX_BOX else None
    else:
        pred = last_number(response)
    if pred is None:
        return 0.0
    return 1.0 if _verify(_gold(answer), _parse(f"\\boxed{{{pred}}}")) else 0.0


# env.scorer: the reward rule, and whether a reply without \boxed{} pays the format penalty
SCORERS = {"verify": (score_verify, False), "boxed": (score_boxed, True), "last-number": (score_last_number, False)}


def score(response: str, answer: str, scorer: str = "boxed") -> float:
    """1.0 if `response`'s final answer equals `answer` symbolically under `scorer`, else 0.0.
    Inputs are cut to their last few thousand characters. Errors inside the scorer propagate:
    the environment counts them (a silent 0 would train on a scorer bug)."""
    if scorer not in SCORERS:
        raise ValueError(f"scorer must be one of {tuple(SCORERS)}, got {scorer!r}")
    if response is None or answer is None:
        return 0.0
    response, answer = str(response)[-_MAX_RESPONSE:], str(answer)[-_MAX_RESPONSE:]
    return SCORERS[scorer][0](response, answer)


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
    """A single-turn question with a reference answer (`self.answer`), scored by `score` under
    `self.scorer`; under "boxed" a reply without a \\boxed{} pays the format penalty. A scorer
    that raises scores 0 for that reply and is counted (`metrics()["score_errors"]`); the first
    error of a process is logged with its input."""

    answer = ""
    scorer = "boxed"
    reward_fn = None  # env.reward: a user's function (user_reward.UserReward), in place of the scorer
    success_at = 1.0  # env.success_at: a reply with at least this reward counts as solved
    score_error = False
    _scored = None  # this turn's reward, scored with the batch (score_batch), or None

    @classmethod
    def score_batch(cls, envs: list, texts: list[str]) -> None:
        """Score one batch of replies in one call where env.reward is TRL's batched form (the
        rollout calls this before stepping each env); otherwise each step scores its own reply."""
        fn = envs[0].reward_fn if envs else None
        if fn is None or not fn.batched:
            return
        try:
            rewards, error = fn.batch(texts, [e.answer for e in envs], [e.question for e in envs]), None
        except BadReward:
            raise
        except Exception as e:  # as a per-reply scorer's error: every reply of the batch scores 0, counted
            rewards, error = [0.0] * len(envs), e
            _log_first_error(e, texts[0], envs[0].answer)
        for env, r in zip(envs, rewards):
            env._scored = (r, error is not None)

    def step(self, text: str) -> StepResult:
        if self.done:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset()")
        self.turn += 1
        penalised = SCORERS[self.scorer][1] and self.reward_fn is None
        valid = last_boxed(text) is not None
        if self._scored is not None:
            (reward, self.score_error), self._scored = self._scored, None
        else:
            try:
                fn = self.reward_fn
                if fn is None:
                    reward = score(text, self.answer, self.scorer)
                else:  # a batched function not handed the batch (the warm start steps alone): a batch of one
                    reward = fn.batch([text], [self.answer], [self.question])[0] if fn.batched else \
                        fn.one(text, self.answer)
                self.score_error = False
            except BadReward:
                raise
            except Exception as e:  # counted and logged, not hidden: see metrics()
                reward, self.score_error = 0.0, True
                _log_first_error(e, text, self.answer)
        penalty = 0.0 if valid or not penalised else self.format_penalty
        self.correct = reward >= self.success_at
        self.done = True
        return StepResult(self.render(), reward, penalty, True, valid, self.correct, {"answer": self.answer})

    def metrics(self) -> dict:
        """Per episode: whether its reply's scoring raised (the rollout averages it per batch)."""
        return {"score_errors": float(self.score_error)}


_logged = []


def _log_first_error(e: Exception, response: str, answer: str) -> None:
    if not _logged:
        _logged.append(e)
        logging.getLogger("freshper").error("the math scorer raised %s: %s on reply %r, answer %r (scored 0; counted "
                                            "in score_errors)", type(e).__name__, e, response[:300], answer)


# env.operation: its sign in the question and how the answer folds the terms
OPERATIONS = {"add": ("+", sum), "multiply": ("*", math.prod)}


def is_held_out(terms: list[int], fraction: float) -> bool:
    """Whether a procedural problem is in the held-out fold: a fixed hash of its sorted operands
    (commuted problems share a fold), a fraction `fraction` of all problems."""
    return in_fold(",".join(map(str, sorted(terms))), fraction)


ENUMERATED = 100_000  # problem spaces up to this size list their held-out fold


@functools.lru_cache(maxsize=16)
def held_out_list(sizes: tuple[int, ...], fraction: float) -> tuple[tuple[int, ...], ...] | None:
    """Every problem of the held-out fold, operand i in range(sizes[i]), in a fixed shuffled order
    (seed 0); None when there is no split or the space has more than ENUMERATED problems (then
    validation draws at random).
    With one-digit operands the fold has a few dozen problems: eval.episodes = its length visits
    each once."""
    import itertools

    if not fraction or math.prod(sizes) > ENUMERATED:
        return None
    fold = [t for t in itertools.product(*(range(n) for n in sizes)) if is_held_out(list(t), fraction)]
    random.Random(0).shuffle(fold)
    return tuple(fold)


@register
class Math(BoxedQuestion):
    name = "math"
    instruction = INSTRUCTION

    OPTIONS = {"format_penalty": "format_penalty", "data": "data", "eval_data": "eval_data",
               "question_key": "question_key", "answer_key": "answer_key", "digits": "digits", "scorer": "scorer",
               "operands": "operands", "operation": "operation", "held_out": "held_out",
               "last_digits": "last_digits", "reward": "reward", "success_at": "success_at"}

    def __init__(self, max_turns: int = 1, format_penalty: float = -0.15, data: str = "", eval_data: str = "",
                 question_key: str = "problem", answer_key: str = "answer", digits: int = 2, scorer: str = "boxed",
                 operands: int = 2, operation: str = "add", held_out: float = 0.0, last_digits: int = 0,
                 reward: str = "", success_at: float = 1.0):
        super().__init__(1, format_penalty)
        if scorer not in SCORERS:
            raise ValueError(f"scorer must be one of {tuple(SCORERS)}, got {scorer!r}")
        if operation not in OPERATIONS:
            raise ValueError(f"operation must be one of {tuple(OPERATIONS)}, got {operation!r}")
        if not 2 <= operands <= 4:
            raise ValueError(f"operands must be in [2, 4], got {operands!r}")
        if not 0 <= held_out < 1:
            raise ValueError(f"held_out must be in [0, 1), got {held_out!r}")
        if not 0 <= last_digits <= 9:
            raise ValueError(f"last_digits must be in [0, 9] (0: digits), got {last_digits!r}")
        self.digits, self.scorer, self.operands, self.operation, self.held_out_frac = (
            digits, scorer, operands, operation, held_out)
        self.last_digits = last_digits
        if not math.isfinite(success_at):
            raise ValueError(f"success_at must be a finite number, got {success_at!r}")
        self.success_at = success_at
        if reward:
            self.reward_fn = UserReward(reward)
        self.train_rows, self.held_out_rows = (), ()
        if held_out and data:
            raise ValueError(f"held_out={held_out} splits procedural problems by content; with data the split is "
                             f"eval_data, or else the last tenth of data (give held_out 0)")
        if held_out and not data:
            self._check_fold(held_out)
        if data:
            rows = load_problems(data, question_key, answer_key)
            if eval_data:
                self.train_rows, self.held_out_rows = rows, load_problems(eval_data, question_key, answer_key)
            else:
                cut = max(1, len(rows) // 10)
                if len(rows) < 2:
                    raise ValueError(f"env.data: {data} has {len(rows)} row; give env.eval_data or more rows")
                self.train_rows, self.held_out_rows = rows[:-cut], rows[-cut:]
        self.question, self.answer = "", ""
        self.correct = False

    def _check_fold(self, fraction: float) -> None:
        """Both folds of the split by content hold problems (else drawing from the empty one would
        never end): refused here, with the fold's size."""
        sizes = self._sizes()
        total = math.prod(sizes)
        quota = round(fraction * 10_000)  # is_held_out's share, in 1/10,000ths of the hash space
        listed = held_out_list(sizes, fraction)
        n = len(listed) if listed is not None else (0 if quota == 0 else total if quota >= 10_000 else None)
        if n == 0:
            raise ValueError(f"held_out={fraction} holds out none of the {total} problems: validation would "
                             f"wait for one forever; raise it, or give 0 for no split")
        if n == total:
            raise ValueError(f"held_out={fraction} holds out all {total} problems and leaves none to train on; "
                             f"lower it")

    def _procedural(self, seed: int) -> tuple[str, str]:
        """`operands` terms of `digits` digits each drawn from `seed`, summed or multiplied; with
        `held_out` > 0, redrawn until the problem is in the fold the seed asks for (training
        seeds: the training fold; seeds >= EVAL_SEED_BASE: the held-out fold)."""
        rng, sizes = random.Random(seed), self._sizes()
        sign, fold = OPERATIONS[self.operation]
        want = seed >= EVAL_SEED_BASE
        listed = held_out_list(sizes, self.held_out_frac) if want else None
        if listed:  # a small held-out fold is enumerated: eval seeds base + i cover it in turn
            terms = list(listed[(seed - EVAL_SEED_BASE) % len(listed)])
        else:
            while True:
                terms = [rng.randrange(n) for n in sizes]
                if not self.held_out_frac or is_held_out(terms, self.held_out_frac) == want:
                    break
        return f"What is {f' {sign} '.join(map(str, terms))}?", str(fold(terms))

    def _sizes(self) -> tuple[int, ...]:
        """How many values each operand takes: 10^digits, the last 10^last_digits if set."""
        last = self.last_digits or self.digits
        return (10 ** self.digits,) * (self.operands - 1) + (10 ** last,)

    def _reset(self, seed: int) -> None:
        if not self.train_rows:
            self.question, self.answer = self._procedural(seed)
        else:
            rows = self.held_out_rows if seed >= EVAL_SEED_BASE else self.train_rows
            base = EVAL_SEED_BASE if seed >= EVAL_SEED_BASE else 0
            self.question, self.answer = rows[(seed - base) % len(rows)]
        self.correct = False

    def opening(self, state: str, max_words: int) -> list[dict]:
        return [{"role": "user", "content": f"{self.question}\n{INSTRUCTION}"}]

    def random_reply(self, rng: random.Random) -> str:
        return f"The answer is \\boxed{{{rng.randrange(2 * 10 ** self.digits)}}}."

"""A user's reward function (env.reward), in either of the two forms users write.

- One call per reply: `f(reply: str, answer: str) -> float`.
- TRL's batched form, one call per batch: `f(completions: list[str], **columns) -> list[float]`,
  called with the keywords `completions`, `prompts` (the questions) and `answer` (the reference
  answers), each a list over the batch, as TRL passes a dataset's columns.

The form is read from the signature when the run starts (a parameter named `completions` means
the batched form), so a function that fits neither fails then, not after a whole rollout. Every
value must be a finite number: NaN or inf would reach the optimizer as a non-finite gradient, so
the reply that produced one is named instead.
"""
from __future__ import annotations

import inspect
import math

from .base import import_object

BATCH_COLUMNS = ("completions", "prompts", "answer")


class BadReward(ValueError):
    """A reward that is not a finite number: refused, never scored as an error of one reply."""


class UserReward:
    def __init__(self, path: str):
        fn = import_object(path, "env.reward")
        if not callable(fn):
            raise ValueError(f"env.reward {path!r} is not callable")
        self.fn, self.path = fn, path
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without a signature: trust the per-reply form
            self.batched = False
            return
        self.batched = "completions" in sig.parameters
        try:
            if self.batched:
                sig.bind(**{k: [] for k in BATCH_COLUMNS})
            else:
                sig.bind("reply", "answer")
        except TypeError as e:
            raise ValueError(f"env.reward {path!r} has the signature {sig}, which takes neither f(reply, answer) -> "
                             f"float nor TRL's f(completions, **columns) -> list[float] with the keywords "
                             f"{', '.join(BATCH_COLUMNS)} ({e})") from None

    def one(self, reply: str, answer: str) -> float:
        """The reward of one reply (the per-reply form)."""
        return self._checked(self.fn(reply, answer), reply)

    def batch(self, replies: list[str], answers: list[str], prompts: list[str]) -> list[float]:
        """The rewards of a batch of replies in one call (the batched form)."""
        out = self.fn(completions=list(replies), prompts=list(prompts), answer=list(answers))
        try:
            out = list(out)
        except TypeError:
            raise BadReward(f"env.reward {self.path!r} (batched: it takes `completions`) returned "
                            f"{type(out).__name__}, not a list of floats") from None
        if len(out) != len(replies):
            raise BadReward(f"env.reward {self.path!r} returned {len(out)} rewards for {len(replies)} completions")
        return [self._checked(v, r) for v, r in zip(out, replies)]

    def _checked(self, value, reply: str) -> float:
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise BadReward(f"env.reward {self.path!r} returned {value!r} for the reply {reply[:200]!r}, not a "
                            f"number") from None
        if not math.isfinite(v):
            raise BadReward(f"env.reward {self.path!r} returned {v} for the reply {reply[:200]!r}: rewards must be "
                             f"finite numbers")
        return v

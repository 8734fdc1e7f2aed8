"""The generation-engine interface the rollout talks to."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class Generation:
    """Per prompt: the sampled token ids (ending with a stop token unless cut at the limit) and
    the engine's log-probability of each under the sampling distribution."""

    token_ids: list[list[int]]
    logprobs: list[list[float]]


@dataclass(frozen=True)
class Sampling:
    """How replies are sampled. temperature 0 is greedy; top_k 0 and top_p 1 switch those
    filters off. The recorded log-probs are those of this (processed) distribution."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def cut_at_stop(tokenizer, ids: list[int], stop: tuple[str, ...]) -> int:
    """How many of the reply `ids` to keep: up to and including the token whose text completes
    the first occurrence of a `stop` string in the reply's text (all of them if none occurs)."""
    def holds(n: int) -> bool:
        text = tokenizer.decode(ids[:n], skip_special_tokens=False)
        return any(s in text for s in stop)

    if not stop or not holds(len(ids)):  # the common case: one decode
        return len(ids)
    # a longer prefix holds whatever a shorter one holds: bisect for the first that does
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(mid) else (mid + 1, hi)
    return lo


class Engine(ABC):
    """Samples responses with per-token log-probs; keeps its weights equal to the trainer's."""

    name = "engine"

    @abstractmethod
    def generate(self, prompts: list[list[int]], max_new_tokens: int, sampling: Sampling,
                 stop: tuple[str, ...] = (), keys: list | None = None) -> Generation:
        """Sample one reply per prompt (token ids) as `sampling` says, with the log-prob of each
        token under that sampling distribution. A reply ends at a stop token, at the token that
        completes one of the `stop` strings (kept, as generated), or at max_new_tokens.
        `keys`: one hashable per prompt naming its episode; an engine may keep what it computed
        for the episode's next, longer prompt until `release(keys)`."""

    def release(self, keys) -> None:
        """Forget what was kept for these episode keys (they ended). A no-op by default."""

    @abstractmethod
    def sync_weights(self, model: torch.nn.Module) -> float:
        """Make the engine's weights equal to `model`'s; returns seconds spent."""

    def sleep(self) -> None:
        """Release generation memory while the trainer runs (no-op unless the engine has any)."""

    def wake(self) -> None:
        """Undo `sleep` before the next rollout."""

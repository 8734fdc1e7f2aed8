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


class Engine(ABC):
    """Samples responses with per-token log-probs; keeps its weights equal to the trainer's."""

    name = "engine"

    @abstractmethod
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float) -> Generation:
        """Sample one response per prompt (token ids), from the full distribution at `temperature`."""

    @abstractmethod
    def sync_weights(self, model: torch.nn.Module) -> float:
        """Make the engine's weights equal to `model`'s; returns seconds spent."""

    def sleep(self) -> None:
        """Release generation memory while the trainer runs (no-op unless the engine has any)."""

    def wake(self) -> None:
        """Undo `sleep` before the next rollout."""


def make_engine(kind: str, model, tokenizer, cfg, device) -> Engine:
    if kind == "hf":
        from .hf import HFEngine

        return HFEngine(model, tokenizer)
    if kind == "vllm":
        from .vllm_engine import VLLMEngine

        return VLLMEngine(model, tokenizer, cfg, device)
    raise ValueError(f"rollout.engine must be 'hf' or 'vllm', got {kind!r}")

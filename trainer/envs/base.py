"""The environment interface, action parsing, and the registry.

Environments are plain Python classes: `reset(seed) -> observation text` and
`step(response text) -> StepResult`. The response must hold one action inside
<answer>...</answer>; anything else is invalid: the state stays, the format penalty is paid,
and the turn counts as a step. Prompts are Markov: each turn's prompt carries the rules, the
turn, the actions left, the current state and the answer format, so a trajectory is a list of
(prompt, response) turns rather than one ever-growing conversation.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

ANSWER_RE = re.compile(r"<answer>\s*([A-Za-z]+)\s*</answer>")


@dataclass
class StepResult:
    observation: str
    reward: float
    done: bool
    valid: bool
    success: bool
    info: dict = field(default_factory=dict)


def parse_action(text: str, actions: tuple[str, ...]) -> str | None:
    """The action named in the first <answer>...</answer> of `text`, case-insensitive, or None."""
    m = ANSWER_RE.search(text)
    if not m:
        return None
    word = m.group(1).lower()
    for a in actions:
        if a.lower() == word:
            return a
    return None


class TextEnv:
    """Base class: subclasses set `name`, `actions`, `rules` and implement `_reset`, `_move`,
    `render`, `solved`, `failed`."""

    name = "env"
    actions: tuple[str, ...] = ()
    rules = ""

    def __init__(self, max_turns: int, format_penalty: float = -0.15):
        if max_turns <= 0:
            raise ValueError(f"max_turns must be > 0, got {max_turns}")
        self.max_turns = max_turns
        self.format_penalty = format_penalty
        self.turn = 0
        self.done = True
        self.total_reward = 0.0

    def reset(self, seed: int) -> str:
        self._reset(seed)
        self.turn = 0
        self.done = False
        self.total_reward = 0.0
        return self.render()

    def prompt(self) -> str:
        """The text the policy sees this turn."""
        left = self.max_turns - self.turn
        return (f"{self.rules}\nTurn {self.turn + 1}, actions left {left}.\nState:\n{self.render()}\n"
                f"Answer with one of {', '.join(self.actions)} as <answer>Action</answer>.\n")

    def step(self, text: str) -> StepResult:
        if self.done:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset()")
        action = parse_action(text, self.actions)
        self.turn += 1
        if action is None:
            reward, valid = self.format_penalty, False
        else:
            reward, valid = self._move(action), True
        success = self.solved()
        self.done = success or self.failed() or self.turn >= self.max_turns
        self.total_reward += reward
        return StepResult(self.render(), reward, self.done, valid, success, {"action": action})


ENVS: dict[str, type] = {}


def register(cls):
    ENVS[cls.name] = cls
    return cls


def make_env(name: str, **kwargs) -> TextEnv:
    if name not in ENVS:
        raise ValueError(f"env must be one of {sorted(ENVS)}, got {name!r}")
    return ENVS[name](**kwargs)

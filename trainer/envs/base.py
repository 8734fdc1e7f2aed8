"""The environment interface, action parsing, and the registry.

Environments are plain Python classes: `reset(seed) -> state text` and
`step(response text) -> StepResult`. The response must name one action inside
<answer>...</answer>; anything else is invalid: the state stays, the turn counts, and the
format penalty is paid. The penalty is kept apart from the environment's reward, as in the
paper's code: the training return adds it, the priority and the reported score do not.
Each environment words its own conversation (`opening`, `feedback`, `random_reply`); the games
use the paper's templates from trainer/envs/prompts.py.
"""
from __future__ import annotations

import math
import numbers
import random
import re
import zlib
from dataclasses import dataclass, field

from .prompts import game_feedback, game_opening

# Seeds from here up address held-out initial states (validation); training draws seeds below it.
EVAL_SEED_BASE = 2**31
# A game with a split redraws until its state falls in the seed's fold: at most this many times,
# after the construction-time probe of FOLD_PROBE seeds found both folds non-empty.
MAX_REDRAWS = 10_000
FOLD_PROBE = 2_000

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Removed from inside an answer before the action is looked up, as the authors' parser does
# (roll/agentic/env/parse_action_utils.py with the games' special_token_list): so
# "<answer><answer>Left</answer>" and "<answer>Left<|im_end|></answer>" are the move Left.
ANSWER_NOISE = ("<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>")


@dataclass
class StepResult:
    observation: str
    reward: float  # the environment's reward, format penalty excluded
    penalty: float  # the format penalty (<= 0) if the answer was invalid, else 0
    done: bool
    valid: bool
    success: bool
    info: dict = field(default_factory=dict)


def checked_step(env, text: str) -> StepResult:
    """env.step(text), which must return a StepResult: what the trainer reads of a turn (reward,
    penalty, done, success) comes from it alone. Anything else (a gymnasium-style tuple) is refused
    in one line naming the method and what it must return; so is a StepResult whose reward or
    penalty is not a finite number, or whose done, valid or success is not a truth value, naming
    the environment, the field and the turn (a None reward would end in a TypeError traceback,
    a nan one in a non-finite gradient norm that blames the learning rate)."""
    r = env.step(text)
    if not isinstance(r, StepResult):
        hint = " (a gymnasium-style tuple?)" if isinstance(r, tuple) else ""
        raise ValueError(f"{type(env).__name__}.step must return freshper.trainer.envs.StepResult(observation, "
                         f"reward, penalty, done, valid, success, info), got {type(r).__name__}{hint}")
    bad = _bad_field(r)
    if bad is not None:
        name, what = bad
        raise ValueError(f"{type(env).__name__}.step returned StepResult.{name}={getattr(r, name)!r} in turn "
                         f"{getattr(env, 'turn', '?')} of its episode: {name} must be {what}")
    return r


def _bad_field(r: StepResult) -> tuple[str, str] | None:
    """(field, what it must be) of the first StepResult field the trainer cannot read, or None."""
    for name in ("reward", "penalty"):
        v = getattr(r, name)
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
            return name, "a finite number"
    for name in ("done", "valid", "success"):
        v = getattr(r, name)
        if not (isinstance(v, (bool, numbers.Integral)) or type(v).__name__ == "bool_") or v not in (0, 1):
            return name, "True or False"
    return None


def parse_action(text: str, actions: tuple[str, ...]) -> str | None:
    """The action named in the first <answer>...</answer> of `text` (case-insensitive, outer
    spaces and the ANSWER_NOISE tags inside ignored), or None."""
    m = ANSWER_RE.search(text)
    if not m:
        return None
    word = m.group(1).strip()
    for tag in ANSWER_NOISE:
        word = word.replace(tag, "").strip()
    word = word.lower()
    for a in actions:
        if a.lower() == word:
            return a
    return None


class TextEnv:
    """Base class: subclasses set `name`, `actions`, `instruction` and implement `_reset`,
    `_move` (-> reward), `_invalid_reward`, `render`, `solved`, `failed`."""

    name = "env"
    actions: tuple[str, ...] = ()
    instruction = ""  # rules, symbol legend and action list: the first user message

    prompt_sets = ("roll",)  # the prompt wordings this environment has (prompts.PROMPTS)
    vision = False  # True: messages show images (a vision-language model's environment)
    # Texts that end a reply (the token completing one is kept): the answer's closing tag, which
    # a pretrained tokenizer spells in several tokens (the tiny model's is one stop token), so a
    # reply ends where its answer does instead of running on to the length limit.
    stop_strings: tuple[str, ...] = ("</answer>",)
    # The env.* config fields this environment takes, each with the constructor keyword it feeds.
    # Any other env.* field set for it is an error naming the field (config.validate).
    OPTIONS: dict[str, str] = {}

    @classmethod
    def config_kwargs(cls, env) -> dict:
        """Constructor keywords from a run config's env section (trainer.config.EnvConfig)."""
        return {kw: getattr(env, name) for name, kw in cls.OPTIONS.items()}

    def __init__(self, max_turns: int, format_penalty: float = -0.15, prompts: str = "roll"):
        if max_turns <= 0:
            raise ValueError(f"max_turns must be > 0, got {max_turns}")
        if prompts not in self.prompt_sets:
            raise ValueError(f"prompts must be one of {self.prompt_sets} for {self.name}, got {prompts!r}")
        self.prompts = prompts
        self.max_turns = max_turns
        self.format_penalty = format_penalty
        self.turn = 0
        self.done = True
        self._folds_checked = False

    split = 0.0  # games: the fraction of initial states, by content, that only validation draws (env.held_out)

    def reset(self, seed: int) -> str:
        """Draw the initial state of `seed`. With a split (env.held_out), a training seed whose state
        falls in the held-out fold (a hash of its first rendering) redraws, and a validation seed
        (>= EVAL_SEED_BASE) redraws until it falls there: the two never share a state."""
        if self.split and not self._folds_checked:
            self.check_folds()
        self._reset(seed)
        if self.split:
            want = seed >= EVAL_SEED_BASE
            for k in range(1, MAX_REDRAWS + 1):
                if in_fold(self.content(), self.split) == want:
                    break
                self._reset(zlib.crc32(f"{seed}/{k}".encode()))  # another state from the same seed, fixed
            else:
                raise RuntimeError(f"held_out={self.split}: no state of the {'held-out' if want else 'training'} "
                                   f"fold after {MAX_REDRAWS} redraws of seed {seed}; the fold is too small")
        self.turn = 0
        self.done = False
        return self.render()

    def check_folds(self) -> None:
        """With a split (env.held_out): ValueError unless both folds hold a state among those that
        FOLD_PROBE fixed seeds draw, giving the folds' sizes as found; a small state space (a 3x3
        board with the start and goal in its corners has 50 boards) can leave a fold empty, and
        drawing from an empty fold would never end. Stops at the first state of each fold."""
        self._folds_checked = True
        if not self.split:
            return
        found: dict[bool, set] = {True: set(), False: set()}
        for s in range(FOLD_PROBE):
            self._reset(zlib.crc32(f"fold-probe/{s}".encode()))
            c = self.content()
            found[in_fold(c, self.split)].add(c)
            if found[True] and found[False]:
                return
        states = len(found[True]) + len(found[False])
        which = "held-out (validation)" if not found[True] else "training"
        raise ValueError(f"held_out={self.split} leaves the {which} fold empty: of the {states} distinct states "
                         f"{FOLD_PROBE} seeds drew, {len(found[True])} are held out and {len(found[False])} are not; "
                         f"{'raise' if not found[True] else 'lower'} env.held_out, or give 0 for no split")

    def content(self) -> str:
        """The state's text as the held-out split hashes it: what the state is, not how it is
        shown (a game's board in any env.grid gives one key)."""
        return self.render()

    def opening(self, state: str, max_words: int) -> list[dict]:
        """The messages before the first reply."""
        return game_opening(self.instruction, state, self.max_turns - self.turn, max_words, self.prompts)

    def feedback(self, result: "StepResult", max_words: int) -> str:
        """The user message after a turn that did not end the episode."""
        return game_feedback(result.reward, self.turn, result.observation, self.max_turns - self.turn, max_words,
                             self.prompts)

    def images(self) -> list:
        """The images (PIL) the latest `opening` or `feedback` shows, one per vision.IMAGE
        placeholder in its text, in order; text environments show none."""
        return []

    def random_reply(self, rng: random.Random) -> str:
        """A well-formed reply with a uniformly random action (format-only warm start, tokenizer corpus)."""
        return f"<answer>{rng.choice(self.actions)}</answer>"

    def solver_reply(self, rng: random.Random) -> str:
        """A well-formed reply with an expert's action (train.sft_replies solver). Only
        environments with a solver define it (the games); `has_solver` says which."""
        raise NotImplementedError(f"{self.name} has no solver: train.sft_replies solver needs one of "
                                  f"{', '.join(solver_envs())}")

    @classmethod
    def has_solver(cls) -> bool:
        return cls.solver_reply is not TextEnv.solver_reply

    def _invalid_reward(self) -> float:
        """Environment reward of a turn whose answer did not parse (the penalty comes on top)."""
        return 0.0

    def step(self, text: str) -> StepResult:
        if self.done:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset()")
        action = parse_action(text, self.actions)
        self.turn += 1
        if action is None:
            reward, penalty, valid = self._invalid_reward(), self.format_penalty, False
        else:
            reward, penalty, valid = self._move(action), 0.0, True
        success = self.solved()
        self.done = success or self.failed() or self.turn >= self.max_turns
        return StepResult(self.render(), reward, penalty, self.done, valid, success, {"action": action})


GRIDS = ("paper", "spaced")  # env.grid: how a game prints its board


class GridGame(TextEnv):
    """A board game whose state is a grid of one-character tiles (FrozenLake, Sokoban). `grid`
    says how the board is printed: paper (rows of adjacent tiles, as the authors' code prints
    them; SmolLM2's tokenizer merges runs such as "___" into one token, so a tile's column is
    not one token's position) or spaced (tiles separated by spaces: one token per tile)."""

    def __init__(self, max_turns: int, format_penalty: float = -0.15, prompts: str = "roll", grid: str = "paper"):
        if grid not in GRIDS:
            raise ValueError(f"grid must be one of {GRIDS}, got {grid!r}")
        super().__init__(max_turns, format_penalty, prompts)
        self.grid = grid

    def tiles(self) -> list[list[str]]:
        """The board, row by row, one symbol per square."""
        raise NotImplementedError

    def render(self) -> str:
        sep = " " if self.grid == "spaced" else ""
        return "\n".join(sep.join(row) for row in self.tiles())

    def content(self) -> str:
        return "\n".join("".join(row) for row in self.tiles())


class QuestionEnv(TextEnv):
    """An environment of questions (math, search): solved when answered right; the state is the
    question itself, and nothing fails."""

    actions = ()
    question, correct = "", False
    stop_strings = ()  # a reply ends at the end of its turn: the scorer reads all of it

    def solved(self) -> bool:
        return self.correct

    def failed(self) -> bool:
        return False

    def render(self) -> str:
        return self.question


def in_fold(text: str, fraction: float) -> bool:
    """Whether a state is in the held-out fold: a fixed hash of its text, a share `fraction`."""
    return zlib.crc32(text.encode()) % 10_000 < round(fraction * 10_000)


def check_split(fraction: float) -> float:
    """A game's env.held_out: in [0, 1), and not so small or large that a fold is empty."""
    if not 0 <= fraction < 1:
        raise ValueError(f"held_out must be in [0, 1), got {fraction!r}")
    if fraction and not 1 <= round(fraction * 10_000) < 10_000:
        raise ValueError(f"held_out={fraction} leaves a fold empty: give at least 0.0001 and below 0.9999, or 0")
    return fraction


def legend(symbols: dict[str, str], actions) -> str:
    """The symbol and action lines the paper's code appends to each instruction."""
    return ("\nThe meaning of each symbol in the state is:\n" + ", ".join(f"{k}: {v}" for k, v in symbols.items())
            + "\nYour available actions are:\n" + ", ".join(actions))


ENVS: dict[str, type] = {}  # the built-in environments, by name; fixed once the package is imported
_IMPORTED: dict[str, type] = {}  # users' classes by "package.module:Class", kept apart so ENVS stays the built-ins


def solver_envs() -> list[str]:
    """The built-in environments with a solver (train.sft_replies solver)."""
    return sorted(name for name, cls in ENVS.items() if cls.has_solver())


def register(cls):
    ENVS[cls.name] = cls
    return cls


def import_object(path: str, what: str):
    """The object at "package.module:name" (a user's environment class or reward function),
    imported; ValueError naming `what` and the path when it cannot be."""
    import importlib

    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{what} {path!r} must look like package.module:name")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise ValueError(f"{what} {path!r}: cannot import {module!r} ({e})") from None
    except AttributeError:
        raise ValueError(f"{what} {path!r}: {module!r} has no {attr!r}") from None
    return obj


def env_class(name: str) -> type:
    """The environment class `name` stands for: a built-in name, or "package.module:Class", a
    TextEnv subclass defined outside this package (imported once per process)."""
    if name in ENVS:
        return ENVS[name]
    if name in _IMPORTED:
        return _IMPORTED[name]
    if ":" not in name:
        raise ValueError(f"env.name must be one of {sorted(ENVS)} or an environment class as "
                         f"package.module:Class, got {name!r}")
    cls = import_object(name, "env.name")
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)):
        raise ValueError(f"env.name {name!r} is not a subclass of freshper.trainer.envs.TextEnv")
    _IMPORTED[name] = cls
    return cls


def make_env(name: str, **kwargs) -> TextEnv:
    return env_class(name)(**kwargs)

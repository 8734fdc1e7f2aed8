"""FrozenLake as in the paper's code: random maps with random start and goal, non-slippery
(env.corners: start top-left and goal bottom-right instead, as gymnasium places them).

Dynamics are gymnasium's FrozenLakeEnv (is_slippery=False). Maps: each tile is frozen with
probability p (0.8), start and goal are drawn uniformly at random and distinct, and a map is
redrawn until the goal is reachable from the start. gymnasium's own `is_valid` searches from
(0, 0) only, which is right for its fixed top-left start but not for a random one, so the
reachability check here starts from S. Reward 1 at the goal; a hole ends the episode; an
invalid answer leaves the state, scores 0 and pays the format penalty.
Symbols: P player, _ frozen, O hole, G goal, X player in a hole, √ player on the goal.
"""
from __future__ import annotations

import random

import numpy as np

from .base import GridGame, check_split, legend, register

ACTIONS = ("Left", "Down", "Right", "Up")  # gymnasium's action ids 0..3
SYMBOLS = {"P": "player", "_": "empty", "O": "hole", "G": "goal", "X": "player in hole", "√": "player on goal"}
MOVES = dict(zip(ACTIONS, ((0, -1), (1, 0), (0, 1), (-1, 0))))  # (row, column) step of each action


def shortest_path(board: np.ndarray, start: tuple[int, int]) -> list[str]:
    """The actions of a shortest hole-free path from `start` to G (breadth-first; ties go to the
    first action in Left, Down, Right, Up order); [] at G or when G cannot be reached."""
    n = board.shape[0]
    back = {start: None}
    queue = [start]
    for r, c in queue:
        if board[r, c] == "G":
            path, at = [], (r, c)
            while back[at] is not None:
                at, action = back[at]
                path.append(action)
            return path[::-1]
        for action, (dr, dc) in MOVES.items():
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < n and 0 <= nxt[1] < n and nxt not in back and board[nxt] != "H":
                back[nxt] = ((r, c), action)
                queue.append(nxt)
    return []


def reachable(board: np.ndarray, start: tuple[int, int]) -> bool:
    """Whether G can be reached from `start` through non-hole tiles."""
    return bool(board[start] == "G") or bool(shortest_path(board, start))


def random_map(size: int, p: float, seed: int, corners: bool = False) -> list[str]:
    """A size x size map of F (frozen), H (hole), one S and one G, with a path from S to G.
    `corners`: S top-left and G bottom-right, as gymnasium's own random maps place them; else
    both drawn at random (the paper's code)."""
    rng = np.random.default_rng(seed)
    while True:
        board = rng.choice(np.array(["F", "H"]), (size, size), p=[p, 1 - p])
        s, g = tuple(rng.integers(size, size=2)), tuple(rng.integers(size, size=2))
        if corners:
            s, g = (0, 0), (size - 1, size - 1)
        if s == g:
            continue
        board[s], board[g] = "S", "G"
        if reachable(board, s):
            return ["".join(row) for row in board]


@register
class FrozenLake(GridGame):
    name = "frozenlake"
    actions = ACTIONS
    instruction = ("You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may move to the "
                   "unintended direction due to the slippery ice. The answer must be one of action in a turn, format "
                   "is <answer>Right</answer>" + legend(SYMBOLS, ACTIONS))

    prompt_sets = ("roll", "replay")

    OPTIONS = {"max_turns": "max_turns", "format_penalty": "format_penalty", "size": "size", "p_frozen": "p",
               "prompts": "prompts", "held_out": "held_out", "corners": "corners", "grid": "grid"}

    def __init__(self, max_turns: int = 10, format_penalty: float = -0.15, size: int = 4, p: float = 0.8,
                 prompts: str = "roll", held_out: float = 0.0, corners: bool = False, grid: str = "paper"):
        super().__init__(max_turns, format_penalty, prompts, grid)
        self.split = check_split(held_out)
        if not 0.0 < p <= 1.0:
            raise ValueError(f"p must lie in (0, 1], got {p}")
        self.size, self.p, self.corners = size, p, corners
        self.gym = None  # gymnasium's FrozenLakeEnv, made at reset

    def _reset(self, seed: int) -> None:
        # imported here: reading a config loads this module (its OPTIONS), not gymnasium
        from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

        self.gym = FrozenLakeEnv(desc=random_map(self.size, self.p, seed, self.corners), is_slippery=False)
        self.gym.reset(seed=seed)

    def _move(self, action: str) -> float:
        _, reward, _, _, _ = self.gym.step(ACTIONS.index(action))
        return float(reward)

    @property
    def pos(self) -> tuple[int, int]:
        return divmod(int(self.gym.s), self.size)

    def tile(self) -> bytes:
        return self.gym.desc[self.pos]

    def solver_reply(self, rng: random.Random) -> str:
        """The next move of a shortest path to the goal, in the answer format (`rng` unused: the
        solver is deterministic)."""
        path = shortest_path(self.gym.desc.astype(str), self.pos)
        if not path:
            raise RuntimeError("frozenlake: no path to the goal from here (in a hole, or at the goal)")
        return f"<answer>{path[0]}</answer>"

    def solved(self) -> bool:
        return self.tile() == b"G"

    def failed(self) -> bool:
        return self.tile() == b"H"

    def tiles(self) -> list[list[str]]:
        rows = []
        for r, row in enumerate(self.gym.desc):
            out = []
            for c, t in enumerate(row):
                if (r, c) == self.pos:
                    out.append({b"H": "X", b"G": "√"}.get(t, "P"))
                else:
                    out.append({b"H": "O", b"G": "G"}.get(t, "_"))
            rows.append(out)
        return rows

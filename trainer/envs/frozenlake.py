"""FrozenLake on random 4x4 maps, non-slippery, as text.

Symbols: P player, _ frozen, O hole, G goal, X player in a hole, √ player on the goal.
The player starts top-left and the goal is bottom-right; each tile other than those two is
frozen with probability p (default 0.8), and a map is redrawn until a path exists. Reward 1 on
reaching the goal, else 0 (plus the format penalty for an unparseable answer).
"""
from __future__ import annotations

import random

from .base import TextEnv, register

MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}


def random_map(size: int, p: float, rng: random.Random) -> list[list[str]]:
    """A size x size map of 'F' (frozen), 'H' (hole), 'S', 'G' with a path from S to G."""
    while True:
        grid = [["F" if rng.random() < p else "H" for _ in range(size)] for _ in range(size)]
        grid[0][0], grid[-1][-1] = "S", "G"
        if _reachable(grid):
            return grid


def _reachable(grid) -> bool:
    n = len(grid)
    seen, stack = {(0, 0)}, [(0, 0)]
    while stack:
        r, c = stack.pop()
        if grid[r][c] == "G":
            return True
        for dr, dc in MOVES.values():
            rr, cc = r + dr, c + dc
            if 0 <= rr < n and 0 <= cc < n and (rr, cc) not in seen and grid[rr][cc] != "H":
                seen.add((rr, cc))
                stack.append((rr, cc))
    return False


@register
class FrozenLake(TextEnv):
    name = "frozenlake"
    actions = tuple(MOVES)
    rules = "FrozenLake. Walk P to G, avoid holes O. Symbols: P player, _ ice, O hole, G goal."

    def __init__(self, max_turns: int = 8, format_penalty: float = -0.15, size: int = 4, p: float = 0.8):
        super().__init__(max_turns, format_penalty)
        if not 0.0 < p <= 1.0:
            raise ValueError(f"p must lie in (0, 1], got {p}")
        self.size, self.p = size, p
        self.grid: list[list[str]] = []
        self.pos = (0, 0)

    def _reset(self, seed: int) -> None:
        self.grid = random_map(self.size, self.p, random.Random(seed))
        self.pos = (0, 0)

    def _move(self, action: str) -> float:
        dr, dc = MOVES[action]
        r, c = self.pos[0] + dr, self.pos[1] + dc
        if 0 <= r < self.size and 0 <= c < self.size:
            self.pos = (r, c)
        return 1.0 if self.solved() else 0.0

    def solved(self) -> bool:
        return self.grid[self.pos[0]][self.pos[1]] == "G"

    def failed(self) -> bool:
        return self.grid[self.pos[0]][self.pos[1]] == "H"

    def render(self) -> str:
        rows = []
        for r, row in enumerate(self.grid):
            out = []
            for c, tile in enumerate(row):
                if (r, c) == self.pos:
                    out.append({"H": "X", "G": "√"}.get(tile, "P"))
                else:
                    out.append({"H": "O", "G": "G"}.get(tile, "_"))
            rows.append("".join(out))
        return "\n".join(rows)

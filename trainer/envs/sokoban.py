"""Sokoban as text, with levels made by reverse play and checked by a solver.

Symbols: # wall, _ empty, O target, √ box on target, X box, P player, S player on target.
Rewards: -0.1 per step, +1 for a box pushed onto a target, -1 for one pushed off, +10 when
solved. A level starts solved (boxes on targets); the player then walks and *pulls* boxes at
random, which only ever reaches states from which the pushes back are possible. A breadth-first
solver confirms the level is unsolved and solvable within the action limit; otherwise the
generator tries again with the next draws of the same seeded stream.
"""
from __future__ import annotations

import random
from collections import deque

from .base import TextEnv, register

MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


def solve(walls, targets, boxes, player, limit: int) -> list[str] | None:
    """Shortest action sequence (at most `limit`) that puts every box on a target, or None."""
    start = (player, frozenset(boxes))
    prev = {start: None}
    queue = deque([(start, 0)])
    while queue:
        (pos, bx), depth = queue.popleft()
        if bx <= targets:
            path = []
            state = (pos, bx)
            while prev[state] is not None:
                state, action = prev[state]
                path.append(action)
            return path[::-1]
        if depth == limit:
            continue
        for action, (dr, dc) in MOVES.items():
            nxt = (pos[0] + dr, pos[1] + dc)
            if nxt in walls:
                continue
            nb = bx
            if nxt in bx:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if beyond in walls or beyond in bx:
                    continue
                nb = (bx - {nxt}) | {beyond}
            state = (nxt, nb)
            if state not in prev:
                prev[state] = ((pos, bx), action)
                queue.append((state, depth + 1))
    return None


def generate(size: int, n_boxes: int, rng: random.Random, max_actions: int, reverse_steps: int = 40,
             inner_walls: int = 2):
    """(walls, targets, boxes, player) of a level solvable in 1..max_actions moves."""
    for _ in range(1000):
        walls = {(r, c) for r in range(size) for c in range(size) if r in (0, size - 1) or c in (0, size - 1)}
        inside = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
        for cell in rng.sample(inside, inner_walls):
            walls.add(cell)
        floor = [p for p in inside if p not in walls]
        if not _connected(floor):
            continue
        cells = rng.sample(floor, n_boxes + 1)
        targets = frozenset(cells[:n_boxes])
        boxes = set(targets)
        player = cells[-1]
        for _ in range(reverse_steps):
            dr, dc = rng.choice(list(MOVES.values()))
            nxt = (player[0] + dr, player[1] + dc)
            if nxt in walls or nxt in boxes:
                continue
            behind = (player[0] - dr, player[1] - dc)
            if behind in boxes and rng.random() < 0.7:  # pull the box along
                boxes.remove(behind)
                boxes.add(player)
            player = nxt
        if boxes == set(targets):
            continue
        path = solve(walls, targets, boxes, player, max_actions)
        if path:
            return walls, targets, frozenset(boxes), player
    raise RuntimeError("no solvable Sokoban level found in 1000 tries; raise max_actions or reverse_steps")


def _connected(floor) -> bool:
    cells = set(floor)
    stack, seen = [floor[0]], {floor[0]}
    while stack:
        r, c = stack.pop()
        for dr, dc in MOVES.values():
            n = (r + dr, c + dc)
            if n in cells and n not in seen:
                seen.add(n)
                stack.append(n)
    return len(seen) == len(cells)


@register
class Sokoban(TextEnv):
    name = "sokoban"
    actions = tuple(MOVES)
    rules = ("Sokoban. Push every box X onto a target O. Symbols: # wall, _ empty, O target, "
             "X box, √ box on target, P player, S player on target.")

    def __init__(self, max_turns: int = 10, format_penalty: float = -0.15, size: int = 6, boxes: int = 1):
        super().__init__(max_turns, format_penalty)
        self.size, self.n_boxes = size, boxes
        self.walls, self.targets, self.boxes, self.player = set(), frozenset(), set(), (0, 0)

    def _reset(self, seed: int) -> None:
        walls, targets, boxes, player = generate(self.size, self.n_boxes, random.Random(seed), self.max_turns)
        self.walls, self.targets, self.boxes, self.player = walls, targets, set(boxes), player

    def _move(self, action: str) -> float:
        dr, dc = MOVES[action]
        nxt = (self.player[0] + dr, self.player[1] + dc)
        reward = -0.1
        if nxt in self.walls:
            return reward
        if nxt in self.boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if beyond in self.walls or beyond in self.boxes:
                return reward
            self.boxes.remove(nxt)
            self.boxes.add(beyond)
            reward += (beyond in self.targets) - (nxt in self.targets)
        self.player = nxt
        if self.solved():
            reward += 10.0
        return reward

    def solved(self) -> bool:
        return self.boxes <= self.targets

    def failed(self) -> bool:
        return False

    def render(self) -> str:
        rows = []
        for r in range(self.size):
            out = []
            for c in range(self.size):
                p = (r, c)
                if p in self.walls:
                    out.append("#")
                elif p == self.player:
                    out.append("S" if p in self.targets else "P")
                elif p in self.boxes:
                    out.append("√" if p in self.targets else "X")
                elif p in self.targets:
                    out.append("O")
                else:
                    out.append("_")
            rows.append("".join(out))
        return "\n".join(rows)

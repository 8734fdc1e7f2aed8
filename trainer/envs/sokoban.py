"""Sokoban as text, with levels generated the way gym-sokoban (and the paper's code) does.

Level generation, per seed:
1. Room topology: a random walk of int(1.7 (w + h)) steps from a random interior cell, turning
   with probability 0.35 per step and carving one of five small 3x3 floor masks at each cell;
   the border stays wall.
2. The player, then `boxes` targets, on random floor cells (boxes start on their targets).
3. Reverse play: a depth-first search (depth `search_depth`, at most 300,000 states) over moves
   in which the player may pull a box it walks away from. Each state scores
   (number of times the pulled box changed) x (sum of Manhattan distances of boxes from their
   targets), and 0 unless every target is uncovered, by boxes and by the player (the paper's
   code counts empty target cells); the best-scoring state is the level. States are told apart
   as the paper's code hashes its room grid: by the player, the boxes and which boxes have been
   pulled at least once (a pulled box is written with another cell value there).
4. Up to 4 topologies are tried for a positive score; then the player takes 1-3 random steps
   (with probability 0.8 when the displacement is 1, else 0.5) so it does not always stand
   next to a box.
Levels are therefore solvable, but not necessarily within the action limit.

Symbols: # wall, _ empty, O target, √ box on target, X box, P player, S player on target.
Rewards (gym-sokoban's): -0.1 per step, +1 for a box pushed onto a target, -1 for one pushed
off, +10 when solved. An invalid answer costs the -0.1 step reward and the format penalty.
"""
from __future__ import annotations

import functools
import random
from collections import deque

from .base import GridGame, check_split, legend, register

MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
SYMBOLS = {"#": "wall", "_": "empty", "O": "target", "√": "box on target", "X": "box", "P": "player",
           "S": "player on target"}
_MASKS = [  # floor cells carved around the walker, offsets from its cell
    [(0, -1), (0, 0), (0, 1)], [(-1, 0), (0, 0), (1, 0)], [(0, -1), (0, 0), (1, 0)],
    [(0, -1), (0, 0), (1, -1), (1, 0)], [(0, 0), (0, 1), (1, 0)],
]
_MAX_STATES = 300_000
SOLVER_LIMIT = 200  # moves searched by solver_reply; generated levels are solved in far fewer


def topology(h: int, w: int, rng: random.Random, p_turn: float = 0.35) -> set[tuple[int, int]]:
    """Floor cells carved by a random walk of int(1.7 (h + w)) steps inside an h x w room."""
    dirs = list(MOVES.values())
    d = rng.choice(dirs)
    r, c = rng.randint(1, h - 1), rng.randint(1, w - 1)
    floor = set()
    for _ in range(int(1.7 * (h + w))):
        if rng.random() < p_turn:
            d = rng.choice(dirs)
        r, c = min(max(r + d[0], 1), h - 2), min(max(c + d[1], 1), w - 2)
        for dr, dc in rng.choice(_MASKS):
            floor.add((r + dr, c + dc))
    return {(a, b) for a, b in floor if 0 < a < h - 1 and 0 < b < w - 1}


def reverse_play(floor, targets, player, search_depth: int):
    """Best (score, player, boxes) reachable from the solved state by moves and pulls."""
    start_boxes = tuple(targets)  # box k starts on target k
    best = (-1, player, start_boxes)
    seen = set()
    stack = [(player, start_boxes, 0, -1, search_depth, 0)]
    while stack and len(seen) < _MAX_STATES:
        pos, boxes, swaps, last, ttl, pulled_ever = stack.pop()
        ttl -= 1
        if ttl <= 0:
            continue
        key = (pos, frozenset((b, bool(pulled_ever >> k & 1)) for k, b in enumerate(boxes)))
        if key in seen:
            continue
        seen.add(key)
        uncovered = pos not in targets and not any(b in targets for b in boxes)
        score = swaps * sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets)) if uncovered else 0
        if score > best[0]:
            best = (score, pos, boxes)
        children = []
        for dr, dc in MOVES.values():
            nxt = (pos[0] + dr, pos[1] + dc)
            if nxt not in floor or nxt in boxes:
                continue
            behind = (pos[0] - dr, pos[1] - dc)
            nb, pulled, ever = boxes, last, pulled_ever
            if behind in boxes:  # walking away from a box pulls it along
                k = boxes.index(behind)
                nb = boxes[:k] + (pos,) + boxes[k + 1:]
                pulled, ever = k, pulled_ever | 1 << k
            children.append((nxt, nb, swaps + (pulled != last), pulled, ttl, ever))
        stack.extend(reversed(children))  # the first move is explored first
    return best


def generate(h: int, w: int, n_boxes: int, rng: random.Random, search_depth: int = 300, tries: int = 4):
    """(floor, targets, boxes, player) of a level, or None if every try scored 0."""
    for _ in range(tries):
        floor = topology(h, w, rng)
        cells = sorted(floor)
        if len(cells) <= n_boxes + 1:
            continue
        player = rng.choice(cells)
        targets = tuple(rng.sample([c for c in cells if c != player], n_boxes))
        score, player, boxes = reverse_play(floor, targets, player, search_depth)
        if score > 0:
            break
    else:
        return None
    # A short random walk, so the player does not always start next to the box it pulled.
    displacement = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets))
    if rng.random() <= (0.8 if displacement == 1 else 0.5):
        visited = [player]
        for _ in range(3):
            options = [(player[0] + dr, player[1] + dc) for dr, dc in MOVES.values()]
            options = [p for p in options if p in floor and p not in boxes and p not in visited]
            if not options:
                break
            player = rng.choice(options)
            visited.append(player)
            if rng.random() > 0.5:
                break
    return floor, frozenset(targets), frozenset(boxes), player


def solve(floor, targets, boxes, player, limit: int) -> list[str] | None:
    """Shortest action sequence (at most `limit`) that puts every box on a target, or None."""
    start = (player, frozenset(boxes))
    prev = {start: None}
    queue = deque([(start, 0)])
    while queue:
        (pos, bx), depth = queue.popleft()
        if bx <= targets:
            path, state = [], (pos, bx)
            while prev[state] is not None:
                state, action = prev[state]
                path.append(action)
            return path[::-1]
        if depth == limit:
            continue
        for action, (dr, dc) in MOVES.items():
            nxt = (pos[0] + dr, pos[1] + dc)
            if nxt not in floor:
                continue
            nb = bx
            if nxt in bx:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if beyond not in floor or beyond in bx:
                    continue
                nb = (bx - {nxt}) | {beyond}
            state = (nxt, nb)
            if state not in prev:
                prev[state] = ((pos, bx), action)
                queue.append((state, depth + 1))
    return None


@functools.lru_cache(maxsize=4096)
def _first_moves(floor: frozenset, targets: frozenset, boxes: frozenset, player) -> tuple[str, ...] | None:
    """`solve` from a state, cached: a warm start plays each board in several episodes (a group's),
    and each episode asks the solver at every state the one before it asked at."""
    path = solve(floor, targets, boxes, player, SOLVER_LIMIT)
    return None if path is None else tuple(path)


@register
class Sokoban(GridGame):
    name = "sokoban"
    actions = ("Up", "Down", "Left", "Right")
    instruction = ("You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. "
                   "When you are right next to a box, you can push it by moving in the same direction. You cannot push "
                   "a box through a wall, and you cannot pull a box. The answer must be one of action in a turn, "
                   "format is <answer>Right</answer>" + legend(SYMBOLS, ("Up", "Down", "Left", "Right")))

    OPTIONS = {"max_turns": "max_turns", "format_penalty": "format_penalty", "size": "size", "boxes": "boxes",
               "search_depth": "search_depth", "held_out": "held_out", "grid": "grid"}

    def __init__(self, max_turns: int = 10, format_penalty: float = -0.15, size: int = 6, boxes: int = 1,
                 search_depth: int = 300, prompts: str = "roll", held_out: float = 0.0, grid: str = "paper"):
        super().__init__(max_turns, format_penalty, prompts, grid)
        self.split = check_split(held_out)
        self.size, self.n_boxes, self.search_depth = size, boxes, search_depth
        self.floor, self.targets, self.boxes, self.player = set(), frozenset(), set(), (0, 0)

    def _reset(self, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(100):  # the same seeded stream draws new topologies: still a function of the seed
            level = generate(self.size, self.size, self.n_boxes, rng, self.search_depth)
            if level is not None:
                break
        else:
            raise RuntimeError(f"no Sokoban level with {self.n_boxes} boxes in a {self.size}x{self.size} room after "
                               f"400 topologies (seed {seed}); use fewer boxes or a larger env.size")
        floor, targets, boxes, player = level
        self.floor, self.targets, self.boxes, self.player = floor, targets, set(boxes), player

    def _invalid_reward(self) -> float:
        return -0.1

    def _move(self, action: str) -> float:
        dr, dc = MOVES[action]
        nxt = (self.player[0] + dr, self.player[1] + dc)
        reward = -0.1
        if nxt not in self.floor:
            return reward
        if nxt in self.boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if beyond not in self.floor or beyond in self.boxes:
                return reward
            self.boxes.remove(nxt)
            self.boxes.add(beyond)
            reward += (beyond in self.targets) - (nxt in self.targets)
        self.player = nxt
        if self.solved():
            reward += 10.0
        return reward

    def solver_reply(self, rng: random.Random) -> str:
        """The next move of a shortest solution from here, in the answer format (`rng` unused:
        the solver is deterministic)."""
        path = _first_moves(frozenset(self.floor), self.targets, frozenset(self.boxes), self.player)
        if not path:
            raise RuntimeError(f"sokoban: no solution within {SOLVER_LIMIT} moves from here (or already solved)")
        return f"<answer>{path[0]}</answer>"

    def solved(self) -> bool:
        return self.boxes <= self.targets

    def failed(self) -> bool:
        return False

    def tiles(self) -> list[list[str]]:
        rows = []
        for r in range(self.size):
            out = []
            for c in range(self.size):
                p = (r, c)
                if p not in self.floor:
                    out.append("#")
                elif p == self.player:
                    out.append("S" if p in self.targets else "P")
                elif p in self.boxes:
                    out.append("√" if p in self.targets else "X")
                elif p in self.targets:
                    out.append("O")
                else:
                    out.append("_")
            rows.append(out)
        return rows

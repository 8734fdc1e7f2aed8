"""Environment rules: symbols, rewards, penalties apart from rewards, level generation."""
import numpy as np
import pytest
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

from freshper.trainer.envs import ENVS, FrozenLake, Sokoban, make_env, parse_action
from freshper.trainer.envs.base import EVAL_SEED_BASE
from freshper.trainer.envs.frozenlake import reachable
from freshper.trainer.envs.sokoban import solve


@pytest.mark.parametrize("reply,want", [
    ("<answer><answer>Left</answer>", "Left"), ("<answer>Left<|im_end|></answer>", "Left"),
    ("<answer><think>Down</think></answer>", "Down"), ("<answer> <|im_start|>up </answer>", "Up"),
    ("<answer>Left Down</answer>", None), ("<answer></answer>", None),
])
def test_parse_action_drops_the_tags_the_authors_parser_drops(reply, want):
    assert parse_action(reply, ("Left", "Down", "Right", "Up")) == want


def test_parse_action():
    acts = ("Left", "Down", "Right", "Up")
    assert parse_action("<answer>down</answer>", acts) == "Down"
    assert parse_action("x <answer> Right </answer> <answer>Up</answer>", acts) == "Right"
    assert parse_action("<answer>Jump</answer>", acts) is None
    assert parse_action("Down", acts) is None
    assert parse_action("<answer>Down", acts) is None


def lake(rows, max_turns=5):
    env = FrozenLake(max_turns=max_turns)
    env.gym = FrozenLakeEnv(desc=rows, is_slippery=False)
    env.gym.reset(seed=0)
    env.turn, env.done = 0, False
    return env


def test_frozenlake_symbols_and_goal():
    env = lake(["FFFF", "FHFF", "FFFF", "FFSG"])
    assert env.render() == "____\n_O__\n____\n__PG"
    r = env.step("<answer>Right</answer>")
    assert (r.reward, r.penalty, r.done, r.success, r.valid) == (1.0, 0.0, True, True, True)
    assert env.render().splitlines()[-1] == "___√"


def test_frozenlake_hole_and_edges():
    env = lake(["SFFF", "HFFF", "FFFF", "FFFG"])
    r = env.step("<answer>Up</answer>")  # off the map: stays
    assert env.pos == (0, 0) and r.reward == 0.0 and not r.done
    r = env.step("<answer>Down</answer>")
    assert r.done and not r.success and r.reward == 0.0
    assert env.render().splitlines()[1][0] == "X"


def test_invalid_answer_keeps_state_counts_and_pays_the_penalty_apart():
    env = lake(["SFFF", "FFFF", "FFFF", "FFFG"])
    before = env.render()
    r = env.step("I go down")
    assert not r.valid and r.reward == 0.0 and r.penalty == -0.15 and env.render() == before and env.turn == 1
    results = [r] + [env.step("<answer>Fly</answer>") for _ in range(4)]
    r = results[-1]
    assert r.done and env.turn == 5 and sum(x.reward for x in results) == 0.0
    assert sum(x.penalty for x in results) == pytest.approx(-0.75)
    with pytest.raises(RuntimeError):
        env.step("<answer>Down</answer>")


def test_frozenlake_maps_random_start_and_goal_reachable_and_seeded():
    env = make_env("frozenlake")
    starts, goals = set(), set()
    for seed in range(200):
        env.reset(seed)
        desc = env.gym.desc.astype(str)
        s = tuple(np.argwhere(desc == "S")[0])
        starts.add(s)
        goals.add(tuple(np.argwhere(desc == "G")[0]))
        assert reachable(desc, s) and env.pos == s
    assert len(starts) > 8 and len(goals) > 8, "start and goal are drawn at random"
    a, b = make_env("frozenlake"), make_env("frozenlake")
    assert a.reset(5) == b.reset(5)
    assert sum(make_env("frozenlake").reset(s) != a.reset(5) for s in range(20)) >= 18
    assert "<answer>Right</answer>" in a.instruction and "P: player" in a.instruction and "Left, Down" in a.instruction


def test_frozenlake_corners_fix_start_and_goal_and_keep_the_holes_random():
    env = make_env("frozenlake", size=3, corners=True)
    maps = set()
    for seed in range(100):
        env.reset(seed)
        desc = env.gym.desc.astype(str)
        assert desc[0, 0] == "S" and desc[2, 2] == "G" and env.pos == (0, 0)
        assert reachable(desc, (0, 0))
        maps.add("".join(desc.ravel()))
    assert len(maps) > 10, "the holes are still drawn at random"
    env.reset(3)
    for a in ("Down", "Down", "Right"):
        assert not env.done
        env.step(f"<answer>{a}</answer>")
    if env.gym.desc[2, 1] != b"H" and env.gym.desc[1, 0] != b"H":
        r = env.step("<answer>Right</answer>")
        assert r.done and env.solved()


def soko(rows):
    env = Sokoban(max_turns=10, size=len(rows))
    env.floor = {(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch != "#"}
    env.targets = frozenset((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "O√S")
    env.boxes = {(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "X√"}
    env.player = next((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "PS")
    env.turn, env.done = 0, False
    return env


def test_sokoban_render_round_trip():
    rows = ["######", "#_P__#", "#_X__#", "#_O√_#", "#____#", "######"]
    assert soko(rows).render() == "\n".join(rows)
    assert soko(["#####", "#S_X#", "#_O_#", "#_√_#", "#####"]).render().splitlines()[1] == "#S_X#"


def test_sokoban_rewards():
    env = soko(["######", "#_P__#", "#_X__#", "#_O__#", "#_XO_#", "######"])
    r = env.step("<answer>Down</answer>")
    assert r.reward == pytest.approx(0.9) and not r.done
    r = env.step("<answer>Down</answer>")  # blocked by the other box
    assert r.reward == pytest.approx(-0.1)
    env = soko(["######", "#_P__#", "#_X__#", "#_O__#", "#____#", "######"])
    r = env.step("<answer>Down</answer>")
    assert r.reward == pytest.approx(-0.1 + 1 + 10) and r.done and r.success
    env = soko(["######", "#_P__#", "#_√__#", "#____#", "#_O__#", "######"])
    r = env.step("<answer>Down</answer>")
    assert r.reward == pytest.approx(-1.1)
    env = soko(["######", "#P___#", "#_X__#", "#_O__#", "#____#", "######"])
    r = env.step("<answer>Up</answer>")  # wall
    assert r.reward == pytest.approx(-0.1) and env.player == (1, 1)
    r = env.step("no answer")  # the step reward, and the format penalty apart
    assert (r.reward, r.penalty, r.valid) == (pytest.approx(-0.1), -0.15, False)


@pytest.mark.parametrize("size,boxes,depth", [(6, 1, 300), (8, 2, 10)])
def test_generated_levels_are_solvable_unsolved_and_seeded(size, boxes, depth):
    lengths = []
    for seed in range(30):
        env = make_env("sokoban", size=size, boxes=boxes, search_depth=depth)
        env.reset(seed)
        assert not env.solved() and not (env.boxes & env.targets), "every target starts uncovered"
        assert all(0 < r < size - 1 and 0 < c < size - 1 for r, c in env.floor), "the border is wall"
        path = solve(env.floor, env.targets, env.boxes, env.player, 60)
        assert path, "reverse play only makes solvable levels"
        lengths.append(len(path))
        if len(path) <= env.max_turns:
            for a in path:
                r = env.step(f"<answer>{a}</answer>")
            assert r.success and r.done
    assert make_env("sokoban", size=size, boxes=boxes).reset(3) == make_env("sokoban", size=size, boxes=boxes).reset(3)
    assert len(set(lengths)) > 2


def test_registry():
    assert set(ENVS) == {"frozenlake", "sokoban", "math", "search", "frozenlake-vlm", "sokoban-vlm", "geoqa"}
    with pytest.raises(ValueError, match="frozenlake"):
        make_env("chess")


def test_reverse_play_scores_a_player_on_a_target_zero_as_the_papers_code():
    """The paper's code scores a search state only when every target cell is empty, so a player
    standing on a target scores 0; before this, such states could be picked as the level."""
    import random

    from freshper.trainer.envs.sokoban import generate, reverse_play, topology

    picked_on_target = 0
    for seed in range(60):  # 8x8 with two boxes: the earlier rule picked such a state 13 times in 200
        rng = random.Random(seed)
        floor = topology(8, 8, rng)
        player, *targets = rng.sample(sorted(floor), 3)
        score, pos, boxes = reverse_play(floor, tuple(targets), player, 300)
        if score > 0:
            picked_on_target += pos in targets
            assert not set(boxes) & set(targets)
    assert picked_on_target == 0
    assert generate(6, 6, 1, random.Random(0)) is not None


@pytest.mark.parametrize("name", ["sokoban", "frozenlake"])
def test_games_split_initial_boards_by_content(name):
    """env.held_out for games: validation seeds draw only boards of the held-out fold, training
    seeds never do, so the two share no board; without the split they do share some (the check
    can fail). held_out 0 leaves every seed's board as it was."""
    from freshper.trainer.envs import make_env
    from freshper.trainer.envs.base import EVAL_SEED_BASE, in_fold

    split, plain = make_env(name, held_out=0.3), make_env(name)
    train = [split.reset(s) for s in range(300)]
    val = [split.reset(EVAL_SEED_BASE + s) for s in range(100)]
    assert not set(train) & set(val)
    assert all(in_fold(b, 0.3) for b in val) and not any(in_fold(b, 0.3) for b in train)
    plain_train = [plain.reset(s) for s in range(300)]
    plain_val = [plain.reset(EVAL_SEED_BASE + s) for s in range(100)]
    if name == "sokoban":  # 6x6 one-box levels repeat often enough to show it in 400 draws
        assert set(plain_train) & set(plain_val), "without the split some boards repeat across the two"
    kept = [t for t, p in zip(train, plain_train) if not in_fold(p, 0.3)]  # seeds whose board needs no redraw
    assert kept == [p for p in plain_train if not in_fold(p, 0.3)]
    with pytest.raises(ValueError, match="leaves a fold empty"):
        make_env(name, held_out=0.00001)


@pytest.mark.parametrize("name", ["sokoban", "frozenlake"])
def test_a_spaced_grid_prints_one_token_per_tile_and_keeps_the_boards_and_the_split(name):
    """env.grid spaced: the same boards, tiles apart by one space; the held-out split hashes the
    board, not its printing, so both printings draw the same training and validation boards."""
    from freshper.trainer.envs.base import EVAL_SEED_BASE

    paper, spaced = make_env(name, held_out=0.3), make_env(name, held_out=0.3, grid="spaced")
    for seed in [*range(40), *range(EVAL_SEED_BASE, EVAL_SEED_BASE + 40)]:
        a, b = paper.reset(seed), spaced.reset(seed)
        assert b == "\n".join(" ".join(row) for row in a.splitlines())
    for env in (paper, spaced):  # after a move too
        env.step("<answer>Up</answer>")
    assert spaced.render() == "\n".join(" ".join(row) for row in paper.render().splitlines())
    with pytest.raises(ValueError, match="grid must be one of"):
        make_env(name, grid="dense")


def _distance(desc: np.ndarray, start: tuple[int, int]) -> int:
    """Moves of a shortest hole-free path from start to G, by breadth-first layers."""
    layer, seen, d = {start}, {start}, 0
    while layer:
        if any(desc[p] == "G" for p in layer):
            return d
        nxt = {(r + dr, c + dc) for r, c in layer for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))}
        layer = {p for p in nxt if 0 <= p[0] < len(desc) and 0 <= p[1] < len(desc) and desc[p] != "H"} - seen
        seen |= layer
        d += 1
    raise AssertionError("unreachable goal")


@pytest.mark.parametrize("size,corners", [(4, False), (3, True)])
def test_the_frozenlake_solver_walks_a_shortest_path_to_the_goal(size, corners):
    """Played through gymnasium's own dynamics, the solver's moves reach the goal in the fewest
    moves possible: a wrong direction table falls into a hole, bumps a wall or goes the long way."""
    import random

    env, rng = make_env("frozenlake", size=size, corners=corners, max_turns=2 * size * size), random.Random(0)
    for seed in range(150):
        env.reset(seed)
        want = _distance(env.gym.desc.astype(str), env.pos)
        while not env.done:
            r = env.step(env.solver_reply(rng))
        assert env.solved() and r.success and env.turn == want, seed


def test_the_sokoban_solver_solves_generated_levels_in_the_fewest_moves():
    import random

    env, rng = make_env("sokoban", max_turns=60), random.Random(0)
    for seed in range(30):
        env.reset(seed)
        want = len(solve(env.floor, env.targets, env.boxes, env.player, 60))
        while not env.done:
            env.step(env.solver_reply(rng))
        assert env.solved() and env.turn == want, seed


def test_only_environments_with_a_solver_take_solver_warm_starts():
    from freshper.trainer import config
    from freshper.trainer.envs.base import solver_envs

    assert solver_envs() == ["frozenlake", "frozenlake-vlm", "sokoban", "sokoban-vlm"]
    config.load("tiny", None, {"train.sft_replies": "solver"})
    with pytest.raises(ValueError, match=r"train.sft_replies='solver' needs an environment with a solver .*"
                                         r"env.name='math'"):
        config.load("math-cpu", None, {"train.sft_replies": "solver"})
    with pytest.raises(ValueError, match="train.sft_replies"):
        config.load("tiny", None, {"train.sft_replies": "expert"})


@pytest.mark.parametrize("held_out,seed", [(0.05, EVAL_SEED_BASE), (0.99, 3)])
def test_an_empty_fold_is_refused_not_waited_for(held_out, seed):
    """3x3 boards with the start and goal in the corners: about 50 boards, none in a 5% fold (and
    none left to train on at 99%). The draw used to loop for ever; now it refuses, naming the fold
    and its size. Bounded by a timeout here, so the old behaviour fails instead of hanging."""
    import threading

    out = {}

    def draw():
        try:
            FrozenLake(size=3, corners=True, held_out=held_out).reset(seed)
            out["result"] = "drew a state"
        except ValueError as e:
            out["result"] = str(e)

    t = threading.Thread(target=draw, daemon=True)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "the draw did not return within 60 s"
    assert "leaves the" in out["result"] and "fold empty" in out["result"] and "0 are" in out["result"]


def test_an_empty_fold_is_refused_at_start_up():
    from freshper.trainer import config

    with pytest.raises(ValueError, match="fold empty"):
        config.load("tiny", None, {"env.size": 3, "env.corners": True, "env.held_out": 0.05})


def test_the_sokoban_solver_is_asked_once_per_state(monkeypatch):
    """Two episodes of one board (a group of a solver warm start) search each state once, and play
    the moves an uncached search gives (it once re-solved the level at every move of every episode)."""
    import random

    import freshper.trainer.envs.sokoban as S

    calls = []
    real = S.solve
    monkeypatch.setattr(S, "solve", lambda *a: calls.append(a) or real(*a))
    S._first_moves.cache_clear()
    moves = []
    for _ in range(2):
        env = Sokoban(max_turns=30, size=6)
        env.reset(5)
        played = []
        while not env.done:
            reply = env.solver_reply(random.Random(0))
            played.append(reply)
            env.step(reply)
        moves.append(played)
    assert moves[0] == moves[1] and env.solved()
    assert len(calls) == len(moves[0]), "each state searched once, the second episode from the cache"
    S._first_moves.cache_clear()
    env = Sokoban(max_turns=30, size=6)
    env.reset(5)
    uncached = []
    while not env.done:
        path = real(env.floor, env.targets, env.boxes, env.player, S.SOLVER_LIMIT)
        uncached.append(f"<answer>{path[0]}</answer>")
        env.step(uncached[-1])
    assert uncached == moves[0]

"""The perception warm start: questions computed from the state, never an action or a reward; the
steps train reading (held-out accuracy rises); the result is cached and shared."""
import random

import pytest
import torch

from freshper.trainer import config
from freshper.trainer.train import perception
from freshper.trainer.train.loop import Trainer


def test_probes_are_computed_from_the_state():
    grid = "_O__\n_P__\n__O_\n___G"
    qa = dict(perception.probes("frozenlake", grid, random.Random(0)))
    assert qa["Where is the player?"] == "row 2, column 2"
    for q, a in qa.items():
        if q.startswith("What is at row"):
            r, c = [int(x) for x in q.removeprefix("What is at row ").rstrip("?").split(", column ")]
            assert grid.split("\n")[r - 1][c - 1] == a
        if q.endswith("the player?") and q.startswith("What is"):
            assert a in "_OG" or a == "edge"
    for seed in range(50):  # every direction, at the edges too
        for q, a in perception.probes("frozenlake", "P_\n__", random.Random(seed)):
            if q in ("What is left of the player?", "What is above the player?"):
                assert a == "edge"
    qs = dict(perception.probes("sokoban", "#####\n#PX_#\n#_O√#\n#####", random.Random(1)))
    assert qs["How many boxes are not on a target?"] == "1"
    spaced = "_ O _ _\n_ P _ _\n_ _ O _\n_ _ _ G"  # env.grid spaced: the same board, the same answers
    for seed in range(20):
        assert perception.probes("frozenlake", spaced, random.Random(seed)) == \
            perception.probes("frozenlake", grid, random.Random(seed))


def test_probes_never_show_an_action_or_a_reward():
    from freshper.trainer.envs import make_env

    env = make_env("frozenlake")
    for chat, answer in perception.examples(env, 10, 40, random.Random(0)):
        text = " ".join(m["content"] for m in chat[1:]).split("State:")[1] + answer
        assert "Reward" not in text and "action" not in text.lower().split("state:")[-1]
        assert answer not in env.actions


def test_warm_start_trains_reading_and_is_cached(tmp_path):
    cfg = config.load("tiny", None, {"train.perception_steps": 30, "train.sft_steps": 0, "train.iterations": 1})
    tr = Trainer(cfg, tmp_path / "p")
    info = __import__("json").loads((tmp_path / "p" / "perception.json").read_text())
    assert info["steps"] == 30 and info["losses"][-1] < 0.7 * info["losses"][0]
    again = Trainer(cfg, tmp_path / "q")  # the same settings: loaded from the cache, identical weights
    assert __import__("json").loads((tmp_path / "q" / "perception.json").read_text())["losses"] == []
    for a, b in zip(tr.model.parameters(), again.model.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="perception_steps is for the games"):
        config.load("math-cpu", None, {"train.perception_steps": 5})


def test_the_cache_key_tells_a_bf16_compute_run_from_a_float32_one():
    from freshper.trainer.train.perception import cache_path

    plain = cache_path("/m/smollm2", 30, 1e-4, 0)
    assert cache_path("/m/smollm2", 30, 1e-4, 0) == plain
    assert cache_path("/m/smollm2", 30, 1e-4, 0, compute="torch.bfloat16") != plain
    assert cache_path("/m/smollm2", 30, 1e-4, 0, compute="torch.float16") != \
        cache_path("/m/smollm2", 30, 1e-4, 0, compute="torch.bfloat16")

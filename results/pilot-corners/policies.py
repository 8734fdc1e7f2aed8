"""What two fixed policies score on FrozenLake 3x3 with the start and goal in the corners and 6
moves (the pilots' game): Down or Right at random, which reads nothing, on the training and the
validation states (1,000 each, drawn as a run draws them). `freshper chance` gives the uniform
policy's figures. Run: python results/pilot-corners/policies.py"""
import random

from freshper.trainer.envs import make_env
from freshper.trainer.envs.base import EVAL_SEED_BASE
from freshper.trainer.train.intervals import rate_ci


def success(first_seed: int, n: int = 1000) -> list[bool]:
    env, rng, out = make_env("frozenlake", size=3, corners=True, max_turns=6, held_out=0.3), random.Random(0), []
    for i in range(n):
        env.reset(first_seed + i)
        while not env.done:
            result = env.step(f"<answer>{rng.choice(('Down', 'Right'))}</answer>")
        out.append(result.success)
    return out


for name, base in (("training", 0), ("validation", EVAL_SEED_BASE)):
    s = success(base)
    print(f"Down or Right at random, {name} states: {sum(s) / len(s):.3f} ± {rate_ci(s)[1]:.3f} (95%)")

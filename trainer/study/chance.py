"""`freshper chance`: what a policy that answers at random scores on a preset's task.

Every success rate in this project is read against this number. The policy replies with a
uniformly random well-formed answer (`env.random_reply`: a random action of the game, a random
number for arithmetic), so it never pays the format penalty; what it scores is what the task
gives away for free (on random FrozenLake maps the goal is often a step or two from the start).

    freshper chance --preset frozenlake [--episodes 1000] [--split train|eval] [--section.field VALUE ...]

Training states are the ones `freshper train` draws for its seed (iteration by iteration, one
episode per initial state); eval states are the validation states (`eval.*`).
"""
from __future__ import annotations

import argparse
import random

SPLITS = ("train", "eval")


def chance(cfg, episodes: int, split: str = "train") -> dict:
    """Mean success and environment reward per episode (format penalty excluded; random replies
    are well formed) of the uniform random-reply policy over `episodes` initial states."""
    from ..config import env_kwargs
    from ..envs import make_env
    from ..envs.base import EVAL_SEED_BASE, checked_step
    from ..train.seeding import group_seeds

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "eval":
        seeds = [EVAL_SEED_BASE + i for i in range(episodes)]
    else:
        groups = max(1, cfg.rollout.episodes // cfg.rollout.group_size)
        seeds, it = [], 0
        while len(seeds) < episodes:
            seeds += group_seeds(cfg.train.seed, it, groups)
            it += 1
        seeds = seeds[:episodes]
    env, rng = make_env(cfg.env.name, **env_kwargs(cfg)), random.Random(cfg.train.seed)
    successes = reward = 0.0
    for s in seeds:
        env.reset(s)
        while True:
            r = checked_step(env, env.random_reply(rng))
            reward += r.reward
            if r.done:
                break
        successes += r.success
    return {"episodes": episodes, "success": successes / episodes, "reward": reward / episodes}


def parser() -> argparse.ArgumentParser:
    """`freshper chance`'s own arguments; the rest are config flags (flags.parse_overrides)."""
    from .. import config as C

    p = argparse.ArgumentParser(prog="freshper chance", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="frozenlake", help=f"one of {list(C.PRESETS)}")
    p.add_argument("--episodes", type=int, default=1000, help="initial states, one episode each")
    p.add_argument("--split", default="train", help=f"one of {SPLITS}")
    return p


def main(argv) -> int:
    from .. import config as C
    from ..flags import parse_overrides

    p = parser()
    args, rest = p.parse_known_args(argv)
    try:
        cfg = C.load(args.preset, None, parse_overrides(rest))
        out = chance(cfg, args.episodes, args.split)
    except ValueError as e:
        p.error(str(e))
    n = out["episodes"]
    half = 1.96 * (out["success"] * (1 - out["success"]) / n) ** 0.5
    print(f"{args.preset} ({cfg.env.name}), random well-formed replies, {n} {args.split} states: "
          f"success {out['success']:.3f} ± {half:.3f} (95%), reward {out['reward']:.3f} per episode")
    return 0

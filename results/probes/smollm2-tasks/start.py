"""The untrained SmolLM2-135M-Instruct on held-out procedural math problems, scored by
last-number (the SmolLM2 preset's scorer), unprocessed sampling (temperature 1, no top-k/top-p).

    python start.py PROBLEMS SAMPLES TOKENS THREADS --env.operands 3 --env.held_out 0.2 ...
"""
import sys
import time

import torch

from freshper.trainer import config
from freshper.trainer.engines import Sampling, make_engine
from freshper.trainer.envs.base import EVAL_SEED_BASE
from freshper.trainer.flags import parse_overrides
from freshper.trainer.model import env_kwargs, load_policy
from freshper.trainer.rollout import rollout

n, k, toks, threads = (int(a) for a in sys.argv[1:5])
torch.set_num_threads(threads)
over = {"model.path": "smollm2-135m", "rollout.max_new_tokens": toks, "rollout.max_len": 160,
        **parse_overrides(sys.argv[5:])}
cfg = config.load("smollm2-135m-math", None, over)
torch.manual_seed(0)
model, tok, _ = load_policy(cfg, torch.device("cpu"))
engine = make_engine("hf", model, tok, cfg, torch.device("cpu"))
t = time.time()
seeds = [EVAL_SEED_BASE + i for i in range(n)]
ep = rollout(engine, tok, "math", env_kwargs(cfg), seeds, k, toks, 160, Sampling(1.0, 1.0, 0))
v = ep.success.float().view(n, k)
half = 1.96 * v.mean(1).std() / n ** 0.5
solved = (v.max(1).values > 0).float().mean()
print(" ".join(sys.argv[5:]), f"avg@{k} {v.mean():.3f} +- {half:.3f} pass@{k} {solved:.3f} gen {time.time() - t:.0f} s")

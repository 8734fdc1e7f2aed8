"""The untrained SmolLM2-135M-Instruct on held-out a + b problems, the same replies scored by each
env.scorer (unprocessed sampling: temperature 1, no top-k / top-p).

    python start.py DIGITS PROBLEMS SAMPLES TOKENS THREADS     # e.g. 1 64 4 32 1
"""
import sys
import time

import torch

from freshper.trainer import config
from freshper.trainer.engines import Sampling, make_engine
from freshper.trainer.envs import make_env
from freshper.trainer.envs.base import EVAL_SEED_BASE
from freshper.trainer.envs.math import SCORERS, score
from freshper.trainer.model import env_kwargs, load_policy
from freshper.trainer.rollout import rollout

digits, n, k, toks = (int(a) for a in sys.argv[1:5])
torch.set_num_threads(int(sys.argv[5]) if len(sys.argv) > 5 else 1)
cfg = config.load("math-cpu", None, {"model.path": "smollm2-135m", "env.digits": digits, "rollout.max_new_tokens": toks,
                                     "rollout.max_len": 160, "env.scorer": "verify"})
torch.manual_seed(0)
model, tok, _ = load_policy(cfg, torch.device("cpu"))
engine = make_engine("hf", model, tok, cfg, torch.device("cpu"))
t = time.time()
seeds = [EVAL_SEED_BASE + i for i in range(n)]
ep = rollout(engine, tok, "math", env_kwargs(cfg), seeds, k, toks, 160, Sampling(1.0, 1.0, 0))
print("gen s", time.time() - t)
env = make_env("math", **env_kwargs(cfg))
res, replies = {s: [] for s in SCORERS}, []
for i in range(len(ep)):
    env.reset(seeds[i // k])
    reply = tok.decode(ep.tokens[i][ep.mask[i]], skip_special_tokens=True)
    replies.append((env.question, env.answer, reply))
    for s in SCORERS:
        res[s].append(score(reply, env.answer, s))
for s in SCORERS:
    v = torch.tensor(res[s]).view(n, k)
    half = 1.96 * v.mean(1).std() / n ** 0.5
    print(s, "avg@k %.3f +- %.3f pass@k %.3f" % (v.mean(), half, (v.max(1).values > 0).float().mean()))
diff = [i for i in range(len(ep)) if res["verify"][i] != res["last-number"][i]]
print("verify != last-number on", len(diff), "of", len(ep))
for i in diff:
    print("  DIFF", *replies[i][:2], repr(replies[i][2]), res["verify"][i], res["last-number"][i])
for q, a, r in replies[:12]:
    print(repr(q), a, repr(r))

"""What `--model.logits_dtype float32` costs on the CPU under bf16: the default job's model and
task (32 replies of up to 32 tokens), one rollout by the HF engine, the log-prob recompute and one
update, each timed 3 times in turn with logits_dtype compute and float32 (same process, same
weights; the update's steps move the weights, which does not change its cost). Median seconds.

    python results/benchmarks/mismatch-sources-cpu-2026-12-06/cost.py            # > cost.txt
    python results/benchmarks/mismatch-sources-cpu-2026-12-06/cost.py --dtypes   # > cost-dtypes.txt

`--dtypes` times float32, bf16 and fp16 compute instead (logits_dtype float32 under both), one
pass each: an fp16 update takes minutes on a CPU without fp16 matmul instructions.
"""
import statistics
import sys
import time

import torch

from freshper.trainer import config
from freshper.trainer.config import env_kwargs
from freshper.trainer.engines.base import Sampling
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.model.load import load_policy
from freshper.trainer.model.policy import Policy
from freshper.trainer.train.rollout import rollout

CPU = torch.device("cpu")


def main():
    torch.set_num_threads(2)
    dtypes = "--dtypes" in sys.argv[1:]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{'float32 masters' if dtypes else 'bf16 compute over float32 masters'}")
    times = {}
    setups = {}
    for logits in (("float32", "bfloat16", "float16") if dtypes else ("compute", "float32")):
        dtype = logits if dtypes else "bfloat16"
        cfg = config.load("smollm2-135m-math", None, {"model.dtype": dtype,
                                                       "model.logits_dtype": "float32" if dtypes else logits,
                                                       "train.sft_steps": 0})
        torch.manual_seed(0)
        model, tok, _ = load_policy(cfg, CPU)
        engine = HFEngine(model, tok, logits32=dtypes or logits == "float32")
        setups[logits] = (cfg, model, tok, Policy(model, cfg, CPU), engine)
    for _ in range(1 if dtypes else 3):
        for logits, (cfg, model, tok, pol, engine) in setups.items():
            r = cfg.rollout
            t0 = time.perf_counter()
            ep = rollout(engine, tok, cfg.env.name, env_kwargs(cfg), list(range(r.episodes // r.group_size)),
                         r.group_size, r.max_new_tokens, r.max_len, Sampling(r.temperature, r.top_p, r.top_k))
            t1 = time.perf_counter()
            old = pol.logprobs(ep.tokens, ep.mask)
            t2 = time.perf_counter()
            adv = torch.randn(ep.tokens.shape)
            pol.update(ep.tokens, ep.mask, old, adv)
            t3 = time.perf_counter()
            for k, v in (("rollout", t1 - t0), ("recompute", t2 - t1), ("update", t3 - t2)):
                times.setdefault((logits, k), []).append(v)
            print(f"{logits}: rollout {t1 - t0:.1f} s, recompute {t2 - t1:.1f} s, update {t3 - t2:.1f} s",
                  file=sys.stderr, flush=True)
    names = list(setups)
    print(f"| part | {' | '.join(f'{n} (s)' for n in names)} | {' | '.join(f'{n} / {names[0]}' for n in names[1:])} |")
    print("|---|" + "---|" * (2 * len(names) - 1))
    for k in ("rollout", "recompute", "update"):
        t = [statistics.median(times[(n, k)]) for n in names]
        print(f"| {k} | {' | '.join(f'{x:.2f}' for x in t)} | {' | '.join(f'{x / t[0]:.2f}' for x in t[1:])} |")


if __name__ == "__main__":
    main()

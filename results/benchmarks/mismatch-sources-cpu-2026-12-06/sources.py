"""Where the bf16 engine/trainer mismatch comes from: the same measurement as
../mismatch-cpu-2026-12-06/mismatch.py (SmolLM2 on the default job's task, 32 replies at
temperature 1 over the whole vocabulary, the HF engine's recorded log-probs against the trainer's
recompute at identical weights), with parts of the model taken out of bf16 on both sides at once:

- bf16: autocast over float32 masters, as `--model.dtype bfloat16` runs (the norms, the residual
  stream and the softmax are float32 already; the matmuls, attention and the LM head are bf16, so
  the logits are rounded to bf16);
- head fp32: the LM head in float32 (float32 logits), the decoder in bf16;
- head + attention fp32: also q/k/v/o and attention in float32 (so the KV cache is float32);
- head + MLP fp32: also the MLPs in float32;
- decoder fp32, head bf16: every decoder layer in float32, only the LM head (and so the logits)
  in bf16;
- float32: no autocast;
- fp16 (autocast in float16 over the same float32 masters), with float32 logits and with logits
  rounded to fp16.

"head fp32" patches both sides by hand (a float32 GEMM on float32 hidden states and weights). The
fix the trainer ships, `--model.logits_dtype float32` (bf16 operands, the float32 accumulator
kept), is measured as "bf16, logits_dtype float32" (the trainer's default under bf16), and
"bf16" is measured with `--model.logits_dtype compute` (logits rounded to bf16, as before).

A part "in float32" runs with autocast off and its floating inputs cast to float32 (its weights
are the float32 masters). Each variant samples its own replies from seed 0.

    python results/benchmarks/mismatch-sources-cpu-2026-12-06/sources.py   # > output.txt
    python results/benchmarks/mismatch-sources-cpu-2026-12-06/sources.py fp16 "fp16, logits_dtype float32"
"""
import contextlib

import torch

from freshper.trainer import config
from freshper.trainer.config import env_kwargs
from freshper.trainer.engines.base import Sampling
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.model import sharding
from freshper.trainer.model.load import load_policy
from freshper.trainer.model.policy import Policy
from freshper.trainer.train.rollout import rollout

CPU = torch.device("cpu")


def _f32(x):
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.float()
    if isinstance(x, tuple):
        return tuple(_f32(v) for v in x)
    return x


def in_float32(module):
    """Run `module`'s forward with autocast off on float32 inputs (in place; for this script)."""
    inner = module.forward

    def forward(*args, **kwargs):
        with torch.autocast("cpu", enabled=False):
            return inner(*_f32(args), **{k: _f32(v) for k, v in kwargs.items()})
    module.forward = forward


VARIANTS = {  # name: (dtype, head in float32, which decoder parts in float32)
    "bf16": ("bfloat16", False, ()),
    "bf16, logits_dtype float32": ("bfloat16", False, ()),
    "head fp32": ("bfloat16", True, ()),
    "head + attention fp32": ("bfloat16", True, ("self_attn",)),
    "head + MLP fp32": ("bfloat16", True, ("mlp",)),
    "decoder fp32, head bf16": ("bfloat16", False, ("self_attn", "mlp")),
    "float32": ("float32", False, ()),
    "fp16, logits_dtype float32": ("float16", False, ()),
    "fp16": ("float16", False, ()),
}


def main():
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; sampling: temperature 1, no top-p or top-k")
    print("| compute | reply tokens | max abs dlogp | mean abs dlogp | ratio p1 | ratio p99 | ratio min | ratio max |")
    print("|---|---|---|---|---|---|---|---|")
    real_compute_dtype = sharding.compute_dtype
    import sys

    chosen = sys.argv[1:] or list(VARIANTS)
    for name in chosen:
        dtype, head32, parts = VARIANTS[name]
        logits = "float32" if "logits_dtype float32" in name else "compute"
        cfg = config.load("smollm2-135m-math", None, {"model.dtype": dtype, "model.logits_dtype": logits,
                                                       "train.sft_steps": 0,
                                                       "rollout.temperature": 1.0, "rollout.top_p": 1.0,
                                                       "rollout.top_k": 0})
        torch.manual_seed(0)
        model, tok, _ = load_policy(cfg, CPU)
        for layer in model.model.layers:
            for part in parts:
                in_float32(getattr(layer, part))
        if head32:
            in_float32(model.lm_head)  # the engine's logits
            sharding.compute_dtype = lambda m: None  # the trainer's head: float32 hidden and weight
        r = cfg.rollout
        engine = HFEngine(model, tok, logits32=logits == "float32")
        ep = rollout(engine, tok, cfg.env.name, env_kwargs(cfg), list(range(r.episodes // r.group_size)),
                     r.group_size, r.max_new_tokens, r.max_len, Sampling(r.temperature, r.top_p, r.top_k))
        pi = Policy(model, cfg, CPU).logprobs(ep.tokens, ep.mask)
        sharding.compute_dtype = real_compute_dtype
        m = ep.mask.clone()
        m[:, 0] = False  # the first position predicts nothing
        d = (pi - ep.engine_logp)[m].double()
        ratio = d.exp()
        q = torch.quantile(ratio, torch.tensor([0.01, 0.99], dtype=torch.float64))
        print(f"| {name} | {int(m.sum())} | {d.abs().max():.2e} | {d.abs().mean():.2e} | {q[0]:.4f} | {q[1]:.4f} | "
              f"{ratio.min():.4f} | {ratio.max():.4f} |", flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()

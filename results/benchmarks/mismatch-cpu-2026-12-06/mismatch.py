"""Engine against trainer log-probs at identical weights, per compute dtype: the mismatch the
ratio pi/mu of an "on-policy" update sees before any update.

The default job's model and task (preset smollm2-135m-math: SmolLM2-135M-Instruct, one-digit
addition, 32 replies of up to 32 tokens), sampled at temperature 1 with no top-p or top-k, so that
the engine's recorded log-probs are of the same distribution the trainer computes (the preset's
0.99 would add a temperature difference to the mismatch); one rollout by the HF engine with the
log-probs it records, then the trainer's recompute of the same tokens (Policy.logprobs, the fused
loss's row pass), both in the compute dtype given. For each dtype: max and mean |log pi - log mu|
over reply tokens, and the spread of the per-token ratio exp(log pi - log mu). The same seed gives
each dtype its own samples (the dtypes sample differently from the first token on).

    python results/benchmarks/mismatch-cpu-2026-12-06/mismatch.py                    # > output.txt
    python results/benchmarks/mismatch-cpu-2026-12-06/mismatch.py --preset-sampling  # > output-preset.txt

`--preset-sampling` keeps the preset's temperature 0.99, top-p 0.99 and top-k 100: the engine then
records log-probs of that processed distribution, and the difference to the trainer's log pi
(temperature 1, whole vocabulary) is the sampling settings' as much as the dtype's.
"""
import sys

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
    preset_sampling = "--preset-sampling" in sys.argv[1:]
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; sampling: "
          f"{'the preset' if preset_sampling else 'temperature 1, no top-p or top-k'}")
    print("| compute | reply tokens | max abs dlogp | mean abs dlogp | ratio p1 | ratio p99 | ratio min | ratio max |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in ("float32", "bfloat16"):
        plain = {} if preset_sampling else {"rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0}
        cfg = config.load("smollm2-135m-math", None, {"model.dtype": dtype, "train.sft_steps": 0, **plain})
        torch.manual_seed(0)
        model, tok, _ = load_policy(cfg, CPU)
        r = cfg.rollout
        ep = rollout(HFEngine(model, tok), tok, cfg.env.name, env_kwargs(cfg), list(range(r.episodes // r.group_size)),
                     r.group_size, r.max_new_tokens, r.max_len, Sampling(r.temperature, r.top_p, r.top_k))
        pi = Policy(model, cfg, CPU).logprobs(ep.tokens, ep.mask)
        m = ep.mask.clone()
        m[:, 0] = False  # the first position predicts nothing
        d = (pi - ep.engine_logp)[m].double()
        ratio = d.exp()
        q = torch.quantile(ratio, torch.tensor([0.01, 0.99], dtype=torch.float64))
        print(f"| {dtype} | {int(m.sum())} | {d.abs().max():.2e} | {d.abs().mean():.2e} | {q[0]:.4f} | {q[1]:.4f} | "
              f"{ratio.min():.4f} | {ratio.max():.4f} |", flush=True)


if __name__ == "__main__":
    main()

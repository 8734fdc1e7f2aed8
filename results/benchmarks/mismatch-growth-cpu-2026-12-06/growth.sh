#!/bin/bash
# The engine/trainer mismatch over a run: the default job under unprocessed sampling (temperature
# 1, top_p 1, top_k 0), where every iteration logs engine_trainer_logp_meanabs and _maxdiff (the
# HF engine's recorded log-probs against the trainer's recompute, at the same weights). Three runs
# of seed 1000, one after another, one torch thread: float32; bf16 with float32 logits (the
# default under bf16); bf16 with logits rounded to bf16. summary.py prints the table.
set -e
out=${1:-/tmp/mismatch-growth}
for arm in float32:float32:float32 bf16:bfloat16:float32 bf16-compute-logits:bfloat16:compute; do
  IFS=: read -r name dtype logits <<< "$arm"
  OMP_NUM_THREADS=1 freshper train --preset smollm2-135m-math --seed 1000 --threads 1 \
    --rollout.temperature 1 --rollout.top_p 1 --rollout.top_k 0 \
    --model.dtype "$dtype" --model.logits_dtype "$logits" --train.run_dir "$out" --train.name "$name"
done

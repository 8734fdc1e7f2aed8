#!/bin/bash
# Does bf16 compute learn as float32 does, now that a full fine-tune loads its masters in float32
# (5de6337)? The default job whole, as the README starts it, at --model.dtype bfloat16, seeds 0 and 1,
# one after the other with nothing else running, 2 threads, from main's checkout root with its .venv.
# The float32 side and the earlier bf16 runs (masters loaded in bf16) are in results/benchmarks/bf16-cpu-2026-12-05/.
set -euo pipefail
OUT=results/benchmarks/bf16-masters-learning-2026-12-06
TMP=$(mktemp -d)
for s in 0 1; do
  /usr/bin/time -v -o $OUT/default-bfloat16-seed$s.time $PWD/.venv/bin/freshper train --model.dtype bfloat16 \
    --train.seed $s --train.run_dir $TMP --train.name bf16-s$s --train.progress false > $OUT/default-bfloat16-seed$s.log 2>&1
  cp $TMP/bf16-s$s/metrics.jsonl $OUT/default-bfloat16-seed$s.jsonl
  cp $TMP/bf16-s$s/source.json $OUT/default-bfloat16-seed$s-source.json 2>/dev/null || true
done
rm -rf $TMP

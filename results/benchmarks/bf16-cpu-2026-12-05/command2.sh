#!/bin/bash
# A second seed of the same pair, for the learning outcome only (not for speed): the default job with
# --train.seed 1, float32 and bf16 side by side, one thread each, nothing else running.
set -euo pipefail
OUT=results/benchmarks/bf16-cpu-2026-12-05
TMP=$(mktemp -d)
for side in float32 bfloat16; do
  OMP_NUM_THREADS=1 $PWD/.venv/bin/freshper train --model.dtype $side --train.seed 1 --train.threads 1 \
    --train.run_dir $TMP --train.name $side-seed1 --train.progress false > $OUT/default-$side-seed1.log 2>&1 &
done
wait
for side in float32 bfloat16; do cp $TMP/$side-seed1/metrics.jsonl $OUT/default-$side-seed1.jsonl; done
rm -rf $TMP

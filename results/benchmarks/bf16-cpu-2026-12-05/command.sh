#!/bin/bash
# bf16 compute over float32 masters (--model.dtype bfloat16) against float32 on the CPU: the default
# job whole, as the README starts it (`freshper train`, 15 iterations, validation before and after),
# float32 then bf16, one after the other with nothing else running, 2 threads (torch's default
# here), from main's checkout root with its .venv. GNU time gives each run's peak memory.
set -euo pipefail
OUT=results/benchmarks/bf16-cpu-2026-12-05
TMP=$(mktemp -d)
for side in float32 bfloat16; do
  /usr/bin/time -v -o $OUT/default-$side.time $PWD/.venv/bin/freshper train --model.dtype $side \
    --train.run_dir $TMP --train.name $side --train.progress false > $OUT/default-$side.log 2>&1
  cp $TMP/$side/metrics.jsonl $OUT/default-$side.jsonl
done
rm -rf $TMP

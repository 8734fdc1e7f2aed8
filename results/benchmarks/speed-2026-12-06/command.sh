#!/bin/bash
# Side by side on one machine with nothing else running, main's code, from main's checkout root:
#   1. the game study's preset, micro_batch 2 (its value) against 4, one run each, 3 iterations;
#   2. TRL's GRPOTrainer against `freshper train` on the same job (the default job's settings),
#      2 threads, replay off and on, the sides one after the other;
#   3. the default job whole, float32 (the default) and --model.dtype bfloat16 (float32-loaded
#      masters), seeds 2 and 3, alternating: f32 s2, bf16 s2, f32 s3, bf16 s3 (seeds 0 and 1 are in
#      bf16-masters-learning-2026-12-06 and bf16-cpu-2026-12-05).
set -euo pipefail
OUT=results/benchmarks/speed-2026-12-06
$PWD/.venv/bin/python -m freshper.profiling.bench_iteration_at $PWD/.venv/bin/python $PWD/.venv/bin/python \
  --preset smollm2-135m-frozenlake --args-b "--algo.micro_batch 4" --iterations 3 --rounds 1 --threads 2 \
  --keep $OUT/game-mb > $OUT/game-mb.txt 2>&1
$PWD/.venv/bin/python -m freshper.profiling.bench_trl --iterations 3 --threads 2 > $OUT/trl.md 2> $OUT/trl.err
TMP=$(mktemp -d)
for s in 2 3; do
  for d in float32 bfloat16; do
    /usr/bin/time -v -o $OUT/default-$d-seed$s.time $PWD/.venv/bin/freshper train --model.dtype $d \
      --train.seed $s --train.run_dir $TMP --train.name $d-s$s --train.progress false > $OUT/default-$d-seed$s.log 2>&1
    cp $TMP/$d-s$s/metrics.jsonl $OUT/default-$d-seed$s.jsonl
    cp $TMP/$d-s$s/source.json $OUT/default-$d-seed$s-source.json
  done
done
rm -rf $TMP

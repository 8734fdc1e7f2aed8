#!/bin/bash
# Side by side on one machine with nothing else running, from main's checkout root (main at 411329c:
# the update skips the backward of micro-batches without signal, algo.skip_zero_adv):
#   1. a game iteration, 67c351c against main, both without the warm start (as game-67c-2026-12-06,
#      which ran main before 411329c): /work/wt-67c is a worktree of 67c351c whose venv adds main's
#      .venv packages through a .pth file and installs the checkout editable with --no-deps;
#   2. the game study's preset (warm start from its cache), main with algo.skip_zero_adv false
#      against true, one run each, 3 iterations;
#   3. TRL's GRPOTrainer against `freshper train` on the same job (the default job's settings),
#      2 threads, replay off and on, the sides one after the other;
#   4. the game study's preset, micro_batch 2 (its value) against 4;
#   5. the default job whole, float32 (the default) and --model.dtype bfloat16 (float32-loaded
#      masters), seeds 2 and 3, alternating (seeds 0 and 1: bf16-masters-learning-2026-12-06 and
#      bf16-cpu-2026-12-05).
set -euo pipefail
OUT=results/benchmarks/speed-2026-12-06
PY=$PWD/.venv/bin/python
GAME=$(sed 's/--train.sft_steps 3/--train.sft_steps 0/' results/benchmarks/whole-runs-2026-12-05/game-flags.txt)
$PY -m freshper.profiling.bench_iteration_at /work/wt-67c/.venv/bin/python $PY --preset frozenlake \
  --args-a "$GAME" --args-b "$GAME" --iterations 3 --rounds 1 --threads 2 --keep $OUT/game-67c > $OUT/game-67c.txt 2>&1
$PY -m freshper.profiling.bench_iteration_at $PY $PY --preset smollm2-135m-frozenlake \
  --args-a "--algo.skip_zero_adv false" --iterations 3 --rounds 1 --threads 2 --keep $OUT/game-skip > $OUT/game-skip.txt 2>&1
$PY -m freshper.profiling.bench_trl --iterations 3 --threads 2 > $OUT/trl.md 2> $OUT/trl.err
$PY -m freshper.profiling.bench_iteration_at $PY $PY --preset smollm2-135m-frozenlake \
  --args-b "--algo.micro_batch 4" --iterations 3 --rounds 1 --threads 2 --keep $OUT/game-mb > $OUT/game-mb.txt 2>&1
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

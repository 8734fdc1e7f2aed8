#!/bin/bash
# Speed side by side on one machine with nothing else running, each pair alternated (A then B):
#   1. the default job whole, as the README starts it (`freshper train`), a194f3f against main;
#   2. iterations of the game study's setting, 67c351c (before the multi-turn work) against main;
#   3. TRL's GRPOTrainer against `freshper train` on the same job, at main.
# The old commits are git worktrees (/work/wt-a194, /work/wt-67c), each with a venv that adds main's
# .venv packages through a .pth file and installs its own checkout editable (`pip install --no-deps -e .`),
# so every side runs the same torch and transformers. Run from main's checkout root.
set -euo pipefail
OUT=results/benchmarks/whole-runs-2026-12-05
TMP=$(mktemp -d)

# 1. the default job (smollm2-135m-math, 15 iterations, validation before and after), 2 threads (torch's default here)
for side in a194f3f:/work/wt-a194/.venv main:$PWD/.venv; do
  name=${side%%:*}; venv=${side#*:}
  /usr/bin/time -v -o $OUT/default-$name.time $venv/bin/freshper train --train.run_dir $TMP --train.name $name \
    --train.progress false > $OUT/default-$name.log 2>&1
  cp $TMP/$name/metrics.jsonl $OUT/default-$name.jsonl
done

# 2. the game study's setting with the flags 67c351c has (its FrozenLake has no corners, held-out boards or
#    solver warm start: random-reply warm start on 3x3 boards here, on both sides, so both play the same episodes)
GAME=$(cat $OUT/game-flags.txt)
$PWD/.venv/bin/python -m freshper.profiling.bench_iteration_at /work/wt-67c/.venv/bin/python $PWD/.venv/bin/python \
  --preset frozenlake --args-a "$GAME" --args-b "$GAME" --iterations 4 --rounds 1 --threads 2 \
  --keep $OUT/game > $OUT/game.txt 2>&1

# 3. TRL against ours, 2 threads, replay off and on, HF generation on both sides
$PWD/.venv/bin/python -m freshper.profiling.bench_trl --iterations 4 --threads 2 > $OUT/trl.md 2> $OUT/trl.err
rm -rf $TMP

#!/bin/bash
# Second part, after command.sh's step 2 was killed for memory (67c351c's game run: oom-67c351c.txt,
# game-67c351c-killed.txt) and so skipped its step 3. Nothing else running; run from main's checkout root.
#   2b. iterations of the game study's preset, 19057d7 (the study's commit: turn cache, before the decode
#       fix) against main; /work/wt-190 is its worktree with a venv over main's .venv packages, as above;
#   3.  TRL's GRPOTrainer against `freshper train` on the same job, at main, 2 threads, replay off and on.
set -euo pipefail
OUT=results/benchmarks/whole-runs-2026-12-05
$PWD/.venv/bin/python -m freshper.profiling.bench_iteration_at /work/wt-190/.venv/bin/python $PWD/.venv/bin/python \
  --preset smollm2-135m-frozenlake --iterations 3 --rounds 1 --threads 2 --keep $OUT/game > $OUT/game.txt 2>&1
$PWD/.venv/bin/python -m freshper.profiling.bench_trl --iterations 3 --threads 2 > $OUT/trl.md 2> $OUT/trl.err

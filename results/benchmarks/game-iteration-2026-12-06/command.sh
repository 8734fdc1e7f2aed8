#!/bin/bash
# An iteration of the game study's preset (smollm2-135m-frozenlake), 99acfc0 (before the float32 master
# load, 5de6337, and the row order of the shared-prompt update, fab1d85) against main, one run each,
# 3 iterations (medians over iterations 1-2), 2 threads, nothing else running; GNU time over the pair.
# /work/wt-99a is a git worktree of 99acfc0 whose venv adds main's .venv packages through a .pth file
# and installs the checkout editable with --no-deps. Run from main's checkout root.
set -euo pipefail
OUT=results/benchmarks/game-iteration-2026-12-06
$PWD/.venv/bin/python -m freshper.profiling.bench_iteration_at /work/wt-99a/.venv/bin/python $PWD/.venv/bin/python \
  --preset smollm2-135m-frozenlake --iterations 3 --rounds 1 --threads 2 --keep $OUT/game > $OUT/game.txt 2>&1

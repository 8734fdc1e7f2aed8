#!/bin/bash
# The 2x goal: a SmolLM2 game iteration, 67c351c (before the multi-turn work: every turn re-reads the
# whole conversation) against main, side by side on one machine with nothing else running. Both
# sides run the game study's values that 67c351c has (game-flags.txt of whole-runs-2026-12-05)
# without the warm start (--train.sft_steps 0): 67c351c's warm start is killed for memory on this
# machine (whole-runs-2026-12-05/oom-67c351c.txt). Untrained, SmolLM2's replies are mostly invalid,
# so episodes run longer than after the warm start.
# 67c351c is a git worktree (/work/wt-67c) whose venv adds main's .venv packages through a .pth file
# and installs the checkout editable with --no-deps. Run from main's checkout root with OUT set.
# rss.txt samples every process's resident memory each 2 s (kB), to give each side's peak.
set -euo pipefail
OUT=${OUT:?set OUT to the results folder}
mkdir -p $OUT
GAME=$(sed 's/--train.sft_steps 3/--train.sft_steps 0/' results/benchmarks/whole-runs-2026-12-05/game-flags.txt)
echo "$GAME" > $OUT/game-flags-sft0.txt
( while sleep 2; do echo "$(date +%s) $(ps -eo pid=,rss=,args= | grep 'freshper.trainer.cli train' | grep -v grep | awk '{print $1, $2, $3}' | tr '\n' ' ')"; done ) > $OUT/rss.txt &
SAMPLER=$!
trap "kill $SAMPLER" EXIT
$PWD/.venv/bin/python -m freshper.profiling.bench_iteration_at /work/wt-67c/.venv/bin/python $PWD/.venv/bin/python \
  --preset frozenlake --args-a "$GAME" --args-b "$GAME" --iterations 3 --rounds 1 --threads 2 \
  --keep $OUT/game > $OUT/game.txt 2>&1

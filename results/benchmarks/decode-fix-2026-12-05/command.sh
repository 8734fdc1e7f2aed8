#!/bin/bash
# The HF engine's decode fixes (room cache, grouped heads inside sdpa), timed alone on the machine
# (no study run beside them), one torch thread, from the checkout's root with its venv active.
set -e
cd "$(dirname "$0")"
export OMP_NUM_THREADS=1
# one decode step: 16 left-padded rows (every other one 40 positions of padding), 600 cached positions (the preset caps a conversation at 640)
python -m freshper.profiling.bench_decode --preset smollm2-135m-frozenlake --rows 16 --cache 600 --pad 40 \
    --steps 16 --rounds 3 --threads 1 > decode-step.txt
# whole multi-turn rollouts of the study's game (untrained SmolLM2: every episode to its turn limit),
# 16 episodes as a study iteration, turn cache on in both, decode fixes on against off, 2 rounds
python -m freshper.profiling.bench_turns --preset smollm2-135m-frozenlake --compare decode --groups 4 --rounds 2 \
    --threads 1 > rollout.txt

# Pilot 5 (2026-12-05), at 43c052d: the update-matched control on FrozenLake 3x3 with the start
# top-left and the goal bottom-right (env.corners), 6 moves, after the format warm start on
# random valid moves (6 steps, the preset's); lr 1e-5 and 3e-5; seed 100 (no study run uses it);
# two runs side by side, one thread each. (In a venv with the package installed from a checkout of
# 43c052d; runs in /work/pilot-runs.)
COMMON="--preset smollm2-135m-frozenlake --arms on-policy-matched --seeds 1 --first-seed 100 --budget 800 \
  --run-dir /work/pilot-runs --keep-weights --env.size 3 --env.corners true --env.max_turns 6 \
  --algo.kl_coef 0.05 --eval.every 4"
OMP_NUM_THREADS=1 freshper compare $COMMON --name pilot5-corners-lr1e-5 --algo.lr 1e-5 > pilot5-lr1e-5.out 2>&1 &
OMP_NUM_THREADS=1 freshper compare $COMMON --name pilot5-corners-lr3e-5 --algo.lr 3e-5 > pilot5-lr3e-5.out 2>&1 &
wait

# peak resident memory: /proc/PID/status VmHWM of each run's process, read once a minute (hwm.log)
# Both runs were stopped at 01:45 (iterations 5 and 4): no training episode had succeeded in
# either, so every advantage and gradient was 0 (format/ holds what they wrote).

# Pilot 6 (2026-12-05), at 43c052d: the same game after a short warm start on the solver's moves
# (1 and 3 steps), lr 2e-5; seed 100; budget 560 env steps; two runs side by side, one thread each.
COMMON="--preset smollm2-135m-frozenlake --arms on-policy-matched --seeds 1 --first-seed 100 --budget 560 \
  --run-dir /work/pilot-runs --keep-weights --env.size 3 --env.corners true --env.max_turns 6 \
  --algo.kl_coef 0.05 --eval.every 4 --algo.lr 2e-5 --train.sft_replies solver"
OMP_NUM_THREADS=1 freshper compare $COMMON --name pilot6-corners-solver1 --train.sft_steps 1 > pilot6-solver1.out 2>&1 &
OMP_NUM_THREADS=1 freshper compare $COMMON --name pilot6-corners-solver3 --train.sft_steps 3 > pilot6-solver3.out 2>&1 &
wait

# what the uniform policy and Down-or-Right score (policies.txt):
freshper chance --preset smollm2-135m-frozenlake --episodes 1000 --split eval --env.size 3 --env.corners true --env.max_turns 6
#   ... 1000 eval states: success 0.055 ± 0.014 (95%), reward 0.055 per episode
freshper chance --preset smollm2-135m-frozenlake --episodes 1000 --split train --env.size 3 --env.corners true --env.max_turns 6
#   ... 1000 train states: success 0.027 ± 0.010 (95%), reward 0.027 per episode
python results/pilot-corners/policies.py > results/pilot-corners/policies.txt
# pilot6-corners-solver1 was stopped at 02:11 after its iteration 4 (307 env steps; solver1/ holds
# what it wrote); pilot6-corners-solver3 ran to its budget (solver3/, with compare's table).

# Pilot 7 (2026-12-05), at 5b664c8: the update-matched control and FreshPER (the preset's tau 1000)
# on seeds 101-103 in the pilot-6 setting, every run from the one 3-step solver warm start of seed 100
# (train.sft_seed 100: pilot 6's cached weights); validation 8 states at a time (the preset's
# eval.batch 8); two runs side by side, one thread each (compare --parallel 2). Folder: pilot7/.
COMMON="--preset smollm2-135m-frozenlake --arms on-policy-matched,freshper --seeds 3 --first-seed 101 --budget 560 \
  --parallel 2 --run-dir /work/pilot-runs --env.size 3 --env.corners true --env.max_turns 6 \
  --algo.kl_coef 0.05 --eval.every 4 --algo.lr 2e-5 --train.sft_replies solver --train.sft_steps 3 --train.sft_seed 100"
OMP_NUM_THREADS=1 freshper compare $COMMON --name pilot7-corners > pilot7-corners.out 2>&1
python results/pilot-corners/pilot7.py > results/pilot-corners/pilot7.txt
# peak resident memory of each run (VmHWM, read once a minute): pilot7/hwm.log

# Pilot 4 (2026-12-04), at dcf517b: the update-matched control on each game after a warm start on
# the solver's moves; seed 100 (no study run uses it); two runs side by side, one thread each.
# (in a venv with the package installed from a checkout of dcf517b)
freshper compare --preset smollm2-135m-frozenlake --arms on-policy-matched --seeds 1 --first-seed 100 \
  --budget 800 --name pilot4-frozenlake-solver --run-dir runs --keep-weights \
  --train.sft_replies solver --algo.kl_coef 0.05 --eval.every 4 > pilot4-frozenlake-solver.out 2>&1 &
freshper compare --preset smollm2-135m-sokoban --arms on-policy-matched --seeds 1 --first-seed 100 \
  --budget 800 --name pilot4-sokoban-solver --run-dir runs --keep-weights \
  --train.sft_replies solver --rollout.episodes 16 --algo.replay_batch 16 --algo.lr 1e-5 \
  --algo.kl_coef 0.05 --eval.every 4 > pilot4-sokoban-solver.out 2>&1 &
wait

# Pilot 4, replay arm (2026-12-04), at dcf517b: FreshPER as the authors run it, on the FrozenLake
# control's setting, seed 100: its replay-signal share and KL-by-age (drift) for a registration.
# (in a venv with the package installed from a checkout of dcf517b)
freshper compare --preset smollm2-135m-frozenlake --arms freshper --seeds 1 --first-seed 100 \
  --budget 800 --name pilot4-frozenlake-solver --run-dir runs --keep-weights \
  --train.sft_replies solver --algo.kl_coef 0.05 --eval.every 4 > pilot4-frozenlake-solver-freshper.out 2>&1

# the FrozenLake table over both arms, afterwards:
freshper compare --preset smollm2-135m-frozenlake --arms on-policy-matched,freshper --seeds 1 --first-seed 100 --budget 800 --name pilot4-frozenlake-solver --run-dir runs --report-only --train.sft_replies solver --algo.kl_coef 0.05 --eval.every 4

# peak resident memory: /proc/PID/status VmHWM of each run's process, read once a minute (hwm.log)

# what random valid moves score on the validation states:
freshper chance --preset smollm2-135m-frozenlake --episodes 1000 --split eval
#   smollm2-135m-frozenlake (frozenlake), random well-formed replies, 1000 eval states: success 0.157 ± 0.023 (95%), reward 0.157 per episode
freshper chance --preset smollm2-135m-sokoban --episodes 1000 --split eval
#   smollm2-135m-sokoban (sokoban), random well-formed replies, 1000 eval states: success 0.125 ± 0.020 (95%), reward 0.902 per episode

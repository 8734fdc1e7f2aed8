#!/usr/bin/env bash
# Seconds per iteration, hf against vllm generation, on the VLM CPU presets (one torch thread,
# means over iterations 1-3 of 0-3: iteration 0 holds vLLM's start and compile). From the repo root, the venv
# active, PYTHONPATH=tests/shims (vLLM's Qwen2-VL imports torchvision); output in this folder.
set -euo pipefail
here=results/benchmarks/vlm-engines
for preset in frozenlake-vlm-cpu geoqa-cpu; do
  for engine in hf vllm; do
    rm -rf /tmp/vlm-bench/$preset-$engine; mkdir -p /tmp/vlm-bench
    OMP_NUM_THREADS=1 freshper train --preset $preset --rollout.engine $engine --train.iterations 4 \
      --eval.every 0 --train.progress false --train.run_dir /tmp/vlm-bench/$preset-$engine > /tmp/vlm-bench/$preset-$engine.log 2>&1
    cp /tmp/vlm-bench/$preset-$engine/*/metrics.jsonl $here/$preset-$engine.jsonl
  done
done
python - <<'PY'
import json
here = "results/benchmarks/vlm-engines"
# top-level phases (time_rollout holds time_generate and time_env_step): their sum is the iteration
top = ["time_rollout", "time_logprob_recompute", "time_onpolicy_update", "time_buffer_add", "time_sample",
       "time_replay_update", "time_priority_update", "time_weight_sync"]
print("| preset | engine | s/iteration | generate s | recompute s | weight sync s | gen tokens/iter |")
print("|---|---|---|---|---|---|---|")
for preset in ("frozenlake-vlm-cpu", "geoqa-cpu"):
    per = {}
    for engine in ("hf", "vllm"):
        rows = [json.loads(line) for line in open(f"{here}/{preset}-{engine}.jsonl")][1:]
        def m(k):
            return sum(r.get(k, 0) for r in rows) / len(rows)
        per[engine] = sum(m(k) for k in top)
        print(f"| {preset} | {engine} | {per[engine]:.2f} | {m('time_generate'):.2f} | "
              f"{m('time_logprob_recompute'):.2f} | {m('time_weight_sync'):.3f} | {m('gen_tokens'):.0f} |")
    print(f"| {preset} | hf / vllm | {per['hf'] / per['vllm']:.2f}x | | | | |")
PY

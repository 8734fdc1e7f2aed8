#!/usr/bin/env bash
# One prepared GPU check that fits one device call (10 min per command, 15 min per session):
# every step runs under its own timeout, and the worst case (the budgets in BUDGETS, plus 5 s of
# kill grace per step) is at most 480 s, checked by tests/profiling/test_gpu_check.py. The
# summary table is printed whatever fails or times out. Logs go to $OUT (or ./gpu_check).
#   bash profiling/gpu_check.sh --fetch-wheels   # here, before the device call: wheels the GPU
#                                                # image lacks (TRL and its datasets, Liger-Kernel,
#                                                # Cut Cross-Entropy, gymnasium), into .whl/ (git-ignored)
#   bash profiling/gpu_check.sh                  # on an H100 / H200 with torch + triton (3.6 or newer)
# What it measures side by side, on one card in one call: the fused LM-head loss against eager,
# Liger-Kernel's fused linear GRPO loss and Cut Cross-Entropy (bench_kernels); the replay step on
# CUDA with and without host syncs and captured in a CUDA graph, against the CPU tree (bench_replay);
# one GRPO iteration of the Qwen2.5-0.5B architecture with random weights against TRL's
# GRPOTrainer on the same job (bench_trl).
set -uo pipefail
cd "$(dirname "$0")/.."
# Seconds per step. Every step, the preamble included, runs under `timeout -k $GRACE`.
declare -A BUDGETS=([preamble]=30 [wheels]=25 [install]=40 [kernel-tests]=110 [bench_kernels]=80
                    [bench_replay]=60 [bench_trl]=100 [train-smoke]=70 [vlm-smoke]=60)
# Steps run only if their budget still fits the 480 s worst case when they are reached.
IF_TIME="train-smoke vlm-smoke"
GRACE=5
WHEELS="gymnasium==1.4.0 farama-notifications==0.0.4 trl liger-kernel cut-cross-entropy datasets multiprocess dill
xxhash"
if [ "${1:-}" = "--fetch-wheels" ]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl $WHEELS
  ls .whl
  exit 0
fi
out=${OUT:-gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
summary="$out/summary.txt"
: > "$summary"
t_start=$(date +%s)

# step NAME LOGFILE CMD...: run CMD under `timeout` with NAME's budget, keep its output, record
# the outcome in the summary.
step() {
  local name=$1 log=$2
  shift 2
  local budget=${BUDGETS[$name]}
  echo "== $name (budget ${budget}s) =="
  local t0 rc
  t0=$(date +%s)
  timeout -k "$GRACE" "$budget" "$@" > "$out/$log" 2>&1
  rc=$?
  tail -n 25 "$out/$log"
  local status=ok
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status="TIMEOUT"; elif [ $rc -ne 0 ]; then status="FAILED rc=$rc"; fi
  printf '| %-16s | %-12s | %4ss |\n' "$name" "$status" "$(( $(date +%s) - t0 ))" >> "$summary"
  return $rc
}

skip() {  # skip NAME WHY: record a step that could not run
  echo "== $1: skipped ($2) =="
  printf '| %-16s | %-12s | %4ss |\n' "$1" "SKIPPED" 0 >> "$summary"
}

print_summary() {
  echo
  echo "== summary ($(( $(date +%s) - t_start ))s total) =="
  cat "$out/env.txt" 2>/dev/null
  echo "| step             | status       | time  |"
  cat "$summary"
  echo
  grep -h -E "[0-9]+ (passed|failed)" "$out/tests.txt" 2>/dev/null | tail -1
  grep -h -E "^FAILED|^ERROR" "$out/tests.txt" 2>/dev/null | head -20
  grep -h -E "^\| 1e\+0[4-7]|copy:" "$out/bench_kernels.txt" 2>/dev/null
  grep -h -E "^\| [0-9]+x[0-9]+" "$out/bench_kernels.txt" 2>/dev/null
  grep -h -E "^\| 1e\+0[4-6]" "$out/bench_replay.txt" 2>/dev/null
  grep -h -E "^\| [0-9]+ \| (on|off)" "$out/bench_trl.txt" 2>/dev/null
  tail -n 3 "$out/train.txt" 2>/dev/null
  tail -n 2 "$out/vlm.txt" 2>/dev/null
}
trap print_summary EXIT

preamble() {
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  python3 -c 'import flash_attn; print("flash-attn", flash_attn.__version__)' 2>/dev/null || echo "flash-attn: not installed"
  python3 -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null || echo "vllm: not installed"
  python3 -c 'import gymnasium; print("gymnasium", gymnasium.__version__)' 2>/dev/null || echo "gymnasium: not installed"
}
export -f preamble
step preamble env.txt bash -c preamble

# Nothing can be fetched on the GPU machine: carried wheels (--fetch-wheels) go to /tmp/site,
# then the package itself (no dependency resolution, no isolated build environment).
if ls .whl/*.whl >/dev/null 2>&1; then
  step wheels wheels.txt python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
  skip wheels "no .whl/: run 'bash profiling/gpu_check.sh --fetch-wheels' before the call and carry .whl"
fi
step install install.txt python3 -m pip install --no-deps --no-build-isolation -e . || cat "$out/install.txt"

# The kernels and buffer compiled on the GPU, the compile check under the image's triton, and
# the packed flash-attention forward (it runs where flash-attn imports, and says so where not).
step kernel-tests tests.txt python3 -m pytest -q -p no:cacheprovider -rs tests/kernels \
  tests/freshper/test_buffer.py tests/freshper/test_sync_free.py tests/freshper/test_checkpoint.py \
  tests/trainer/model/test_packing.py

step bench_kernels bench_kernels.txt python3 -m freshper.profiling.bench_kernels --quick

step bench_replay bench_replay.txt python3 -m freshper.profiling.bench_replay --steps 100 --profile

# One GRPO iteration, Qwen2.5-0.5B's architecture with random weights (no hub), replies of 64 tokens, the HF
# engine on both sides (no vLLM here): ours against TRL's GRPOTrainer, one process each, one after the other.
step bench_trl bench_trl.txt python3 -m freshper.profiling.bench_trl --model random-qwen2.5-0.5b --new-tokens 64 \
  --iterations 3 --skip 1 --threads 1 --replay 0

# What the preamble found decides the smoke runs (no untimed imports here).
no_gym=0
grep -q "^gymnasium: not installed" "$out/env.txt" && ! ls .whl/gymnasium-*.whl >/dev/null 2>&1 && no_gym=1
engine=vllm
grep -q "^vllm " "$out/env.txt" || engine=hf
if [ $no_gym = 1 ]; then
  skip train-smoke "gymnasium missing: the wheels were not carried (--fetch-wheels, then carry .whl)"
elif (( $(date +%s) - t_start + ${BUDGETS[train-smoke]} + GRACE > 480 )); then
  skip train-smoke "its budget no longer fits the 480 s worst case"
else
  [ $engine = hf ] && echo "vllm is not installed here: smoke run with the hf engine"
  step train-smoke train.txt python3 -m freshper.trainer.cli train --preset gpu-smoke --rollout.engine $engine \
    --train.run_dir "$out/runs"
fi

# The vision path through vLLM (tiny Qwen2-VL, FrozenLake-VLM), if the steps above left it room.
if [ $no_gym = 1 ] || [ $engine != vllm ]; then
  skip vlm-smoke "needs gymnasium and vllm"
elif (( $(date +%s) - t_start + ${BUDGETS[vlm-smoke]} + GRACE > 480 )); then
  skip vlm-smoke "its budget no longer fits the 480 s worst case"
else
  step vlm-smoke vlm.txt python3 -m freshper.trainer.cli train --preset gpu-smoke-vlm --train.run_dir "$out/runs-vlm"
fi
exit 0

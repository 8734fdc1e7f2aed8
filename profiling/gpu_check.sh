#!/usr/bin/env bash
# One prepared GPU check that fits one device call with room for a rerun: every step runs under its
# own timeout (BUDGETS, plus GRACE seconds of kill grace), the essential rows come first and are out
# within 150 s in the worst case, and the whole call takes at most 300 s in the worst case
# (tests/profiling/test_gpu_check.py checks both). Each step's output is printed as it comes (a
# timeout loses nothing already measured), and the summary table is printed whatever fails.
# Logs go to $OUT (or ./gpu_check).
#   bash profiling/gpu_check.sh --fetch-wheels   # here, before the device call: wheels the GPU
#                                                # image lacks (TRL and its datasets, Liger-Kernel,
#                                                # Cut Cross-Entropy, gymnasium), into .whl/
#   bash profiling/gpu_check.sh                  # on an H100 / H200 with torch + triton (3.6 or newer)
#   bash profiling/gpu_check.sh --dry-run        # on the CPU: the order and budgets, the preamble, a
#                                                # small loss profile and the asynchronous step's
#                                                # tiny runs for real, the rest echoed
# .whl/ is git-ignored: a device call that copies the working tree must name it in its carry list
# (the run tool's `carry: [".whl"]`), or the wheels step is skipped and Liger, CCE, TRL and the
# smoke runs report "not installed".
# Order: the essential rows (the kernel tests with -v, our fused loss with bf16 and float32 logits
# against eager, the float32-logits path this torch takes, and a profile splitting its GEMM time
# from its row-kernel time, the replay buffer's step), then the carried wheels, the buffer's CUDA
# tests, Liger's and CCE's loss beside ours, and, while time is left, asynchronous generation
# against synchronous on this GPU, one GRPO iteration against TRL, the smoke run, a short Nsight
# session through `freshper profile`, and the vision smoke run.
set -uo pipefail
cd "$(dirname "$0")/.."
# Seconds per step. Every step, the preamble included, runs under `timeout -k $GRACE`. Measured on
# the one GPU run (H200, 2026-12-04, results/gpu-check-2026-12-04/): preamble 4 s, install 2 s, the
# smoke run 67 s; the kernel and buffer tests 61 s together, bench_kernels 29 s and bench_replay
# 9 s in older forms. Every budget in UNMEASURED is an estimate: never run on a GPU in its form.
declare -A BUDGETS=([preamble]=8 [install]=20 [kernel-tests]=55 [loss]=30 [buffer-step]=20
                    [wheels]=25 [buffer-tests]=40 [baselines]=60
                    [async]=100 [bench_trl]=90 [train-smoke]=70 [nsight]=60 [vlm-smoke]=60)
UNMEASURED="kernel-tests loss buffer-step wheels buffer-tests baselines async bench_trl nsight vlm-smoke"
# The steps whose rows matter most, run first, in this order: worst case <= ESSENTIAL_BY seconds.
ESSENTIAL="preamble install kernel-tests loss buffer-step"
ESSENTIAL_BY=150
# Steps run only if their budget still fits the worst case when they are reached: after every
# other step, so that the others' budgets add up to the worst case on their own.
IF_TIME="async bench_trl train-smoke nsight vlm-smoke"
WORST=300
GRACE=3
WHEELS="gymnasium==1.4.0 farama-notifications==0.0.4 trl liger-kernel cut-cross-entropy datasets multiprocess dill
xxhash"
# What TRL's GRPOTrainer imports (directly or through datasets, accelerate and transformers), then the
# other optional packages the call uses: module names, checked without importing them.
TRL_IMPORTS="trl accelerate datasets transformers pandas pyarrow psutil jinja2 fsspec huggingface_hub multiprocess
dill xxhash requests yaml tokenizers safetensors"
OTHER_IMPORTS="liger_kernel cut_cross_entropy gymnasium flash_attn vllm"
if [ "${1:-}" = "--fetch-wheels" ]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl $WHEELS
  ls .whl
  exit 0
fi
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
# Steps a dry run runs for real, CPU-sized: the loss profile, and the asynchronous step's runs (tiny
# batches, a few iterations: its printing and ratio on real runs). On a shared 2-core CPU its three
# processes took 42 s at a load of 4.5, and twice that at more, so a dry run gives it DRY_BUDGET.
DRY_REAL="preamble loss async"
DRY_BUDGET=240
out=${OUT:-gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
export TRL_IMPORTS OTHER_IMPORTS
summary="$out/summary.txt"
: > "$summary"
t_start=$(date +%s)

# step NAME LOGFILE CMD...: run CMD under `timeout` with NAME's budget, print its output as it comes
# and keep it in LOGFILE, record the outcome in the summary.
step() {
  local name=$1 log=$2
  shift 2
  local budget=${BUDGETS[$name]}
  [ $DRY = 1 ] && [ "$name" = async ] && budget=$DRY_BUDGET
  echo "== $name (budget ${budget}s, at $(( $(date +%s) - t_start ))s) =="
  local t0 rc
  t0=$(date +%s)
  if [ $DRY = 1 ] && [[ " $DRY_REAL " != *" $name "* ]]; then
    echo "dry run: $*" | tee "$out/$log"
    rc=0
  else
    timeout -k "$GRACE" "$budget" "$@" 2>&1 | tee "$out/$log"
    rc=${PIPESTATUS[0]}
  fi
  local status=ok
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status="TIMEOUT"; elif [ $rc -ne 0 ]; then status="FAILED rc=$rc"; fi
  [ $DRY = 1 ] && status="dry $status"
  printf '| %-16s | %-12s | %4ss |\n' "$name" "$status" "$(( $(date +%s) - t0 ))" >> "$summary"
  return $rc
}

skip() {  # skip NAME WHY: record a step that could not run
  echo "== $1: skipped ($2) =="
  printf '| %-16s | %-12s | %4ss |\n' "$1" "SKIPPED" 0 >> "$summary"
}

fits() {  # fits NAME: whether NAME's budget and grace still fit the worst case from here
  (( $(date +%s) - t_start + ${BUDGETS[$1]} + GRACE <= WORST ))
}

print_summary() {
  echo
  echo "== summary ($(( $(date +%s) - t_start ))s total) =="
  echo "budgets never measured on a GPU in their form (estimates): $UNMEASURED"
  cat "$out/env.txt" 2>/dev/null
  echo "| step             | status       | time  |"
  cat "$summary"
  echo
  grep -h -E "[0-9]+ (passed|failed)" "$out/tests.txt" "$out/buffer_tests.txt" 2>/dev/null
  grep -h -E "(FAILED|ERROR)( |$)" "$out/tests.txt" "$out/buffer_tests.txt" 2>/dev/null | head -20
  grep -h "^fused loss path on " "$out/loss.txt" 2>/dev/null | cut -c1-150  # the whole line is in the step's log
  grep -h -E "^\| [0-9]+x[0-9]+, H=|^\| (GEMMs|row kernel|other|total) " "$out/loss.txt" 2>/dev/null
  grep -h -E "^round [0-9]+ (async|sync): |^async / sync episodes per second" "$out/async.txt" 2>/dev/null
  grep -h -E "^\| 1e\+0[4-6]" "$out/buffer_step.txt" 2>/dev/null
  grep -h -E "^\| [0-9]+x[0-9]+, H=" "$out/baselines.txt" 2>/dev/null
  grep -h -E "^\| [0-9]+ \| (on|off)" "$out/bench_trl.txt" 2>/dev/null
  tail -n 3 "$out/train.txt" 2>/dev/null
  tail -n 2 "$out/vlm.txt" 2>/dev/null
}
trap print_summary EXIT

preamble() {
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
  command -v nsys >/dev/null && echo "nsys: $(nsys --version 2>&1 | head -1)" || echo "nsys: not installed"
  python3 - <<'EOF'
import importlib.metadata as md
import importlib.util
import os

# versions from the installed metadata: importing torch here would cost seconds of the budget
for dist in ("torch", "triton"):
    try:
        print(dist, md.version(dist), end=" ")
    except md.PackageNotFoundError:
        print(dist, "not installed", end=" ")
print()
def have(m):
    try:
        return importlib.util.find_spec(m) is not None
    except (ImportError, ValueError):
        return False
for group in ("TRL_IMPORTS", "OTHER_IMPORTS"):
    mods = os.environ[group].split()
    missing = [m for m in mods if not have(m)]
    print(f"{group.split('_')[0].lower()} imports: {len(mods) - len(missing)}/{len(mods)} present; "
          f"missing: {' '.join(missing) or 'none'}")
for m in ("flash_attn", "vllm", "gymnasium"):
    print(f"{m.replace('_', '-')}: {'installed' if have(m) else 'not installed'}")
EOF
}
export -f preamble
step preamble env.txt bash -c preamble

# ---------------------------------------------------------------- the essential rows (<= 150 s)
step install install.txt python3 -m pip install -q --no-deps --no-build-isolation -e .

# The kernels compiled on the GPU, -v so that a timeout keeps the names of what ran. The sm_90
# compile check (test_compile_cuda) is left to the CPU machine, under Triton 3.6 and the newest.
step kernel-tests tests.txt python3 -m pytest -v -p no:cacheprovider -rs tests/kernels \
  --ignore=tests/kernels/test_compile_cuda.py

if [ $DRY = 1 ]; then
  step loss loss.txt python3 -m freshper.profiling.loss_profile --tokens 64 --hidden 32 --vocab 2000
else
  step loss loss.txt python3 -m freshper.profiling.bench_kernels --quick --part loss
fi

step buffer-step buffer_step.txt python3 -m freshper.profiling.bench_replay --cuda-only --capacities 1e4,1e6 \
  --steps 50 --profile

# ---------------------------------------------------------------- the rest (<= 300 s in all)
# Nothing can be fetched on the GPU machine: carried wheels (--fetch-wheels) go to /tmp/site.
if ls .whl/*.whl >/dev/null 2>&1; then
  step wheels wheels.txt bash -c 'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site python3 -c "
import importlib.util, os
mods = (os.environ[\"TRL_IMPORTS\"] + \" \" + os.environ[\"OTHER_IMPORTS\"]).split()
print(\"with the wheels, missing:\", \" \".join(m for m in mods if importlib.util.find_spec(m) is None) or \"none\")"' \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
  skip wheels "no .whl/: run 'bash profiling/gpu_check.sh --fetch-wheels' before the call and carry .whl"
fi

step buffer-tests buffer_tests.txt python3 -m pytest -v -p no:cacheprovider -rs tests/freshper/test_buffer.py \
  tests/freshper/test_sync_free.py tests/freshper/test_checkpoint.py tests/trainer/model/test_packing.py

# Liger's fused linear GRPO loss and Cut Cross-Entropy beside ours (CCE's time is a floor: it
# filters gradients).
step baselines baselines.txt python3 -m freshper.profiling.bench_kernels --quick --part baselines

# Asynchronous generation on a GPU, never run there before: the tiny model built from scratch on
# one-digit sums (math-cpu: no gymnasium, no data), the trainer and the generation worker sharing
# this GPU with the HF engine (the worker's weights arrive as CUDA IPC handles), then the same
# iterations synchronously. Prints each run's episodes per second and every iteration's batch age,
# then the ratio async / sync over iterations 3..7 (max_lag 2: the worker's head start left out).
ASYNC_ARGS="--rollout.engine hf --rollout.worker_device auto --train.sft_steps 0 --train.checkpoint_every 100"
if [ $DRY = 1 ]; then
  async_run=(--iterations 2 --skip 1 --args "$ASYNC_ARGS --train.device cpu --rollout.episodes 4
    --rollout.group_size 2 --algo.replay_batch 4 --algo.micro_batch 4")
else
  async_run=(--iterations 8 --skip 3 --args "$ASYNC_ARGS --train.device cuda")
fi
if fits async; then
  step async async.txt python3 -m freshper.profiling.bench_async --preset math-cpu --rounds 1 --threads 2 \
    --max-lag 2 --first async "${async_run[@]}"
else
  skip async "its budget no longer fits the ${WORST} s worst case"
fi

# One GRPO iteration, Qwen2.5-0.5B's architecture with random weights (no hub), replies of 64 tokens, the HF
# engine on both sides (no vLLM here): ours against TRL's GRPOTrainer, one process each, one after the other.
if fits bench_trl; then
  step bench_trl bench_trl.txt python3 -m freshper.profiling.bench_trl --model random-qwen2.5-0.5b --new-tokens 64 \
    --iterations 3 --skip 1 --threads 1 --replay 0
else
  skip bench_trl "its budget no longer fits the ${WORST} s worst case"
fi

# What the preamble found decides the smoke runs (no untimed imports here).
no_gym=0
grep -q "^gymnasium: not installed" "$out/env.txt" && ! ls .whl/gymnasium-*.whl >/dev/null 2>&1 && no_gym=1
engine=vllm
grep -q "^vllm: installed" "$out/env.txt" || engine=hf
if [ $no_gym = 1 ]; then
  skip train-smoke "gymnasium missing: the wheels were not carried (--fetch-wheels, then carry .whl)"
elif ! fits train-smoke; then
  skip train-smoke "its budget no longer fits the ${WORST} s worst case"
else
  [ $engine = hf ] && echo "vllm is not installed here: smoke run with the hf engine"
  step train-smoke train.txt python3 -m freshper.trainer.cli train --preset gpu-smoke --rollout.engine $engine \
    --train.run_dir "$out/runs"
fi

# Nsight Systems over iterations 1..2 of the smoke job, through `freshper profile` (its recipe), and
# nsys's own summary of the NVTX ranges and the kernels.
if ! grep -q "^nsys: " "$out/env.txt" || grep -q "^nsys: not installed" "$out/env.txt"; then
  skip nsight "nsys is not on this image"
elif [ $no_gym = 1 ]; then
  skip nsight "needs gymnasium"
elif ! fits nsight; then
  skip nsight "its budget no longer fits the ${WORST} s worst case"
else
  step nsight nsight.txt bash -c "python3 -m freshper.trainer.cli profile --preset gpu-smoke --rollout.engine $engine \
    --train.sft_steps 0 --train.run_dir '$out/runs-nsys' --iterations 1:2 && \
    nsys stats -q --report nvtx_sum,cuda_gpu_kern_sum \$(find '$out/runs-nsys' -name '*.nsys-rep' | head -1) | head -80"
fi

# The vision path through vLLM (tiny Qwen2-VL, FrozenLake-VLM), if the steps above left it room.
if [ $no_gym = 1 ] || [ $engine != vllm ]; then
  skip vlm-smoke "needs gymnasium and vllm"
elif ! fits vlm-smoke; then
  skip vlm-smoke "its budget no longer fits the ${WORST} s worst case"
else
  step vlm-smoke vlm.txt python3 -m freshper.trainer.cli train --preset gpu-smoke-vlm --train.run_dir "$out/runs-vlm"
fi
exit 0

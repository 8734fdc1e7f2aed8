#!/usr/bin/env bash
# One prepared GPU check that fits one device call (10 min per command, 15 min per session):
# every step has its own timeout and the budgets add up to 520 s; the summary table is printed
# whatever fails or times out. Logs go to $OUT (or ./gpu_check).
#   bash profiling/gpu_check.sh --fetch-wheels   # here, before the device call: wheels the GPU
#                                                # image lacks (gymnasium), into .whl/ (git-ignored)
#   bash profiling/gpu_check.sh                  # on an H200 with torch + triton (3.6 or newer)
# Steps and budgets (s): install 60, kernel tests compiled 170, bench_kernels 150,
# bench_replay 60, trainer smoke 80.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fetch-wheels" ]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl \
    gymnasium==1.4.0 farama-notifications==0.0.4
  ls .whl
  exit 0
fi
out=${OUT:-gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
summary="$out/summary.txt"
: > "$summary"
t_start=$(date +%s)

# step NAME BUDGET_S LOGFILE CMD...: run CMD under `timeout`, tee its output, record the outcome.
step() {
  local name=$1 budget=$2 log=$3
  shift 3
  echo "== $name (budget ${budget}s) =="
  local t0 rc
  t0=$(date +%s)
  timeout -k 5 "$budget" "$@" > "$out/$log" 2>&1
  rc=$?
  tail -n 25 "$out/$log"
  local status=ok
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status="TIMEOUT"; elif [ $rc -ne 0 ]; then status="FAILED rc=$rc"; fi
  printf '| %-16s | %-12s | %4ss |\n' "$name" "$status" "$(( $(date +%s) - t0 ))" >> "$summary"
  return $rc
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
  tail -n 3 "$out/train.txt" 2>/dev/null
}
trap print_summary EXIT

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

# The GPU image has torch, triton, transformers, pyyaml, tqdm and matplotlib but nothing can be
# fetched there: carried wheels (--fetch-wheels) go to /tmp/site, then the package itself only
# (no dependency resolution, no isolated build environment).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! python3 -c "import freshper.kernels" 2>/dev/null; then
  step install 60 install.txt python3 -m pip install --no-deps --no-build-isolation -e . || cat "$out/install.txt"
fi

step kernel-tests 170 tests.txt python3 -m pytest -q -p no:cacheprovider tests/kernels \
  tests/freshper/test_buffer.py tests/freshper/test_checkpoint.py tests/trainer/test_packing.py

step bench_kernels 150 bench_kernels.txt python3 -m freshper.profiling.bench_kernels

step bench_replay 60 bench_replay.txt python3 -m freshper.profiling.bench_replay --steps 100

engine=vllm
python3 -c "import vllm" 2>/dev/null || { engine=hf; echo "vllm is not installed here: smoke run with the hf engine"; }
step train-smoke 80 train.txt python3 -m freshper.trainer.cli train --preset gpu-smoke --rollout.engine $engine \
  --train.run_dir "$out/runs"
exit 0

#!/usr/bin/env bash
# One prepared GPU check (about 8 minutes on an H200): the kernel tests compiled, not
# interpreted; the kernel and replay benchmarks; then a short table. Logs go to $OUT (or ./gpu_check).
#   bash profiling/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} 2>&1 | tee "$out/env.txt"

# The GPU image has torch, triton and transformers but nothing can be fetched there: install the
# package itself only (no dependency resolution, no isolated build environment).
python -c "import freshper.kernels" 2>/dev/null || python -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2

echo "== kernel tests, compiled =="
timeout 240 python -m pytest -q -x tests/kernels tests/freshper/test_buffer.py tests/freshper/test_checkpoint.py tests/trainer/test_packing.py 2>&1 | tee "$out/tests.txt" | tail -5

echo "== bench_kernels =="
timeout 240 python -m freshper.profiling.bench_kernels 2>&1 | tee "$out/bench_kernels.txt"

echo "== bench_replay =="
timeout 120 python -m freshper.profiling.bench_replay --steps 100 2>&1 | tee "$out/bench_replay.txt"

echo "== trainer smoke, GPU preset in short form (tiny model, bf16, 3 iterations) =="
engine=vllm
python -c "import vllm" 2>/dev/null || { engine=hf; echo "vllm is not installed here: smoke run with the hf engine"; }
timeout 180 python -m freshper.trainer.cli train --preset gpu-smoke --rollout.engine $engine \
  --train.run_dir "$out/runs" 2>&1 | grep -v "it/s" | tail -12 | tee "$out/train.txt"

echo
echo "== summary =="
grep -h "passed\|failed" "$out/tests.txt" | tail -1
grep -h "^| 1e+06\|^| 1e+07\|copy:" "$out/bench_kernels.txt"
grep -h "fused/eager\|H=" "$out/bench_kernels.txt" | head -5

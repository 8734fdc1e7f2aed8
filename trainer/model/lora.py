"""LoRA (Hu et al., 2021) through `peft`: low-rank adapters on the policy's projections, the
base weights frozen.

The adapters are injected into the Hugging Face model itself (peft's LoRA layers replace the
targeted nn.Linear modules in place), so the rest of the trainer keeps handling one plain
model: the forward, the fused LM-head loss and the HF engine see the adapted projections, the
optimizer sees only the adapter parameters (the rest have requires_grad False).

Everything outside the trainer wants plain weights under the model's own names: vLLM's in-place
weight reload and the exported Hugging Face folder. `merged_tensors` gives them W + s·B·A for each
adapted projection (s = alpha / rank), computed in float32 from the current adapters without
touching the model, so merging for a sync never drifts the base weights as repeated in-place
merge/unmerge would.

A checkpoint of a LoRA run holds only the adapters (`adapter_state`): the base weights
are the model folder's, loaded again on resume and by export.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

ADAPTER = "default"  # peft's name for the single adapter the trainer adds
_BASE, _A, _B = ".base_layer.", f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight"


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: str) -> nn.Module:
    """Inject LoRA adapters of `rank` and scale `alpha`/`rank` into the modules of `model` named
    in `targets` (comma-separated module names, or "all-linear"); freeze everything else.
    Returns the same model object, adapted in place. B starts at 0, so the adapted model computes
    exactly what the base did."""
    from peft import LoraConfig, get_peft_model

    target = "all-linear" if targets.strip() == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    if target != "all-linear":
        head = model.get_output_embeddings()
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] not in target:
                continue
            # peft adapts embeddings with lora_embedding_* tensors, which the merge does not know, and the
            # fused loss reads the head's weight alone: only the linear layers below the head are adapted
            if module is head or not isinstance(module, nn.Linear):
                what = "the LM head" if module is head else type(module).__name__
                raise ValueError(f"model.lora_targets {targets!r}: {name} is {what}; "
                                 f"LoRA here adapts the decoder's linear layers (q_proj, k_proj, v_proj, o_proj, "
                                 f"gate_proj, up_proj, down_proj or all-linear)")
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=target, bias="none")
    try:
        wrapped = get_peft_model(model, config, adapter_name=ADAPTER)
    except ValueError as e:  # no module of the model matches the targets
        raise ValueError(f"model.lora_targets {targets!r}: {e}") from None
    return wrapped.get_base_model()


def has_lora(model: nn.Module) -> bool:
    """Whether `model` carries LoRA adapters injected by apply_lora."""
    return any(_A in name for name, _ in model.named_parameters())


def merged_tensors(model: nn.Module, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The entries of `named` (`model`'s state dict as (name, whole tensor) pairs, streamed) under
    the base model's names: each adapted weight replaced by W + s·B·A, the adapter tensors left
    out. The adapters, which are small, are read from `model` first; the base weights then pass
    one at a time. Without adapters, the entries pass unchanged."""
    if not has_lora(model):
        yield from named
        return
    lora = {n: whole_tensor(t) for n, t in model.state_dict().items() if ".lora_" in n}
    for name, t in named:
        if ".lora_" in name:
            continue
        if _BASE not in name:
            yield name, t
            continue
        prefix, _, leaf = name.partition(_BASE)
        if leaf == "weight" and prefix + _A in lora:
            a, b = lora[prefix + _A].float(), lora[prefix + _B].float()
            scale = model.get_submodule(prefix).scaling[ADAPTER]
            t = (t.float() + scale * (b @ a)).to(t.dtype)
        yield f"{prefix}.{leaf}", t


def whole_tensor(t: torch.Tensor) -> torch.Tensor:
    """A state-dict tensor whole: gathered from its shards under FSDP2."""
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach()


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s weights with the adapters merged, under the base model's names (a plain model's
    state dict for a model without adapters)."""
    return dict(merged_tensors(model, ((n, whole_tensor(t)) for n, t in model.state_dict().items())))


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a LoRA checkpoint keeps: the adapters (by name, so a frozen copy such as the
    KL reference has them too)."""
    return {n: p.detach() for n, p in model.named_parameters() if ".lora_" in n}


def lora_metadata(model: nn.Module) -> dict[str, str]:
    """The adapter settings of `model` as safetensors metadata (strings): rank, alpha, targets, and
    the base weights' dtype (the adapters are float32 whatever the base is, so export needs it)."""
    config = model.peft_config[ADAPTER]
    targets = config.target_modules
    base = next(p.dtype for n, p in model.named_parameters() if ".lora_" not in n)
    return {"lora_rank": str(config.r), "lora_alpha": repr(float(config.lora_alpha)),
            "lora_targets": targets if isinstance(targets, str) else ",".join(sorted(targets)),
            "base_dtype": str(base).removeprefix("torch.")}


@contextmanager
def adapters_off(model: nn.Module):
    """`model` computes as its base inside the block: every LoRA layer switched off, then back on
    (the KL reference of a LoRA run, which needs no second copy of the base weights)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m in layers:
            m.enable_adapters(True)

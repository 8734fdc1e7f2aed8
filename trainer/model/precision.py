"""Low-precision compute on float32 master weights, on one process.

AdamW on bf16 weights drops every step smaller than half the spacing of bf16 numbers around the
weight: 2**-9 of its size. At the paper's lr of 1e-6 a step is about 1e-6, and a weight of 0.01 has
a half-spacing of 3e-5, so almost nothing would move. The trainable parameters therefore stay in
float32, and each forward runs under torch.autocast in the compute dtype (matmuls and attention
in bf16, reductions and the residual stream in float32). On several ranks FSDP2's
MixedPrecisionPolicy does the same job (trainer/model/sharding.py), and the trainer turns autocast
off there.

Frozen weights (a LoRA run's base, the KL reference) need no masters and stay in the compute dtype.
A full fine-tune loads in float32 (trainer/model/load.py), so the masters start from the
checkpoint's own values, not from their bf16 roundings: a float32 checkpoint keeps its bits, and
masters between bf16 numbers let a bf16 forward see part of a run's small steps on average, where
masters on the bf16 grid hide every step until it reaches half a spacing.
The compute dtype travels on the model as one attribute, so that every place that runs it (the
update, the warm starts, the HF engine) reads the same setting.
"""
from __future__ import annotations

import contextlib
import logging
import os

import torch

log = logging.getLogger("freshper")

ATTR = "freshper_compute_dtype"
CPU_BF16_ENV = "FRESHPER_CPU_BF16"  # "1" or "0" overrides cpu_bf16()'s reading of the CPU


def cpu_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU has AVX512-BF16 (bf16 dot products: AMD Zen 4, Intel Cooper Lake,
    Sapphire Rapids and later), where `--model.dtype auto` picks bf16: on such a CPU the default
    job ran 1.18x faster whole in bf16 with float32 logits (BENCHMARKS.md) and a registered 16-seed
    comparison read its learning equivalent to float32's (RESULTS.md, "bf16 against float32 on the
    CPU"). Read from `cpuinfo`'s flags; False where that file does not exist (not Linux). The
    environment variable FRESHPER_CPU_BF16, "1" or "0", overrides the reading (a VM that hides
    flags; tests that must not depend on the machine that runs them)."""
    forced = os.environ.get(CPU_BF16_ENV)
    if forced is not None:
        if forced not in ("0", "1"):
            raise ValueError(f"{CPU_BF16_ENV} must be '0' or '1', got {forced!r}")
        return forced == "1"
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return "avx512_bf16" in flags.split()


def keep_masters(model: torch.nn.Module, compute: torch.dtype) -> torch.nn.Module:
    """`model`'s trainable parameters as float32 masters and its frozen floating-point ones in
    `compute` (in place), and `compute` recorded as the dtype its forwards run in. float32
    compute leaves the model as it is. Returns `model`."""
    if compute == torch.float32:
        return model
    if compute not in (torch.bfloat16, torch.float16):
        raise ValueError(f"compute must be torch.float32, torch.bfloat16 or torch.float16, got {compute}")
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
        elif not p.requires_grad and p.is_floating_point() and p.dtype != compute:
            p.data = p.data.to(compute)
    setattr(model, ATTR, compute)
    return model


def compute_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype `model`'s forwards run in under autocast, or None: its weights' own (float32)."""
    return getattr(model, ATTR, None)


def autocast(model: torch.nn.Module, enabled: bool = True):
    """A context in which `model`'s forwards run in its compute dtype; a no-op without one.
    Enter it once per forward (or per generate call), not around an optimizer step: autocast
    keeps its casts of the weights until the outermost context exits."""
    dtype = compute_dtype(model)
    if dtype is None or not enabled:
        return contextlib.nullcontext()
    device = next(model.parameters()).device
    return torch.autocast(device.type, dtype=dtype)


def head_path(logits_dtype: str, device: torch.device | str, compute: torch.dtype | None) -> tuple[int, str] | None:
    """(logging level, line) saying how the LM head's loss and log-probs run under `compute` with
    `model.logits_dtype` `logits_dtype` on `device`, or None in float32 (no choice to make). For
    float32 logits the path is the one the installed torch supports (freshper.kernels'
    `logits32_path`, probed on `device`'s type); a WARNING where it is expected to be slower than
    eager, naming the option that avoids it."""
    if compute is None or compute == torch.float32:
        return None
    low = str(compute).removeprefix("torch.")
    if logits_dtype != "float32":
        return logging.INFO, f"LM head: logits rounded to {low} (model.logits_dtype {logits_dtype})"
    from freshper.kernels.fused_linear_policy_loss import LOGITS32_PATHS, logits32_path, slower_than_eager

    path = logits32_path(device, compute)
    line = f"LM head: float32 logits from {low} operands, path {path}: {LOGITS32_PATHS[path]}"
    if slower_than_eager(path, device):
        return logging.WARNING, (line + f"; torch {torch.__version__} has no out_dtype for mm on "
                                 f"{torch.device(device).type}: --model.logits_dtype compute rounds the logits "
                                 f"to {low} instead, at eager's speed, or install torch 2.10 or later")
    return logging.INFO, line


def log_head_path(logits_dtype: str, device: torch.device | str, compute: torch.dtype | None) -> None:
    """Log `head_path`'s line, if any (once a run: the trainer's Policy calls it)."""
    said = head_path(logits_dtype, device, compute)
    if said is not None:
        log.log(*said)


@contextlib.contextmanager
def float32_logits(model: torch.nn.Module, enabled: bool = True):
    """A context in which `model`'s LM head returns float32 logits: its operands rounded to the
    compute dtype, as autocast rounds them, and the GEMM's float32 accumulator kept instead of
    rounded (freshper.kernels.LogitsGemm, what the trainer's loss and recompute use under
    `model.logits_dtype float32`), so engine and trainer take log-probs from the same numbers. A
    no-op without a low-precision compute dtype. The head's weight is cast once per context."""
    dtype = compute_dtype(model)
    head = model.get_output_embeddings() if dtype is not None and enabled else None
    if head is None:
        yield
        return
    from freshper.kernels import LogitsGemm

    gemm = LogitsGemm(head.weight.detach().to(dtype))

    def forward(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(dtype)
        out = torch.empty((flat.shape[0], gemm.weight.shape[0]), dtype=torch.float32, device=x.device)
        with torch.autocast(x.device.type, enabled=False):
            return gemm(flat, out).view(*x.shape[:-1], -1)

    head.forward = forward  # an instance attribute over the class's forward, removed on exit
    try:
        yield
    finally:
        del head.forward

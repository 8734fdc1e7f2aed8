"""Which implementation runs: the Triton kernel on CUDA, the torch reference elsewhere.

On a machine without a GPU `import triton` succeeds but a launch fails ("0 active drivers")
unless TRITON_INTERPRET=1 was set before triton was first imported. The tests set it and call
the `*_triton` functions directly; library code asks `use_triton` at run time. Whether triton is
installed is looked up without importing it: only a module that defines kernels imports it.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import threading

import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None  # macOS, Windows: the torch reference serves
_LAUNCH = threading.local()


def in_launch() -> bool:
    """Whether this thread is inside `launch_range` (a Triton launch): freshper.profiling's host
    sync counter ignores what the interpreter does there, which a compiled launch does not do."""
    return getattr(_LAUNCH, "depth", 0) > 0


@contextlib.contextmanager
def launch_range(name: str):
    """A named range around a kernel launch: a torch.profiler label, and an NVTX range when CUDA
    is in use (torch's own NVTX binding; kernels import nothing from freshper.profiling)."""
    _LAUNCH.depth = getattr(_LAUNCH, "depth", 0) + 1
    try:
        with _named(name):
            yield
    finally:
        _LAUNCH.depth -= 1


@contextlib.contextmanager
def _named(name: str):
    with torch.profiler.record_function(name):
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.nvtx.range_push(name)
            try:
                yield
            finally:
                torch.cuda.nvtx.range_pop()
        else:
            yield


def interpreted() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(t: torch.Tensor) -> bool:
    """Whether a kernel launch on tensors like `t` runs compiled Triton."""
    return HAS_TRITON and t.is_cuda and not interpreted()


def require_triton(t: torch.Tensor) -> None:
    """Raise unless a Triton kernel can run on `t` (compiled on CUDA, or interpreted)."""
    if not HAS_TRITON:
        raise RuntimeError("triton is not installed; use the torch reference")
    if not (t.is_cuda or interpreted()):
        raise RuntimeError(
            "Triton kernels need a CUDA tensor, or TRITON_INTERPRET=1 set before triton is imported; "
            f"got a tensor on {t.device}")

"""Which implementation runs: the Triton kernel on CUDA, the torch reference elsewhere.

On a machine without a GPU `import triton` succeeds but a launch fails ("0 active drivers")
unless TRITON_INTERPRET=1 was set before triton was first imported. The tests set it and call
the `*_triton` functions directly; library code asks `use_triton` at run time.
"""
from __future__ import annotations

import os

import torch

try:
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401

    HAS_TRITON = True
except ImportError:  # macOS, Windows: the torch reference serves everywhere
    HAS_TRITON = False


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

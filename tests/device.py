"""Where the Triton tests launch: compiled on a GPU (TRITON_INTERPRET=0), else the CPU interpreter."""
import os

import torch

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


def on(*ts):
    """The tensors moved to DEVICE (None stays None)."""
    out = tuple(t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in ts)
    return out if len(out) > 1 else out[0]


def back(*ts):
    out = tuple(t.cpu() for t in ts)
    return out if len(out) > 1 else out[0]

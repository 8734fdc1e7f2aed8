"""Named ranges around the phases of an iteration: NVTX on CUDA (for Nsight Systems), and
torch.profiler labels everywhere (for the CPU Chrome trace). Without a GPU the NVTX part is a
no-op; with the `nvtx` package installed it is used, else torch.cuda.nvtx."""
from __future__ import annotations

import contextlib

import torch

try:
    import nvtx as _nvtx
except ImportError:
    _nvtx = None

_COLORS = {"rollout": "green", "generate": "lime", "env_step": "olive", "logprob_recompute": "cyan",
           "onpolicy_update": "blue", "buffer_add": "purple", "sample": "magenta", "replay_update": "navy",
           "priority_update": "pink", "weight_sync": "orange", "checkpoint": "red"}


@contextlib.contextmanager
def nvtx_range(name: str):
    """A named range: NVTX when CUDA is in use, plus a torch.profiler record_function."""
    with torch.profiler.record_function(name):
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            if _nvtx is not None:
                with _nvtx.annotate(name, color=_COLORS.get(name, "white")):
                    yield
            else:
                torch.cuda.nvtx.range_push(name)
                try:
                    yield
                finally:
                    torch.cuda.nvtx.range_pop()
        else:
            yield


class Ranges:
    """`ranges.range(name)` -> context manager; a stand-in object passed down to the rollout."""

    @staticmethod
    def range(name: str):
        return nvtx_range(name)

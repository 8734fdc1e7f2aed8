"""Named ranges around the phases of an iteration: NVTX on CUDA (for Nsight Systems), and
torch.profiler labels everywhere (for the CPU Chrome trace). Without a GPU the NVTX part is a
no-op; with the `nvtx` package installed it is used, else torch.cuda.nvtx."""
from __future__ import annotations

import contextlib
import time

import torch

from freshper.kernels.backend import launch_range

try:
    import nvtx as _nvtx
except ImportError:
    _nvtx = None

_COLORS = {"rollout": "green", "generate": "lime", "env_step": "olive", "logprob_recompute": "cyan",
           "onpolicy_update": "blue", "buffer_add": "purple", "sample": "magenta", "replay_update": "navy",
           "priority_update": "pink", "weight_sync": "orange", "checkpoint": "red", "eval": "yellow"}


@contextlib.contextmanager
def nvtx_range(name: str):
    """A named range: a torch.profiler label, and NVTX when CUDA is in use (coloured through the
    `nvtx` package when it is installed, else torch's binding, as kernel launches are)."""
    if _nvtx is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        with torch.profiler.record_function(name), _nvtx.annotate(name, color=_COLORS.get(name, "white")):
            yield
    else:
        with launch_range(name):
            yield


# A phase timed around others (the rollout around generation and the env's steps) holds their
# seconds plus the glue between them. Phases refuses any other nesting, so that a sum over
# phases can count each second once (freshper.trainer.train.metrics.compute_seconds sums them).
ENCLOSING = {"rollout": ("generate", "env_step")}


class Phases:
    """`with phases("rollout"):` names the range (NVTX on CUDA, torch.profiler everywhere) and
    adds its wall time to `phases.seconds["rollout"]`: one name per phase for traces and
    metrics alike. `take()` returns the seconds gathered since the last call and resets them.
    On CUDA a phase's time is what the host waited; phases that end in a host sync (updates,
    sampling, weight sync) therefore include their GPU work. A phase opened inside another must
    be one of its ENCLOSING parts (else RuntimeError): seconds are then summed once."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._open: list[str] = []

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self._open and name not in ENCLOSING.get(self._open[-1], ()):
            raise RuntimeError(f"phase {name!r} opened inside {self._open[-1]!r}: declare it in ENCLOSING "
                               f"(freshper.profiling.nvtx) so a sum over phases counts its seconds once")
        self._open.append(name)
        t0 = time.perf_counter()
        try:
            with nvtx_range(name):
                yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
            self._open.pop()

    def take(self) -> dict[str, float]:
        out, self.seconds = self.seconds, {}
        return out

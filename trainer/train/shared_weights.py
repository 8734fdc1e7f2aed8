"""The trainer's weights by version, where a generation worker in another process can read them.

One copy of the model's state dict in memory both processes map: shared memory on the CPU
(`share_memory_`), and on a GPU the same tensors reach the worker as CUDA IPC handles when the
process starts (torch.multiprocessing shares CUDA tensors by handle, not by copy). The trainer
writes a version after each weight update; the worker copies the newest into its own model
between batches. A lock held for the copy, never across a generation, keeps either side from
reading a half-written version: the trainer waits at most one copy (about 0.1 s for 135M float32
parameters on a CPU), and the worker never stops mid-batch.
"""
from __future__ import annotations

import torch


def _settle(tensors: dict) -> None:
    """Wait for the copies into or out of `tensors` to finish, where they run on a GPU."""
    if any(t.is_cuda for t in tensors.values()):
        torch.cuda.synchronize()


class ReaderDied(RuntimeError):
    """The process reading the shared weights died holding their lock."""


class SharedWeights:
    """`publish(model, v)` in the trainer; `read_into(model, have)` in the worker.
    Pass the object to the worker process as an argument of its start (spawn)."""

    def __init__(self, model: torch.nn.Module, ctx):
        self.tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for t in self.tensors.values():
            if t.device.type == "cpu":
                t.share_memory_()
        self._version = ctx.Value("q", -1)  # carries the lock

    @property
    def version(self) -> int:
        """The newest version written (-1: none yet). A read without the lock: a number, never torn."""
        return self._version.value

    @torch.no_grad()
    def publish(self, model: torch.nn.Module, version: int, reader_alive=lambda: True) -> None:
        """Write `model`'s weights as `version` (>= the last one written). `reader_alive()` is
        asked while the lock is held elsewhere: a reader killed in its copy never releases it,
        and a publish that waited for it would wait forever; it raises ReaderDied instead."""
        state = model.state_dict()
        if state.keys() != self.tensors.keys():
            raise ValueError("the model's parameters are not the ones the shared copy was made for")
        lock = self._version.get_lock()
        while not lock.acquire(timeout=0.5):
            if not reader_alive():
                raise ReaderDied("the reader of the shared weights died holding their lock")
        try:
            if version < self._version.value:
                raise ValueError(f"version {version} is older than the published {self._version.value}")
            for k, t in self.tensors.items():
                t.copy_(state[k])
            _settle(self.tensors)  # a CUDA copy is queued, not done: the reader may not see half of it
            self._version.value = version
        finally:
            lock.release()

    @torch.no_grad()
    def read_into(self, model: torch.nn.Module, have: int) -> int:
        """Copy the newest version into `model` if it is not `have`; returns the version `model` holds."""
        with self._version.get_lock():
            v = self._version.value
            if v != have:
                state = model.state_dict()
                for k, t in self.tensors.items():
                    state[k].copy_(t)
                _settle(state)  # done before the lock lets the writer overwrite what it reads
        return v

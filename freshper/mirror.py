"""A CPU mirror of device tensors, for checkpoints that do not stall the GPU.

On CUDA the copies go to pinned host buffers on a side stream that first waits for the work
already queued on the current stream; `wait()` blocks only on that copy. Host buffers are kept
between snapshots, so a checkpoint every k steps allocates pinned memory once. On CPU the
mirror clones, so the snapshot is immune to later writes into the buffer.
"""
from __future__ import annotations

import torch


class CpuMirror:
    def __init__(self):
        self._host: dict[str, torch.Tensor] = {}
        self._event = None
        self._stream = None

    def start(self, tensors: dict[str, torch.Tensor]) -> None:
        """Begin copying `tensors` (any devices) to host memory. The caller must not write
        into them before `wait()` returns (the buffer holds that contract during a save)."""
        for name in list(self._host):
            if name not in tensors:
                del self._host[name]
        cuda = [t for t in tensors.values() if t.is_cuda]
        if cuda and self._stream is None:
            self._stream = torch.cuda.Stream(device=cuda[0].device)
        if cuda:
            self._stream.wait_stream(torch.cuda.current_stream(cuda[0].device))
        for name, t in tensors.items():
            host = self._host.get(name)
            if host is None or host.shape != t.shape or host.dtype != t.dtype:
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
                self._host[name] = host
            if t.is_cuda:
                with torch.cuda.stream(self._stream):
                    host.copy_(t, non_blocking=True)
            else:
                host.copy_(t)
        if cuda:
            self._event = torch.cuda.Event()
            self._event.record(self._stream)

    def wait(self) -> dict[str, torch.Tensor]:
        """Host tensors of the last `start`, complete. They are reused by the next `start`."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return dict(self._host)

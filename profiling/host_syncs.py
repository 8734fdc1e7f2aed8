"""Count the operations that make the host wait for the GPU, on any device, CPU included.

A CUDA step is fast only while the host never waits: every `.item()`, `bool(t)`, `.tolist()`,
`nonzero`, `unique` or boolean-mask index reads device data or a data-dependent size, and every
tensor made from host data (`torch.tensor(list)`, `t[idx] = 1.0`, which lifts 1.0 into a host
tensor and copies it in) is a host-to-device copy. On a CPU none of these costs anything, so
they cannot be timed here; they can be counted. `HostSyncs` is a TorchDispatchMode that sees
the same aten calls a CUDA run would make and records each sync-like one with the line of
project code that made it:

    with HostSyncs() as syncs:
        buffer.add(...); buffer.sample(256); buffer.update_priorities(...)
    assert not syncs.events, syncs.report()

`.tolist()` and `.numpy()` of a CPU tensor reach no aten op, so the mode also wraps those two
methods while it is active. Work inside a Triton launch (freshper.kernels.backend.launch_range)
is not counted: the interpreter's copies stand in for the kernel, which on a GPU makes none.
"""
from __future__ import annotations

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from freshper.kernels.backend import in_launch

_ALWAYS = {"_local_scalar_dense", "nonzero", "_unique", "_unique2", "unique_dim", "unique_consecutive",
           "unique_dim_consecutive", "masked_select", "lift_fresh", "lift_fresh_copy", "tolist", "numpy"}


def _name(func) -> str:
    return func._overloadpacket.__name__ if hasattr(func, "_overloadpacket") else str(func)


def _bool_index(args) -> bool:
    idx = args[1] if len(args) > 1 else ()
    return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in (idx or ()))


def _cross_device(args) -> bool:
    devs = {a.device.type for a in args if isinstance(a, torch.Tensor) and a.dim() > 0}
    return len(devs) > 1


def sync_like(func, args, kwargs) -> bool:
    """Whether an aten call makes the host wait for the device, or copies host data in."""
    name = _name(func)
    if name in _ALWAYS:
        return True
    if name in ("index", "index_put", "index_put_") and _bool_index(args):
        return True
    if name == "repeat_interleave" and (kwargs or {}).get("output_size") is None and \
            isinstance(args[0], torch.Tensor) and len(args) == 1:
        return True  # repeats given as a tensor: the output size is read from the device
    if name in ("copy_", "_to_copy", "to") and _cross_device(args):
        return True
    return False


def _site() -> str:
    """The innermost frame of project code (not torch, not this file) that led here."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        f = frame.filename
        if "/torch/" in f or f == __file__ or "/_pytest/" in f or "/pluggy/" in f:
            continue
        return f"{'/'.join(f.split('/')[-2:])}:{frame.lineno}"
    return "?"


class HostSyncs(TorchDispatchMode):
    """Records (op, site) for each sync-like call made while active; `events` is the list."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, str]] = []
        self._saved = {}

    def _record(self, name: str) -> None:
        if not in_launch():
            self.events.append((name, _site()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if sync_like(func, args, kwargs):
            self._record(_name(func))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for meth in ("tolist", "numpy"):
            orig = getattr(torch.Tensor, meth)
            self._saved[meth] = orig

            def wrapped(t, *a, _orig=orig, _meth=meth, **k):
                self._record(_meth)
                return _orig(t, *a, **k)

            setattr(torch.Tensor, meth, wrapped)
        return super().__enter__()

    def __exit__(self, *exc):
        for meth, orig in self._saved.items():
            setattr(torch.Tensor, meth, orig)
        self._saved.clear()
        return super().__exit__(*exc)

    def report(self) -> str:
        """One line per distinct (op, site), with its count."""
        counts: dict[tuple[str, str], int] = {}
        for e in self.events:
            counts[e] = counts.get(e, 0) + 1
        return "\n".join(f"{n}x {op} at {site}" for (op, site), n in sorted(counts.items(), key=lambda kv: -kv[1]))

"""Buffer state to and from disk: safetensors plus JSON metadata, written atomically.

A file holds the per-slot tensors, the caller's fields, the sampling RNG state and, in the
safetensors header, one JSON document with the configuration and counters. Nothing is pickled,
so loading a file from elsewhere runs no code. The tree and the keys are derived state and are
rebuilt on load. Writes go to a temporary file in the same folder, are fsynced, then renamed
over the target, so a crash mid-save leaves the previous checkpoint intact.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from freshper.mirror import CpuMirror
from freshper.schedule import LinearSchedule, schedule_from_dict

FORMAT = "freshper.replay_buffer"
FORMAT_VERSION = 2  # 2 added the insertion rule's state (insert, own, boosted); 1 still loads
READABLE_VERSIONS = (1, 2)
_META_KEY = "freshper"


def atomic_write(path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_safetensors(path, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Atomically write CPU `tensors` with `meta` (JSON-able) in the header."""
    data = st_save({k: v.contiguous() for k, v in tensors.items()}, metadata={_META_KEY: json.dumps(meta)})
    atomic_write(path, data)


def read_safetensors(path) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, meta) from a file written by `write_safetensors`; ValueError if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    raw = path.read_bytes()
    try:
        tensors = st_load(raw)
        header_len = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + header_len])
        meta = json.loads(header["__metadata__"][_META_KEY])
    except Exception as e:  # safetensors raises its own error types
        raise ValueError(f"{path} is not a readable FreshPER checkpoint: {e}") from e
    return tensors, meta


def _beta_to_json(beta):
    if isinstance(beta, LinearSchedule):
        return beta.to_dict()
    if callable(beta):
        return None
    return float(beta)


def buffer_state(buf, mirror: CpuMirror | None = None, copy: bool = True) -> dict:
    """{'meta': ..., 'tensors': ...} of `buf`, with tensors on the CPU (through the mirror). A
    sync-free buffer's pending error word goes with it (and its host views are first set from
    the device: see freshper/sync_free.py)."""
    err = buf._settle()
    device_tensors = {"log_base": buf._log_base, "birth": buf._birth, "live": buf._live, "own": buf._own,
                      "boosted": buf._boosted}
    device_tensors.update({f"field.{k}": v for k, v in buf._fields.items()})
    mirror = mirror or CpuMirror()
    mirror.start(device_tensors)
    tensors = mirror.wait()
    if copy:
        tensors = {k: v.clone() for k, v in tensors.items()}
    tensors["rng"] = buf._gen.get_state().clone()
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": {"capacity": buf.capacity, "mode": buf.mode, "alpha": buf.alpha, "beta": _beta_to_json(buf.beta),
                   "tau": buf.tau, "eps": buf.eps, "eviction": buf.eviction, "seed": buf.seed, "sampler": buf.sampler,
                   "insert": buf.insert, "sync_free": buf.sync_free},
        "counters": {"size": buf._size, "next": buf._next, "added": buf._added, "step": buf._step,
                     "tree_ref": buf._ref, "max_priority": buf._max_priority, "boost_step": buf._boost_step,
                     "err": err},
        "fields": {k: [list(v.shape[1:]), str(v.dtype).removeprefix("torch.")] for k, v in buf._fields.items()},
    }
    return {"meta": meta, "tensors": tensors}


def _check_state(sd: dict, capacity: int | None = None) -> None:
    if not isinstance(sd, dict) or "meta" not in sd or "tensors" not in sd:
        raise ValueError("state must be a dict with 'meta' and 'tensors' (from ReplayBuffer.state_dict)")
    meta, tensors = sd["meta"], sd["tensors"]
    if meta.get("format") != FORMAT:
        raise ValueError(f"state format is {meta.get('format')!r}, expected {FORMAT!r}")
    if meta.get("format_version") not in READABLE_VERSIONS:
        raise ValueError(f"state format_version is {meta.get('format_version')!r}; "
                         f"this FreshPER reads {READABLE_VERSIONS}")
    cap = meta["config"]["capacity"]
    if capacity is not None and cap != capacity:
        raise ValueError(f"state has capacity {cap}, this buffer has capacity {capacity}")
    want = {"log_base": ((cap,), torch.float64), "birth": ((cap,), torch.int64), "live": ((cap,), torch.bool)}
    if meta["format_version"] >= 2:
        want.update(own=((cap,), torch.float64), boosted=((cap,), torch.bool))
    for name, (shape, dt) in meta["fields"].items():
        want[f"field.{name}"] = ((cap, *shape), getattr(torch, dt))
    extra = set(tensors) - set(want) - {"rng"}
    if extra or "rng" not in tensors:
        raise ValueError(f"state tensors do not match its metadata: unexpected {sorted(extra)}"
                         + ("" if "rng" in tensors else ", missing 'rng'"))
    for name, (shape, dt) in want.items():
        t = tensors.get(name)
        if t is None:
            raise ValueError(f"state is missing tensor {name!r}")
        if tuple(t.shape) != tuple(shape) or t.dtype != dt:
            raise ValueError(f"state tensor {name!r} is {tuple(t.shape)} {t.dtype}, expected {tuple(shape)} {dt}")
    live = int(tensors["live"].sum())
    if live != meta["counters"]["size"]:
        raise ValueError(f"state counters say size {meta['counters']['size']} but {live} slots are live")


def load_buffer_state(buf, sd: dict) -> None:
    """Restore `sd` into `buf` (same capacity). Configuration comes from the state, except a
    custom-callable beta, which `buf` keeps."""
    _check_state(sd, buf.capacity)
    meta, tensors = sd["meta"], sd["tensors"]
    cfg, counters = meta["config"], meta["counters"]
    beta = cfg["beta"]
    if beta is None and not callable(buf.beta):
        raise ValueError("the saved buffer used a custom beta callable; construct the buffer with that beta")
    if tensors["rng"].shape != buf._gen.get_state().shape:
        raise ValueError(f"state's RNG state has {tensors['rng'].numel()} bytes; a {buf.device.type} generator "
                         f"has {buf._gen.get_state().numel()}: load onto the device type it was saved from")
    if buf.sync_free and cfg["eviction"] != "fifo":
        raise ValueError(f"state has eviction {cfg['eviction']!r}; a sync_free buffer needs 'fifo'")
    d = buf.device
    for key in ("mode", "alpha", "tau", "eps", "eviction"):
        setattr(buf, key, cfg[key])
    buf.insert = cfg.get("insert", "own")  # version 1 had no insertion rule: slots held what was written
    buf._refresh_cfg()  # the write kernel's device copy of alpha, eps and tau
    if beta is not None:
        buf.beta = schedule_from_dict(beta) if isinstance(beta, dict) else beta
    buf._log_base = tensors["log_base"].to(d).clone()
    buf._birth = tensors["birth"].to(d).clone()
    buf._live = tensors["live"].to(d).clone()
    if "own" in tensors:
        buf._own, buf._boosted = tensors["own"].to(d).clone(), tensors["boosted"].to(d).clone()
    else:
        buf._own, buf._boosted = buf._log_base.exp() - buf.eps, torch.zeros_like(buf._live)
    buf._boost_slots = buf._boosted.nonzero().squeeze(1)  # derived: the slots still boosted
    buf._fields, buf._field_rows = {}, {}
    buf._declare({k: (tuple(s), getattr(torch, dt)) for k, (s, dt) in meta["fields"].items()},
                 {k.removeprefix("field."): v for k, v in tensors.items() if k.startswith("field.")})
    # max_priority and err are absent in states saved before they were kept
    buf._load_counters(counters["size"], counters["next"], counters["added"], counters["step"],
                       counters.get("boost_step"), counters.get("max_priority", 1.0), counters.get("err", 0))
    buf._gen.set_state(tensors["rng"].clone())
    buf._recompute_keys(ref=counters["tree_ref"])


def save_state(path, sd: dict) -> None:
    write_safetensors(path, sd["tensors"], sd["meta"])


def buffer_from_file(cls, path, *, device=None, beta=None):
    tensors, meta = read_safetensors(path)
    return buffer_from_state(cls, {"meta": meta, "tensors": tensors}, device=device, beta=beta, source=str(path))


def buffer_from_state(cls, sd: dict, *, device=None, beta=None, source: str = "the state"):
    _check_state(sd)
    meta = sd["meta"]
    cfg = meta["config"]
    if cfg["beta"] is None and beta is None:
        raise ValueError(f"{source} was saved with a custom beta callable; pass beta= to ReplayBuffer.load")
    if beta is None:
        beta = schedule_from_dict(cfg["beta"]) if isinstance(cfg["beta"], dict) else cfg["beta"]
    device = torch.device(device) if device is not None else torch.device("cpu")
    sampler = cfg["sampler"]
    # The saved sampler where it can run on `device`, else the device's default.
    if (sampler == "tree" and device.type != "cpu") or (
            sampler == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1"):
        sampler = "auto"
    # Sync-free as saved where the saved sampler runs (absent in older states: the device's default)
    sync_free = cfg.get("sync_free") if sampler != "auto" else None
    buf = cls(cfg["capacity"], mode=cfg["mode"], alpha=cfg["alpha"], beta=beta, tau=cfg["tau"], eps=cfg["eps"],
              eviction=cfg["eviction"], device=device, seed=cfg["seed"], sampler=sampler,
              insert=cfg.get("insert", "own"), sync_free=sync_free,
              fields={k: (tuple(s), getattr(torch, dt)) for k, (s, dt) in meta["fields"].items()})
    buf.load_state_dict(sd)
    return buf

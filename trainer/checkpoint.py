"""Trainer checkpoints: model, optimizer, scheduler, RNG states, buffer, counters; atomic.

A checkpoint is a folder `checkpoints/iter_NNNNNN/` written under a temporary name, fsynced and
renamed; then the one-line file `checkpoints/latest` is replaced atomically to point at it. A
crash at any moment leaves `latest` naming a complete checkpoint. Weights are safetensors; the
optimizer and RNG states are torch files loaded with weights_only=True (no code runs on load).
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from freshper import ReplayBuffer
from freshper.checkpoint import atomic_write

FILES = ("model.safetensors", "optim.pt", "rng.pt", "state.json")


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete or unreadable."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict:
    """Every RNG the run draws from, as tensors and plain tuples (loadable with weights_only)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss,
                                                     gauss),
            "python": random.getstate(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    kind, keys, pos, has_gauss, gauss = s["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(s["python"])
    if s["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def save(ckpt_root: Path, iteration: int, policy, buffer: ReplayBuffer | None, state: dict, keep: int) -> Path:
    """Write checkpoint `iteration` (the number of iterations done) and point `latest` at it."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    name = f"iter_{iteration:06d}"
    final = ckpt_root / name
    tmp = ckpt_root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(policy.model, str(tmp / "model.safetensors"))
    if policy.ref_model is not None:
        save_model(policy.ref_model, str(tmp / "ref_model.safetensors"))
    torch.save({"optimizer": policy.opt.state_dict(), "scheduler": policy.sched.state_dict()}, tmp / "optim.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    if buffer is not None:
        buffer.save(tmp / "buffer.safetensors")
    (tmp / "state.json").write_text(json.dumps({**state, "iteration": iteration}, indent=1))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(ckpt_root)
    atomic_write(ckpt_root / "latest", (name + "\n").encode())
    done = sorted(p for p in ckpt_root.glob("iter_*") if p.is_dir())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(ckpt_root: Path) -> Path:
    """The checkpoint folder `latest` names, checked complete; CheckpointError otherwise."""
    pointer = ckpt_root / "latest"
    if not pointer.exists():
        raise CheckpointError(f"no checkpoint in {ckpt_root} (no 'latest' file); nothing to resume")
    path = ckpt_root / pointer.read_text().strip()
    missing = [f for f in FILES if not (path / f).is_file()]
    if not path.is_dir() or missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {missing or 'the folder'}")
    return path


def load(path: Path, policy, buffer_device, beta) -> tuple[dict, ReplayBuffer | None]:
    """Restore policy, optimizer, scheduler and RNG in place; returns (state, buffer or None)."""
    try:
        state = json.loads((path / "state.json").read_text())
        missing, unexpected = load_model(policy.model, str(path / "model.safetensors"), strict=False)
        if unexpected or [m for m in missing if "lm_head" not in m]:
            raise CheckpointError(f"{path}/model.safetensors does not match the model: missing {missing[:3]}, "
                                  f"unexpected {unexpected[:3]}")
        if policy.ref_model is not None:
            load_model(policy.ref_model, str(path / "ref_model.safetensors"), strict=False)
        opt = torch.load(path / "optim.pt", weights_only=True)
        policy.opt.load_state_dict(opt["optimizer"])
        policy.sched.load_state_dict(opt["scheduler"])
        set_rng_state(torch.load(path / "rng.pt", weights_only=True))
        buf = None
        if (path / "buffer.safetensors").exists():
            buf = ReplayBuffer.load(path / "buffer.safetensors", device=buffer_device, beta=beta)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} could not be loaded: {type(e).__name__}: {e}") from e
    return state, buf

"""Trainer checkpoints: model, optimizer, scheduler, RNG states, buffer, counters; atomic.

A checkpoint is a folder `checkpoints/iter_NNNNNN/` written under a temporary name, fsynced and
renamed; then the one-line file `checkpoints/latest` is replaced atomically to point at it. A
crash at any moment leaves `latest` naming a complete checkpoint. Weights are safetensors; the
optimizer and RNG states are torch files loaded with weights_only=True (no code runs on load).

On several ranks the model and optimizer go through torch.distributed.checkpoint (`dcp/`, one
file per rank plus metadata) and each rank writes its RNG state and buffer shard; a checkpoint
of either layout resumes at any number of ranks (DCP reshards the weights, the buffer shards are
redealt by freshper.distributed.reshard). Only the per-rank sampling streams cannot carry over
to another number of ranks: such a resume seeds new ones from (seed, iteration, rank).
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

from ..dist import SINGLE, Dist
from ..model.lora import adapter_state, has_lora, lora_metadata

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


def _dcp_state(policy) -> dict:
    """{'model', 'optim'[, 'ref_model']}: FQN-keyed state dicts of the (sharded or whole) policy,
    the layout torch.distributed.checkpoint saves and reshards on load."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    msd, osd = get_state_dict(policy.net, policy.opt)
    sd = {"model": msd, "optim": osd}
    if policy.ref_net is not None:
        sd["ref_model"] = get_model_state_dict(policy.ref_net)
    return sd


def save(ckpt_root: Path, iteration: int, policy, buffer: ReplayBuffer | None, state: dict, keep: int,
         dist: Dist = SINGLE, sampler_rng: torch.Tensor | None = None, pending: dict | None = None) -> Path:
    """Write checkpoint `iteration` (the number of iterations done) and point `latest` at it.
    One process: safetensors weights and torch optimizer state. Several ranks (collective): a
    torch.distributed.checkpoint folder `dcp/` that any number of ranks can load, and per rank
    its RNG state and buffer shard; rank 0 writes the rest and publishes the folder.
    `pending`: this rank's batch generated for the next iteration (rollout.lag 1), as
    Episodes.state(); without it a resumed run would generate that batch with newer weights."""
    name = f"iter_{iteration:06d}"
    final = ckpt_root / name
    tmp = ckpt_root / f".tmp-{name}"
    if dist.main:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    dist.barrier()
    if dist.on:
        import torch.distributed.checkpoint as dcp

        dcp.save(_dcp_state(policy), checkpoint_id=str(tmp / "dcp"))
        torch.save(rng_state(), tmp / f"rng_rank{dist.rank}.pt")
        if pending is not None:
            torch.save(pending, tmp / f"pending_rank{dist.rank}.pt")
        if buffer is not None:
            buffer.save(tmp / f"buffer_rank{dist.rank}.safetensors")
        if dist.main:
            torch.save({"scheduler": policy.sched.state_dict(),
                        "sampler": sampler_rng if sampler_rng is not None else torch.empty(0, dtype=torch.uint8)},
                       tmp / "sched.pt")
    else:
        save_weights(policy.model, tmp / "model.safetensors")
        if policy.ref_model is not None:
            save_weights(policy.ref_model, tmp / "ref_model.safetensors")
        torch.save({"optimizer": policy.opt.state_dict(), "scheduler": policy.sched.state_dict(),
                    **({"loss_scale": policy.loss_scale.state_dict()} if policy.loss_scale is not None else {})},
                   tmp / "optim.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        if pending is not None:
            torch.save(pending, tmp / "pending.pt")
        if buffer is not None:
            buffer.save(tmp / "buffer.safetensors")
    dist.barrier()
    if dist.main:
        (tmp / "state.json").write_text(json.dumps({**state, "iteration": iteration, "world_size": dist.world},
                                                   indent=1))
        for f in tmp.rglob("*"):
            if f.is_file():
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
    dist.barrier()
    return final


def save_weights(model, file: Path) -> None:
    """The model's weights as safetensors; with LoRA only the adapters (the base weights are the
    model folder's), with the adapter settings in the file's metadata for export."""
    if not has_lora(model):
        save_model(model, str(file))
        return
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in adapter_state(model).items()}, str(file), metadata=lora_metadata(model))


def load_weights(model, file: Path) -> None:
    """Weights saved by save_weights into `model` (built as the run built it: with its adapters
    when the run had them); CheckpointError when the two do not match."""
    from safetensors import safe_open

    with safe_open(str(file), "pt") as f:
        saved_lora = bool((f.metadata() or {}).get("lora_rank"))
    if saved_lora != has_lora(model):
        raise CheckpointError(f"{file} was saved {'with' if saved_lora else 'without'} LoRA adapters, the model "
                              f"{'has' if has_lora(model) else 'has no'} adapters: resume with the run's model.lora_*")
    missing, unexpected = load_model(model, str(file), strict=False)
    base = set(model.state_dict()) - set(adapter_state(model)) if saved_lora else set()  # the model folder's
    missing = [m for m in missing if m not in base and "lm_head" not in m]
    if unexpected or missing:
        raise CheckpointError(f"{file} does not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")


def _files(path: Path) -> tuple[str, ...]:
    """What a complete checkpoint folder holds, by its layout."""
    if (path / "dcp").is_dir():
        return ("dcp/.metadata", "sched.pt", "state.json")
    return FILES


def latest(ckpt_root: Path) -> Path:
    """The checkpoint folder `latest` names, checked complete; CheckpointError otherwise."""
    pointer = ckpt_root / "latest"
    if not pointer.exists():
        raise CheckpointError(f"no checkpoint in {ckpt_root} (no 'latest' file); nothing to resume")
    path = ckpt_root / pointer.read_text().strip()
    missing = [f for f in _files(path) if not (path / f).is_file()]
    if not path.is_dir() or missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {missing or 'the folder'}")
    return path


def _load_single_into_sharded(path: Path, policy) -> None:
    """A one-process checkpoint (whole safetensors weights, index-keyed optimizer state) into a
    sharded policy: every rank reads the whole files and keeps its shards."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    full = StateDictOptions(full_state_dict=True, strict=False)
    weights = {f"model.{k}": v for k, v in load_file(str(path / "model.safetensors")).items()}
    set_model_state_dict(policy.net, weights, options=full)
    if policy.ref_net is not None:
        ref = {f"model.{k}": v for k, v in load_file(str(path / "ref_model.safetensors")).items()}
        set_model_state_dict(policy.ref_net, ref, options=full)
    opt = torch.load(path / "optim.pt", weights_only=True)
    names = [n for n, p in policy.net.named_parameters() if p.requires_grad]  # the optimizer's parameter order
    osd = opt["optimizer"]
    fqn = {"state": {names[i]: v for i, v in osd["state"].items()},
           "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]}
    set_optimizer_state_dict(policy.net, policy.opt, fqn, options=StateDictOptions(full_state_dict=True))
    policy.sched.load_state_dict(opt["scheduler"])


def _load_buffer(path: Path, saved_world: int, dist: Dist, device, beta) -> ReplayBuffer | None:
    """This rank's buffer shard; from another number of ranks, the saved shards redealt
    (freshper.distributed.reshard keeps every trajectory and its probability)."""
    files = [path / "buffer.safetensors"] if saved_world == 1 and (path / "buffer.safetensors").exists() else \
        [path / f"buffer_rank{r}.safetensors" for r in range(saved_world)]
    if not files[0].exists():
        return None
    if saved_world == dist.world:
        return ReplayBuffer.load(files[dist.rank], device=device, beta=beta)
    from freshper.checkpoint import read_safetensors
    from freshper.distributed import reshard

    states = []
    for f in files:
        tensors, meta = read_safetensors(f)
        states.append({"meta": meta, "tensors": tensors})
    return ReplayBuffer.from_state(reshard(states, dist.world)[dist.rank], device=device, beta=beta)


def load(path: Path, policy, buffer_device, beta, dist: Dist = SINGLE
         ) -> tuple[dict, ReplayBuffer | None, torch.Tensor | None]:
    """Restore policy, optimizer, scheduler and (at the saved number of ranks) RNG in place;
    returns (state, this rank's buffer or None, the distributed sampler's RNG state or None).
    Any checkpoint loads at any number of ranks."""
    try:
        state = json.loads((path / "state.json").read_text())
        saved_world = state.get("world_size", 1)
        sampler_rng = None
        if (path / "dcp").is_dir():
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

            sd = _dcp_state(policy)
            dcp.load(sd, checkpoint_id=str(path / "dcp"))
            set_state_dict(policy.net, policy.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
            if policy.ref_net is not None:
                set_model_state_dict(policy.ref_net, sd["ref_model"])
            extra = torch.load(path / "sched.pt", weights_only=True)
            policy.sched.load_state_dict(extra["scheduler"])
            sampler_rng = extra["sampler"] if extra["sampler"].numel() else None
        elif dist.on:
            _load_single_into_sharded(path, policy)
        else:
            load_weights(policy.model, path / "model.safetensors")
            if policy.ref_model is not None:
                load_weights(policy.ref_model, path / "ref_model.safetensors")
            opt = torch.load(path / "optim.pt", weights_only=True)
            policy.opt.load_state_dict(opt["optimizer"])
            policy.sched.load_state_dict(opt["scheduler"])
            if policy.loss_scale is not None and "loss_scale" in opt:  # fp16: the scale it had found
                policy.loss_scale.load_state_dict(opt["loss_scale"])
        if saved_world == dist.world:
            rng = path / ("rng.pt" if saved_world == 1 else f"rng_rank{dist.rank}.pt")
            set_rng_state(torch.load(rng, weights_only=True))
        buf = _load_buffer(path, saved_world, dist, buffer_device, beta)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} could not be loaded: {type(e).__name__}: {e}") from e
    return state, buf, sampler_rng


def load_pending(path: Path, dist: Dist = SINGLE) -> dict | None:
    """This rank's pending batch (rollout.lag 1) saved in checkpoint `path`, as Episodes.state(),
    or None if the run had none. A pending batch was split over the saving run's ranks: resuming
    it at another number of ranks is an error."""
    state = json.loads((path / "state.json").read_text())
    saved_world = state.get("world_size", 1)
    names = ["pending.pt"] if saved_world == 1 else [f"pending_rank{r}.pt" for r in range(saved_world)]
    if not any((path / n).exists() for n in names):
        return None
    if saved_world != dist.world:
        raise CheckpointError(f"checkpoint {path} holds a batch generated ahead (rollout.lag 1) split over "
                              f"{saved_world} rank(s); resume it at {saved_world} rank(s), not {dist.world}")
    name = names[dist.rank if saved_world > 1 else 0]
    try:
        return torch.load(path / name, weights_only=True)
    except Exception as e:
        raise CheckpointError(f"checkpoint {path}: {name} could not be loaded: {type(e).__name__}: {e}") from e

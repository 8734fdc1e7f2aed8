"""The trainer's view of its process group: who it is, where it runs, and the few collectives
the loop needs. One process (no torchrun) is a group of one, where every collective returns
its input, so the loop reads the same with one rank or many.

Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK set) `init` joins the default group: NCCL with one
GPU per local rank, gloo on CPU (the CI tests run two gloo ranks). Rank 0 owns the run folder:
it alone writes config, metrics, logs, trackers, plots and the exported model.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from .config import Config

# A rank's own sampling streams are seeded at train.seed + RANK_SEED_STRIDE * rank (more than any
# seed a sweep uses, so no two (seed, rank) pairs share a stream); rank 0's are a single run's.
RANK_SEED_STRIDE = 104_729


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str = ""  # "" for a single process

    @property
    def main(self) -> bool:
        """Whether this rank writes the run folder."""
        return self.rank == 0

    @property
    def on(self) -> bool:
        return self.world > 1

    def _dev(self, t: torch.Tensor) -> torch.Tensor:
        return t.cuda() if self.backend == "nccl" else t.cpu()

    def _reduce(self, t: torch.Tensor, op) -> torch.Tensor:
        if not self.on:
            return t
        x = self._dev(t.clone())
        dist.all_reduce(x, op=op)
        return x.to(t.device)

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """Elementwise sum over ranks, on `t`'s device."""
        return self._reduce(t, dist.ReduceOp.SUM)

    def max(self, t: torch.Tensor) -> torch.Tensor:
        """Elementwise maximum over ranks, on `t`'s device."""
        return self._reduce(t, dist.ReduceOp.MAX)

    def cat(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's `t` (rows may differ in number; trailing shape equal) concatenated in rank
        order, on `t`'s device. Small tensors only (per-row statistics): it goes through pickling."""
        if not self.on:
            return t
        parts = self.objects(t.detach().cpu())
        return torch.cat(parts).to(t.device)

    def objects(self, obj) -> list:
        """[obj of rank 0, obj of rank 1, ...] on every rank."""
        if not self.on:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def flag(self, value: bool) -> bool:
        """True on every rank if it is True on any (a stop request must reach all ranks at once,
        or the ones that stop leave the others waiting in a collective)."""
        return bool(self.max(torch.tensor([int(value)]))[0]) if self.on else value

    def barrier(self) -> None:
        if self.on:
            dist.barrier()

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank."""
        if not self.on:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


SINGLE = Dist()


def from_env() -> Dist:
    """This process's place as torchrun describes it (RANK, WORLD_SIZE, LOCAL_RANK), or a
    single process; does not join a group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return SINGLE
    return Dist(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))


def init(device: str = "auto", timeout_min: float = 30.0) -> Dist:
    """Join torchrun's default process group (once), NCCL if this rank uses a GPU, else gloo.
    `device` is train.device ('auto' | 'cuda' | 'cpu'). A single process joins nothing."""
    d = from_env()
    if not d.on:
        return d
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(d.local_rank)
    backend = "nccl" if cuda else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_min))
    d.backend = dist.get_backend()
    return d


def close(d: Dist, wait: bool = False) -> None:
    """Leave the group; `wait`: after a barrier, so that no rank tears down while another is
    still in a collective (only on a clean finish: after a failure the others may never come).
    A colocated vLLM made sub-groups of it: they go first, or vLLM's own clean-up at exit finds
    their parent gone and fails."""
    import sys

    if not (d.on and dist.is_initialized()):
        return
    if wait:
        dist.barrier()
    state = sys.modules.get("vllm.distributed.parallel_state")
    if state is not None:
        state.destroy_model_parallel()
        state.destroy_distributed_environment()
    if dist.is_initialized():
        dist.destroy_process_group()


def check_world(cfg: "Config", world: int) -> None:
    """What several ranks need of the configuration, checked before anything is built."""
    if world == 1:
        return
    a, r, e = cfg.algo, cfg.rollout, cfg.eval
    groups = r.episodes // r.group_size
    bad = []
    if groups % world:
        bad.append(f"rollout.episodes / rollout.group_size = {groups} groups must split evenly over {world} ranks")
    if e.every and e.episodes % world:
        bad.append(f"eval.episodes={e.episodes} must split evenly over {world} ranks")
    if a.mode != "on-policy" and a.capacity % world:
        bad.append(f"algo.capacity={a.capacity} must split evenly over {world} ranks (one shard each)")
    if r.asynchronous:
        bad.append("rollout.asynchronous runs one generation worker beside one trainer process; several ranks are not "
                   "supported yet (lockstep lags, rollout.lag / rollout.lag_probs, work on several ranks)")
    if a.mode != "on-policy" and a.replay_unit != "trajectory":
        bad.append(f"algo.replay_unit={a.replay_unit!r}: several ranks sample trajectories only "
                   "(whole groups are drawn by one buffer); use algo.replay_unit=trajectory")
    if cfg.model.lora_rank:  # FSDP2 with frozen base weights and an adapter-only checkpoint: not built yet
        bad.append(f"model.lora_rank={cfg.model.lora_rank}: LoRA runs on one process; use model.lora_rank=0 "
                   "on several ranks")
    if cfg.model.dtype == "float16":  # FSDP2 would need a sharded loss scale: not built
        bad.append("model.dtype=float16: fp16's loss scaling runs on one process; use model.dtype bfloat16 on "
                   "several ranks")
    if bad:
        raise ValueError(f"WORLD_SIZE={world}: " + "; ".join(bad))


class rank0_first:
    """Rank 0 runs the block first (it may fill a cache), then the others (they read it)."""

    def __init__(self, dist: "Dist"):
        self.dist = dist

    def __enter__(self):
        if not self.dist.main:
            self.dist.barrier()

    def __exit__(self, *exc):
        if self.dist.main and exc[0] is None:
            self.dist.barrier()
        return False

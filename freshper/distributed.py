"""One FreshPER distribution over a buffer split across data-parallel ranks.

Each rank keeps the trajectories it generated in its own ReplayBuffer. Since P(i) = exp(k_i) / Z
with Z = sum over ranks of Z_r = sum_{i on r} exp(k_i), the single-buffer stratified draw can be
made without moving a trajectory: every rank all-gathers the R partial masses log Z_r (and the
minimum keys, for the IS weights), draws the same B uniforms from a generator seeded alike on
every rank, places the B global strata u_j = (j + U_j) / B * Z, and keeps those that fall into
its own interval [sum_{q<r} Z_q, sum_{q<=r} Z_q) of the cumulative mass. It then finds them in its
own buffer by the same search a local sample does, at the same points of its local mass. The
slots, probabilities P(i) = P_local(i) Z_r / Z and weights (P(i) / min_j P(j))^-beta equal those
of one buffer holding every rank's trajectories (tests/freshper/test_distributed.py, 2 ranks).
One all-gather of 3 numbers per rank per sample. Priority updates stay local (a slot id names a
slot on its own rank). `reshard` moves saved shards to another number of ranks (a run resumed
on more or fewer GPUs) and keeps the distribution.
"""
from __future__ import annotations

import functools
import math
import operator

import torch
import torch.distributed as dist

from freshper.buffer import ReplayBuffer, SampleBatch, _is_int


class DistributedSampler:
    """Samples the global FreshPER distribution of `buffer` and its peers on the other ranks.

    Call `sample` on every rank of `group` with the same batch size and step: each rank gets the
    rows drawn from its own buffer (possibly none), with global probabilities and IS weights, and
    `batch.strata` (the global stratum of each row, 0..B-1). `seed` must be the same on every rank.
    """

    def __init__(self, buffer: ReplayBuffer, seed: int = 0, group=None):
        if not _is_int(seed):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DistributedSampler needs torch.distributed initialised (init_process_group)")
        self.buffer, self.group = buffer, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        # Same uniforms on every rank: a generator of its own, on the CPU (identical on any device).
        self.gen = torch.Generator().manual_seed(seed)

    def _gather(self, stats: torch.Tensor) -> torch.Tensor:
        """(world, 3) float64: every rank's [log Z_r, min key, live slots]."""
        backend = dist.get_backend(self.group)
        dev = self.buffer.device if backend == "nccl" else torch.device("cpu")
        out = [torch.empty(3, dtype=torch.float64, device=dev) for _ in range(self.world)]
        dist.all_gather(out, stats.to(dev), group=self.group)
        return torch.stack(out).cpu()

    def sample(self, batch_size: int, step: int | None = None) -> SampleBatch:
        if not _is_int(batch_size) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        buf = self.buffer
        if step is None and buf.step is None:
            raise ValueError("step is required before the first add on this rank")
        step, beta = buf._advance(step)
        live = buf._keys[buf._live]
        local = torch.tensor([torch.logsumexp(live, 0).item() if live.numel() else -math.inf,
                              live.min().item() if live.numel() else math.inf, float(live.numel())],
                             dtype=torch.float64)
        stats = self._gather(local)
        log_z, kmin, sizes = stats[:, 0], stats[:, 1], stats[:, 2]
        if sizes.sum() == 0:
            raise ValueError("cannot sample: every rank's buffer is empty")
        top = log_z.max()
        mass = torch.exp(log_z - top)  # rank masses relative to the largest; empty ranks 0
        cum = torch.cumsum(mass, 0)
        u = torch.rand(batch_size, generator=self.gen, dtype=torch.float64)
        j = torch.arange(batch_size, dtype=torch.float64)
        target = (j + u) / batch_size * cum[-1]
        owner = torch.searchsorted(cum, target, right=True).clamp(max=self.world - 1)
        # a target at the very end (float rounding) belongs to the last rank with mass
        last = int((mass > 0).nonzero().max())
        owner = torch.where(mass[owner] > 0, owner, torch.full_like(owner, last))
        mine = (owner == self.rank).nonzero().squeeze(1)
        n = mine.numel()
        dev = buf.device
        if n == 0:
            empty = torch.empty(0, dtype=torch.int64, device=dev)
            batch = buf._batch(empty, torch.empty(0, dtype=torch.float64, device=dev),
                               torch.empty(0, dtype=torch.float64, device=dev), step, beta)
        else:
            start = cum[self.rank] - mass[self.rank]
            frac = ((target[mine] - start) / mass[self.rank]).clamp(0.0, 1.0)
            # the local search places draw i at (i + u'_i) / n of the local mass: choose u' so that
            # this is the global stratum's point
            u_local = (frac * n - torch.arange(n, dtype=torch.float64)).to(dev)
            idx, p_local, w_local = buf._draw(u_local, beta)
            scale = math.exp(float(log_z[self.rank] - torch.logsumexp(log_z, 0)))
            shift = math.exp(-beta * float(live.min().item() - kmin.min()))
            batch = buf._batch(idx, w_local * shift, p_local * scale, step, beta)
        batch.strata = mine.to(dev)
        batch.counts = torch.bincount(owner, minlength=self.world)  # rows each rank drew
        return batch


def reshard(states: list[dict], world: int, capacity: int | None = None) -> list[dict]:
    """Buffer states of R ranks (`ReplayBuffer.state_dict()` each, equal capacities) -> states
    for `world` ranks holding the same trajectories, `capacity` each (default: the saved total
    over `world`). If the new total is smaller than the live trajectories, the oldest are left
    out, as FIFO eviction would have removed them.

    A trajectory's key depends only on its own slot (priority, birth step, insertion state), so
    moving it to another rank keeps its global probability: the union's distribution is exactly
    the saved one. Trajectories are dealt round-robin in order of birth (rank, then slot, within
    a step), oldest first in each new buffer, so FIFO eviction still removes the oldest. Each new
    state takes the sampling RNG state of saved rank r % R (a resharded run's draws cannot
    repeat the old ones anyway)."""
    from freshper.checkpoint import _check_state

    if not _is_int(world) or world <= 0:
        raise ValueError(f"world must be a positive int, got {world!r}")
    if not states:
        raise ValueError("states must hold at least one rank's buffer state")
    for sd in states:
        _check_state(sd)
    metas = [sd["meta"] for sd in states]
    caps = {m["config"]["capacity"] for m in metas}
    if len(caps) != 1:
        raise ValueError(f"the saved ranks' buffers differ in capacity ({sorted(caps)}); expected equal shards")
    total = caps.pop() * len(states)
    if capacity is None:
        if total % world:
            raise ValueError(f"the total capacity {total} does not split evenly over world={world} ranks")
        cap = total // world
    elif not _is_int(capacity) or capacity <= 0:
        raise ValueError(f"capacity must be a positive int or None, got {capacity!r}")
    else:
        cap = capacity
    names = [k for k in states[0]["tensors"] if k != "rng"]
    # every live slot, oldest first: (birth, saved rank, slot in FIFO order from the oldest)
    order = []
    for r, sd in enumerate(states):
        t, c = sd["tensors"], sd["meta"]["counters"]
        live = t["live"].nonzero().squeeze(1)
        age_rank = (live - c["next"]) % t["live"].numel()  # FIFO position: slot `next` is the oldest
        order += [(int(t["birth"][s]), r, int(a), int(s)) for s, a in zip(live.tolist(), age_rank.tolist())]
    order.sort()
    order = order[max(0, len(order) - cap * world):]  # the newest that fit
    out = []
    for q in range(world):
        mine = order[q::world]
        src = torch.tensor([m[1] for m in mine], dtype=torch.int64)
        slot = torch.tensor([m[3] for m in mine], dtype=torch.int64)
        pos = torch.arange(len(mine))
        tensors = {}
        for k in names:
            ref = states[0]["tensors"][k]
            fill = torch.zeros((cap, *ref.shape[1:]), dtype=ref.dtype)
            for r, sd in enumerate(states):
                sel = src == r
                fill[pos[sel]] = sd["tensors"][k][slot[sel]]
            tensors[k] = fill
        tensors["rng"] = states[q % len(states)]["tensors"]["rng"].clone()
        meta = {**metas[0], "config": {**metas[0]["config"], "capacity": cap, "seed": metas[0]["config"]["seed"] + q},
                "fields": metas[0]["fields"]}
        c0 = [m["counters"] for m in metas]
        steps = [c["step"] for c in c0 if c["step"] is not None]
        boost = [c.get("boost_step") for c in c0 if c.get("boost_step") is not None]
        meta["counters"] = {"size": len(mine), "next": len(mine) % cap, "added": len(mine),
                            "step": max(steps) if steps else None, "tree_ref": None,
                            "max_priority": max(c.get("max_priority", 1.0) for c in c0),
                            "boost_step": max(boost) if boost else None,
                            "err": functools.reduce(operator.or_, (c.get("err", 0) for c in c0), 0)}  # pending errors
        out.append({"meta": meta, "tensors": tensors})
    return out

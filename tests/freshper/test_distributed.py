"""The sharded buffer's draw equals one buffer's: 2 gloo ranks on CPU, each holding the
trajectories it "generated", sampled with DistributedSampler, against a single buffer that holds
them all (chi-square on the pooled frequencies; probabilities and IS weights equal)."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from scipy.stats import chisquare

from freshper import ReplayBuffer
from freshper.distributed import DistributedSampler

N_TRAJ, CALLS, BATCH = 40, 300, 64


def trajectories():
    g = torch.Generator().manual_seed(0)
    return torch.rand(N_TRAJ, generator=g, dtype=torch.float64) * 2


def fill(buf, ids_for_step):
    p = trajectories()
    for step in range(4):
        ids = torch.tensor(ids_for_step(step), dtype=torch.long)
        if ids.numel():
            buf.add(p[ids], step=step, gid=ids)
        else:
            buf.probabilities(step=step)


def _worker(rank, world, port, out, sampler):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        buf = ReplayBuffer(64, mode="freshper", tau=5.0, beta=0.6, sampler=sampler, seed=rank)
        # rank 0 collected 3 of every 10 trajectories, rank 1 the rest: unequal shards
        fill(buf, lambda s: [i for i in range(s * 10, s * 10 + 10) if (i % 10 < 3) == (rank == 0)])
        ds = DistributedSampler(buf, seed=123)
        counts = torch.zeros(N_TRAJ, dtype=torch.float64)
        probs = torch.zeros(N_TRAJ, dtype=torch.float64)
        weights = torch.zeros(N_TRAJ, dtype=torch.float64)
        rows = []
        for _ in range(CALLS):
            b = ds.sample(BATCH, step=4)
            assert int(b.counts.sum()) == BATCH and len(b) == int(b.counts[rank])
            rows.append(len(b))
            counts += torch.bincount(b.gid, minlength=N_TRAJ).double()
            probs[b.gid] = b.probs
            weights[b.gid] = b.weights
        torch.save({"counts": counts, "probs": probs, "weights": weights, "rows": rows}, f"{out}/{rank}.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    """A TCP port nobody listens on now, for a test's own process group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sampler", ["tree", "scan"])
def test_two_ranks_sample_the_single_buffer_distribution(tmp_path, sampler):
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path), sampler), nprocs=2, join=True)
    parts = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    single = ReplayBuffer(64, mode="freshper", tau=5.0, beta=0.6, sampler=sampler)
    fill(single, lambda s: list(range(s * 10, s * 10 + 10)))
    p_all = single.probabilities(step=4)
    gid = single._fields["gid"]
    want = torch.zeros(N_TRAJ, dtype=torch.float64)
    want[gid[single._live]] = p_all[single._live]
    counts = parts[0]["counts"] + parts[1]["counts"]
    assert counts.sum() == CALLS * BATCH
    assert chisquare(counts.numpy(), (want * counts.sum()).numpy()).pvalue > 1e-3
    assert (parts[0]["counts"][[i for i in range(N_TRAJ) if i % 10 >= 3]] == 0).all(), "rank 0 drew only its own"
    seen = counts > 0
    got_p = parts[0]["probs"] + parts[1]["probs"]
    torch.testing.assert_close(got_p[seen], want[seen], rtol=1e-10, atol=0)
    got_w = parts[0]["weights"] + parts[1]["weights"]
    torch.testing.assert_close(got_w[seen], (want[seen] / want.min()) ** -0.6, rtol=1e-10, atol=0)
    # the rows split as the masses do: rank 0 holds 3/10 of the trajectories and about that of the mass
    share = sum(parts[0]["rows"]) / (CALLS * BATCH)
    assert abs(share - float(want[[i for i in range(N_TRAJ) if i % 10 < 3]].sum())) < 0.01


def test_needs_an_initialised_process_group(monkeypatch):
    # another test file in this worker process may have left a group up (TRL's accelerate does)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedSampler(ReplayBuffer(8))


def _global_probs(bufs, step):
    """{gid: probability} of the union of `bufs` (each a rank's shard): P_local * Z_r / Z."""
    logz = torch.stack([torch.logsumexp(b._keys[b._live], 0) for b in bufs])
    out = {}
    for b, lz in zip(bufs, logz):
        p = b.probabilities(step=step) * torch.exp(lz - torch.logsumexp(logz, 0))
        for g, q in zip(b._fields["gid"][b._live].tolist(), p[b._live].tolist()):
            out[g] = q
    return out


@pytest.mark.parametrize("old,new", [(2, 1), (1, 2), (2, 4), (4, 2)])
def test_reshard_keeps_every_trajectory_and_its_probability(old, new):
    from freshper.distributed import reshard

    cap = 64 // old
    bufs = [ReplayBuffer(cap, mode="freshper", tau=5.0, beta=0.6, seed=r, insert="max-one-step") for r in range(old)]
    for r, b in enumerate(bufs):
        fill(b, lambda s: [i for i in range(s * 10, s * 10 + 10) if i % old == r])
        b.update_priorities(torch.tensor([0]), torch.tensor([3.0], dtype=torch.float64), step=4)
    want = _global_probs(bufs, 4)
    states = reshard([b.state_dict() for b in bufs], new)
    got_bufs = []
    for sd in states:
        b = ReplayBuffer(64 // new, mode="freshper", tau=5.0, beta=0.6, insert="max-one-step",
                         fields={"gid": ((), torch.int64)})
        b.load_state_dict(sd)
        got_bufs.append(b)
    assert sorted(len(b) for b in got_bufs) == sorted([len(want) // new + (i < len(want) % new) for i in range(new)])
    got = _global_probs(got_bufs, 4)
    assert set(got) == set(want), "every trajectory is kept, none is duplicated"
    for g in want:
        assert abs(got[g] - want[g]) < 1e-12 * max(1.0, want[g]), g
    # FIFO: each new shard holds its trajectories oldest first from slot 0 and writes next after them,
    # so once full it evicts the oldest first
    for b in got_bufs:
        n = len(b)
        assert b._live[:n].all() and not b._live[n:].any()
        assert (b._birth[:n].diff() >= 0).all()
        assert int(b._choose_slots(1)) == n % b.capacity


def test_reshard_refuses_what_cannot_split():
    from freshper.distributed import reshard

    b = ReplayBuffer(10, mode="freshper", tau=5.0)
    with pytest.raises(ValueError, match="world must be a positive int"):
        reshard([b.state_dict()], 0)
    with pytest.raises(ValueError, match="does not split evenly"):
        reshard([b.state_dict()], 3)
    with pytest.raises(ValueError, match="at least one"):
        reshard([], 2)


def test_reshard_into_less_room_keeps_the_newest_with_their_relative_probabilities():
    from freshper.distributed import reshard

    bufs = [ReplayBuffer(32, mode="freshper", tau=5.0, seed=r) for r in range(2)]
    for r, b in enumerate(bufs):
        fill(b, lambda s: [i for i in range(s * 10, s * 10 + 10) if i % 2 == r])  # 20 each, 40 in all
    want = _global_probs(bufs, 4)
    (sd,) = reshard([b.state_dict() for b in bufs], 1, capacity=16)
    one = ReplayBuffer.from_state(sd)
    assert one.capacity == 16 and len(one) == 16
    got = _global_probs([one], 4)
    # the 16 newest: all of step 3 (ids 30-39) and 6 of step 2 (20-29, equally new); none older
    assert set(range(30, 40)) <= set(got) <= set(range(20, 40))
    z = sum(want[g] for g in got)
    for g in got:
        assert abs(got[g] - want[g] / z) < 1e-12
    with pytest.raises(ValueError, match="capacity must be a positive int"):
        reshard([b.state_dict() for b in bufs], 1, capacity=0)


def test_reshard_keeps_a_pending_error_word():
    """A shard saved with an error its check() had not read yet: every resharded state carries
    it (the words or-ed), so the new buffers' check() raises as the old one would have."""
    from freshper.distributed import reshard

    bufs = [ReplayBuffer(8, sampler="scan", sync_free=True, tau=5.0, seed=r) for r in range(2)]
    for b in bufs:
        b.add(torch.ones(3, dtype=torch.float64), step=0, gid=torch.arange(3))
    bufs[1].update_priorities(torch.tensor([0]), torch.tensor([float("nan")], dtype=torch.float64))
    for sd in reshard([b.state_dict() for b in bufs], 1):
        assert sd["meta"]["counters"]["err"] == 1
        merged = ReplayBuffer.from_state(sd)
        with pytest.raises(ValueError, match="priority must be finite"):
            merged.check()

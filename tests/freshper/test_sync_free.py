"""The buffer's GPU step, proved on the CPU: add + sample + update_priorities with no host sync
(sampler "scan" and "triton" under the interpreter take the code path CUDA takes), the same
distribution as the CPU tree, duplicates resolved last-wins by the one write kernel, and bad
device-side input caught at `check()` with nothing written. On a GPU (tests/device.py) the
"triton" cases run on CUDA with the compiled kernels and inputs made on the device."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from freshper import ReplayBuffer
from freshper.kernels.slot_write import write_slots_reference, write_slots_triton
from freshper.profiling.host_syncs import HostSyncs

from ..device import DEVICE
from .helpers import filled
from .test_buffer import assert_unchanged, snapshot

SAMPLERS = ["scan", "triton"]


def where(sampler: str) -> str:
    """The triton sampler's device: CUDA where the tests run compiled, else the CPU interpreter."""
    return DEVICE if sampler == "triton" else "cpu"


def step_once(buf, g, step, b=16):
    """add + sample + update on inputs made on the buffer's device (g is a generator there)."""
    d = buf.device
    buf.add(torch.rand(b, generator=g, dtype=torch.float64, device=d) + 0.1, step=step,
            tok=torch.randint(0, 9, (b, 5), generator=g, device=d), ret=torch.randn(b, generator=g, device=d))
    batch = buf.sample(8)
    buf.update_priorities(batch.indices, batch.weights + 0.25)
    return batch


@pytest.mark.parametrize("insert", ["own", "max", "max-one-step"])
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_step_makes_no_host_sync(sampler, insert):
    buf = ReplayBuffer(64, sampler=sampler, sync_free=True, insert=insert, tau=20.0, device=where(sampler))
    g = torch.Generator(device=buf.device).manual_seed(0)
    step_once(buf, g, 0)
    with HostSyncs() as syncs:
        for step in range(1, 4):
            step_once(buf, g, step)
    assert not syncs.events, syncs.report()
    buf.check()


def test_the_counter_sees_the_syncing_path():
    """Wrong variant: the same step on a buffer that validates on the host is counted."""
    g = torch.Generator().manual_seed(0)
    buf = ReplayBuffer(64, sampler="scan", sync_free=False, tau=20.0)
    step_once(buf, g, 0)
    with HostSyncs() as syncs:
        step_once(buf, g, 1)
    assert len(syncs.events) >= 3, syncs.report()


@pytest.mark.parametrize("insert", ["own", "max", "max-one-step"])
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_same_distribution_as_the_tree(sampler, insert):
    """The same adds and updates (duplicates included) on the sync-free buffer and on the tree:
    equal probabilities, live slots, counters and maximum priority."""
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    tree = ReplayBuffer(40, sampler="tree", insert=insert, tau=9.0)
    dev = ReplayBuffer(40, sampler=sampler, sync_free=True, insert=insert, tau=9.0, device=where(sampler))
    for step in range(6):
        for buf, g in ((tree, g1), (dev, g2)):
            p = torch.rand(12, generator=g, dtype=torch.float64) * 2
            buf.add(p, step=step, tok=torch.zeros(12, 5, dtype=torch.long), ret=torch.zeros(12))
            live = buf._live.nonzero().squeeze(1)
            idx = live[torch.randint(0, live.numel(), (10,), generator=g)]
            idx[3] = idx[7]  # a duplicate: the last value wins
            buf.update_priorities(idx, torch.rand(10, generator=g, dtype=torch.float64) * 4)
        torch.testing.assert_close(dev.probabilities().cpu(), tree.probabilities(), rtol=1e-12, atol=1e-300)
        assert torch.equal(dev._live.cpu(), tree._live) and torch.equal(dev._birth.cpu(), tree._birth)
        assert len(dev) == len(tree) and dev._next == tree._next
        assert dev.max_priority == tree.max_priority
    dev.check()


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_bad_device_input_is_caught_at_check(sampler):
    buf = filled("freshper", sampler=sampler, sync_free=True, device=where(sampler))
    d = buf.device  # device input is checked on the device: deferred to check()
    snap = snapshot(buf)
    live = buf._live.nonzero().squeeze(1)
    buf.update_priorities(live[:3], torch.tensor([1.0, float("nan"), 2.0], dtype=torch.float64, device=d))
    assert_unchanged(buf, snap)  # nothing written, nothing raised yet
    buf.add(torch.ones(4, dtype=torch.float64), step=buf.step, tok=torch.zeros(4, 5, dtype=torch.long),
            ret=torch.zeros(4))  # a good call after an uncollected error writes nothing either
    assert torch.equal(buf._keys, snap[2].to(d))
    with pytest.raises(ValueError, match="priority must be finite"):
        buf.check()
    buf.check()  # collected: the word is clear
    empty = (~buf._live).nonzero().squeeze(1)[:1]
    buf.update_priorities(torch.cat([live[:1], empty]), torch.ones(2, dtype=torch.float64, device=d))
    with pytest.raises(ValueError, match="indices must point at live slots"):
        buf.check()
    buf.update_priorities(torch.tensor([0, buf.capacity], device=d), torch.ones(2, dtype=torch.float64, device=d))
    with pytest.raises(ValueError, match="indices must lie in"):
        buf.check()


def test_host_input_still_raises_at_once():
    buf = filled("freshper", sampler="scan", sync_free=True)
    with pytest.raises(ValueError, match="priority"):
        buf.update_priorities([0, 1], [1.0, float("nan")])
    with pytest.raises(ValueError, match="indices"):
        buf.update_priorities([0, 10**6], [1.0, 1.0])
    with pytest.raises(ValueError, match="sync_free"):
        ReplayBuffer(8, sampler="tree", sync_free=True)


def _state(cap, g):
    live = torch.rand(cap, generator=g) > 0.5
    return {"log_base": torch.randn(cap, generator=g, dtype=torch.float64), "birth": torch.randint(0, 5, (cap,)),
            "live": live, "keys": torch.randn(cap, generator=g, dtype=torch.float64),
            "own": torch.rand(cap, generator=g, dtype=torch.float64), "boosted": torch.rand(cap, generator=g) > 0.5,
            "scratch": torch.full((cap,), -1, dtype=torch.int64), "err": torch.zeros(1, dtype=torch.int32),
            "max_p": torch.ones(1, dtype=torch.float64), "size": live.sum().reshape(1),
            "ctr": torch.tensor([3, 11, 8, -1])}


@pytest.mark.parametrize("case", ["plain", "active", "at", "stamp", "bad", "birth", "bad-birth"])
def test_write_kernel_matches_reference(case):
    """One Triton program against the torch composite, duplicates in the batch (checked once to
    fail with the winner taken as the first occurrence instead of the last)."""
    g = torch.Generator().manual_seed(7)
    base = _state(50, g)
    slots = torch.randint(0, 50, (40,), generator=g)
    p = torch.rand(40, generator=g, dtype=torch.float64) * 3
    if case == "bad":
        p[5] = -1.0
    born = "birth" in case
    kw = dict(mode="freshper", alpha=0.6, eps=1e-6, tau=7.0, zero_ok=True,
              step=9 if case == "stamp" or born else None,
              active=(torch.rand(40, generator=g) > 0.3) if case == "active" else None,
              at=torch.tensor([2.5], dtype=torch.float64) if case == "at" else None, boosted=case == "active",
              birth=torch.randint(0, 10 + (case == "bad-birth"), (40,), generator=g) if born else None,
              advance=case in ("plain", "bad", "birth", "bad-birth"), set_step=born, boost_step="set" if born else None)
    a = {k: v.clone() for k, v in base.items()}
    b = {k: v.clone().to(DEVICE) for k, v in base.items()}
    write_slots_reference(a, slots, p, **kw)
    on_dev = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    write_slots_triton(b, slots.to(DEVICE), p.to(DEVICE), **on_dev)
    for k in a:
        torch.testing.assert_close(b[k].cpu(), a[k], rtol=1e-15, atol=0, msg=k)
    assert int(a["err"]) == {"bad": 1, "bad-birth": 16}.get(case, 0)
    moved = int(a["err"]) == 0 and kw["advance"]
    assert a["ctr"].tolist() == ([(3 + 40) % 50, 51, 9 if born else 8, 9 if born else -1] if moved else [3, 11, 8, -1])
    if case == "birth":
        last = {int(s): int(v) for s, v in zip(slots, kw["birth"])}
        assert all(a["birth"][s] == v for s, v in last.items())
    assert (a["scratch"] == -1).all()
    if case == "plain":  # last occurrence wins
        last = {int(s): float(v) for s, v in zip(slots, p)}
        for s, v in last.items():
            assert a["own"][s] == v


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_writes_after_set_tau_use_the_new_tau(sampler):
    """The write kernel reads tau from a float64 device copy: set_tau must refresh it (a copy left
    at the old tau gave keys 1.2 off)."""
    from freshper.priorities import log_keys

    g = torch.Generator().manual_seed(2)
    buf = ReplayBuffer(32, sampler=sampler, sync_free=True, tau=10.0)
    buf.add(torch.rand(8, generator=g, dtype=torch.float64) + 0.1, step=0)
    buf.set_tau(2.0)
    buf.add(torch.rand(8, generator=g, dtype=torch.float64) + 0.1, step=5)
    buf.update_priorities(torch.tensor([1, 9]), torch.tensor([0.5, 2.0], dtype=torch.float64), step=7)
    buf.check()
    want = log_keys(buf._log_base, buf._birth, mode=buf.mode, alpha=buf.alpha, tau=buf.tau)
    torch.testing.assert_close(buf._keys[buf._live], want[buf._live], rtol=1e-12, atol=1e-12)


class _Ops(TorchDispatchMode):
    """Counts aten calls that do work (a launch each on a GPU); views and allocations are free."""
    FREE = ("aten.empty", "aten.view", "aten.detach", "aten.expand", "aten.slice", "aten.alias", "aten._unsafe_view",
            "aten.select", "aten.lift_fresh", "aten.empty_strided")

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += not str(func).startswith(self.FREE)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("insert", ["own", "max"])
def test_each_field_of_a_sync_free_add_is_one_launch(insert):
    """A rejected add's rows go to a spare row past capacity, so a field costs one gated
    index_copy (it cost three: gather the old rows, where, index_copy), and the slot choice no
    arange a call (wrong variant seen to fail: the gather-where-copy)."""
    def ops(n_fields):
        buf = ReplayBuffer(32, sampler="scan", sync_free=True, insert=insert)
        fields = {f"f{i}": torch.zeros(4, 3) for i in range(n_fields)}
        p = torch.rand(4, dtype=torch.float64) + 0.1
        buf.add(p, step=0, **fields)
        with _Ops() as c:
            buf.add(p, step=0, **fields)
        return c.n

    assert ops(5) - ops(1) == 4


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_an_add_that_wraps_onto_the_boosted_inserts_keeps_its_own(sampler):
    """max-one-step: the boost of the last step's inserts ends after the add's write, so slots the
    add overwrites (fifo wrapping onto them) must keep the add's values, as on the tree (wrong
    variant seen to fail: every old boosted slot ended, the new inserts with them)."""
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    tree = ReplayBuffer(8, sampler="tree", insert="max-one-step", tau=4.0)
    dev = ReplayBuffer(8, sampler=sampler, sync_free=True, insert="max-one-step", tau=4.0, device=where(sampler))
    for step in range(4):
        for buf, g in ((tree, g1), (dev, g2)):
            buf.add((torch.rand(6, generator=g, dtype=torch.float64) + 0.1).to(buf.device), step=step)
        dev.check()
        assert torch.equal(dev._boosted.cpu(), tree._boosted) and torch.equal(dev._own.cpu(), tree._own)
        torch.testing.assert_close(dev.probabilities().cpu(), tree.probabilities(), rtol=1e-12, atol=1e-300)

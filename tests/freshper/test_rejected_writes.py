"""A sync-free buffer's rejected calls change nothing (issue 76): an add or update_priorities
whose device input is bad leaves the counters, the step, the live flags, the stored fields and
the keys as they were; sample() on a buffer with no live slot never indexes before an array and
says so at check(); a state round trip keeps the configuration's device copy, the pending error
word and the sync-free setting. Sampler "scan" takes the CUDA code path with the torch reference
kernels, "triton" with the Triton kernels (interpreted on CPU)."""
import math

import pytest
import torch

from freshper import ReplayBuffer
from freshper.priorities import log_keys

from ..device import DEVICE
from .helpers import filled

SAMPLERS = ["scan", "triton"]
INSERTS = ["own", "max", "max-one-step"]


def where(sampler: str) -> str:
    return DEVICE if sampler == "triton" else "cpu"


def full_state(buf) -> dict:
    """Everything a call could change, read after state_dict() (a sync the buffer makes anyway,
    where a sync-free buffer's host views are set from the device)."""
    sd = buf.state_dict()
    out = {f"meta.{k}": v for k, v in sd["meta"]["counters"].items() if k != "err"}
    out.update({f"t.{k}": v.clone() for k, v in sd["tensors"].items()})
    out.update(keys=buf._keys.cpu().clone(), next_t=buf._next_t.cpu().clone(), added=buf._added, step=buf.step,
               maybe_live=buf._maybe_live, size=len(buf), max_p=buf.max_priority, live=buf._live.cpu().clone(),
               boost_step=buf._boost_step, boost_slots=sorted(buf._boost_slots.tolist()),
               fields={k: v.cpu().clone() for k, v in buf._fields.items()})
    return out


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if k == "fields":
            assert a[k].keys() == b[k].keys()
            for f in a[k]:
                assert torch.equal(a[k][f], b[k][f]), f"field {f} changed"
        elif isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), f"{k} changed"
        else:
            assert a[k] == b[k], f"{k}: {a[k]!r} -> {b[k]!r}"


def batch(n, d, g, bad=False):
    p = torch.rand(n, generator=g, dtype=torch.float64).to(d) + 0.5
    if bad:
        p[1] = float("nan")
    return p, {"tok": torch.randint(1, 9, (n, 5), generator=g).to(d), "ret": torch.randn(n, generator=g).to(d)}


@pytest.mark.parametrize("insert", INSERTS)
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_rejected_add_changes_nothing(sampler, insert):
    """A NaN in a device priority: nothing moves, not even the boost expiry the new step would
    have made; a good add after check() lands where the rejected one would have (no hole).
    Wrong variants seen to fail: counters advanced unconditionally (today's code), the fields
    written by a rejected add, the boost ended before the add's write."""
    d = where(sampler)
    g = torch.Generator().manual_seed(3)
    buf = ReplayBuffer(24, sampler=sampler, sync_free=True, insert=insert, tau=6.0, device=d)
    for step in range(3):
        p, f = batch(5, d, g)
        buf.add(p, step=step, **f)
    buf.check()
    before = full_state(buf)
    p, f = batch(5, d, g, bad=True)
    slots = buf.add(p, step=3, **f)
    assert_same_state(before, full_state(buf))
    with pytest.raises(ValueError, match="priority must be finite"):
        buf.check()
    assert_same_state(before, full_state(buf))
    p, f = batch(5, d, g)
    again = buf.add(p, step=3, **f)
    buf.check()
    assert torch.equal(again, slots)  # the next add fills the slots the rejected one would have
    assert buf._added == before["added"] + 5 and buf.step == 3


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_good_add_after_an_uncollected_error_changes_nothing(sampler):
    d = where(sampler)
    g = torch.Generator().manual_seed(5)
    buf = ReplayBuffer(16, sampler=sampler, sync_free=True, tau=6.0, device=d)
    p, f = batch(4, d, g)
    buf.add(p, step=0, **f)
    before = full_state(buf)
    live = buf._live.nonzero().squeeze(1)
    buf.update_priorities(live[:2], torch.tensor([1.0, -1.0], dtype=torch.float64, device=d), step=2)
    p, f = batch(4, d, g)
    buf.add(p, step=4, **f)
    assert_same_state(before, full_state(buf))
    with pytest.raises(ValueError, match="priority must be finite"):
        buf.check()


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_rejected_update_keeps_the_step_and_the_boost(sampler):
    """update_priorities(..., step) at an empty slot: the step stays and the boost of the last
    step's inserts is not expired."""
    d = where(sampler)
    g = torch.Generator().manual_seed(6)
    buf = ReplayBuffer(16, sampler=sampler, sync_free=True, insert="max-one-step", tau=6.0, device=d)
    p, f = batch(4, d, g)
    buf.add(p, step=0, **f)
    p, f = batch(4, d, g)
    buf.add(p, step=1, **f)
    before = full_state(buf)
    assert before["boost_slots"] == [4, 5, 6, 7]
    buf.update_priorities(torch.tensor([0, 9], device=d), torch.ones(2, dtype=torch.float64, device=d), step=5)
    assert_same_state(before, full_state(buf))
    with pytest.raises(ValueError, match="indices must point at live slots"):
        buf.check()
    assert buf.step == 1


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_sample_with_no_live_slot_raises_at_check(sampler):
    """A rejected first add, then sample(): indices inside the buffer, weights and probabilities
    finite, and check() names both the priority and the empty sample (today: indices -1, weights
    inf, probabilities NaN, and on CUDA an illegal address)."""
    d = where(sampler)
    buf = ReplayBuffer(32, sampler=sampler, sync_free=True, device=d)
    buf.add(torch.tensor([1.0, float("nan")], dtype=torch.float64, device=d), step=0,
            tok=torch.zeros(2, 3, dtype=torch.long, device=d))
    b = buf.sample(8)
    assert ((b.indices >= 0) & (b.indices < buf.capacity)).all(), b.indices
    assert torch.isfinite(b.weights).all() and torch.isfinite(b.probs).all()
    with pytest.raises(ValueError, match="sample from a buffer with no live entry") as e:
        buf.check()
    assert "priority must be finite" in str(e.value)
    assert len(buf) == 0
    with pytest.raises(ValueError, match="empty buffer"):  # the host knows now
        buf.sample(8)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_load_refreshes_the_write_kernels_tau(sampler):
    """Built with tau 500, loaded from a state with tau 5: writes must use 5 (the issue's repro:
    keys of 0.671 where 1.859 is right)."""
    d = where(sampler)
    src = ReplayBuffer(16, sampler=sampler, sync_free=True, tau=5.0, alpha=0.7, eps=1e-3, device=d)
    src.add(torch.ones(2, dtype=torch.float64), step=0)
    buf = ReplayBuffer(16, sampler=sampler, sync_free=True, tau=500.0, alpha=0.6, eps=1e-6, device=d)
    buf.load_state_dict(src.state_dict())
    buf.add(torch.tensor([2.0, 0.0], dtype=torch.float64, device=d), step=10)
    buf.update_priorities(torch.tensor([0], device=d), torch.tensor([3.0], dtype=torch.float64, device=d))
    buf.check()
    want = log_keys(buf._log_base, buf._birth, mode="freshper", alpha=0.7, tau=5.0)
    torch.testing.assert_close(buf._keys[buf._live], want[buf._live], rtol=1e-13, atol=0)
    assert math.isclose(float(buf._keys[2]), 0.7 * (math.log(2.001) + 2.0), rel_tol=1e-13)
    torch.testing.assert_close(buf._log_base[:3].cpu(), torch.tensor([3.001, 1.001, 2.001]).double().log())


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_state_carries_the_error_word_and_sync_free(sampler):
    d = where(sampler)
    buf = filled("freshper", capacity=16, n=8, sampler=sampler, sync_free=True, device=d)
    buf.update_priorities(torch.tensor([0], device=d), torch.tensor([float("inf")], dtype=torch.float64, device=d))
    sd = buf.state_dict()
    assert sd["meta"]["config"]["sync_free"] is True and sd["meta"]["counters"]["err"] == 1
    other = ReplayBuffer.from_state(sd, device=d)
    assert other.sync_free and other.sampler == sampler
    with pytest.raises(ValueError, match="priority must be finite"):
        other.check()
    other.check()
    fresh = ReplayBuffer(16, sampler=sampler, sync_free=True, device=d)
    fresh.load_state_dict(sd)
    with pytest.raises(ValueError, match="priority must be finite"):
        fresh.check()
    with pytest.raises(ValueError, match="priority must be finite"):
        buf.check()


def test_old_states_without_the_new_keys_still_load():
    buf = filled("freshper", capacity=16, n=8, sampler="scan", sync_free=True)
    sd = buf.state_dict()
    del sd["meta"]["config"]["sync_free"], sd["meta"]["counters"]["err"]
    other = ReplayBuffer.from_state(sd)
    assert not other.sync_free and other.sampler == "scan"  # the device's default, as before
    other.check()
    torch.testing.assert_close(other.probabilities(), buf.probabilities(), rtol=0, atol=0)
    tree = ReplayBuffer(16)
    tree.load_state_dict(sd)
    tree.check()


def test_a_pending_error_reaches_a_buffer_that_validates_on_the_host():
    """A state saved with a pending error, loaded into a tree buffer: its check() raises too."""
    buf = filled("freshper", capacity=16, n=8, sampler="scan", sync_free=True)
    buf.update_priorities(torch.tensor([0]).to(buf.device), torch.tensor([-2.0], dtype=torch.float64))
    tree = ReplayBuffer(16)
    tree.load_state_dict(buf.state_dict())
    with pytest.raises(ValueError, match="priority must be finite"):
        tree.check()
    tree.check()

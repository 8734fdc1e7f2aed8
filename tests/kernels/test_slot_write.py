"""The slot-write kernel's error word, on the torch reference and the Triton kernel (interpreted on
CPU): each kind of bad input sets its own bit and writes nothing, and the buffer's check() words
it naming the argument. Wrong variant seen to fail: ERR_ZERO dropped (issue 77's surviving mutant)
in the reference and in the kernel, one at a time."""
import pytest
import torch

from freshper import ReplayBuffer
from freshper.kernels.slot_write import ERR_BIRTH, ERR_PRIORITY, ERR_ZERO, write_slots_reference, write_slots_triton

from ..device import DEVICE

FNS = {"reference": (write_slots_reference, "cpu"), "triton": (write_slots_triton, DEVICE)}


def state(cap, d):
    z = dict(dtype=torch.float64, device=d)
    return {"log_base": torch.zeros(cap, **z), "birth": torch.zeros(cap, dtype=torch.int64, device=d),
            "live": torch.zeros(cap, dtype=torch.bool, device=d), "keys": torch.full((cap,), -float("inf"), **z),
            "own": torch.zeros(cap, **z), "boosted": torch.zeros(cap, dtype=torch.bool, device=d),
            "scratch": torch.full((cap,), -1, dtype=torch.int64, device=d),
            "err": torch.zeros(1, dtype=torch.int32, device=d), "max_p": torch.ones(1, **z),
            "size": torch.zeros(1, dtype=torch.int64, device=d)}


@pytest.mark.parametrize("zero_ok", [False, True])
@pytest.mark.parametrize("fn", FNS)
def test_a_zero_priority_sets_err_zero_where_zero_is_not_allowed(fn, zero_ok):
    write, d = FNS[fn]
    st = state(8, d)
    before = {k: v.clone() for k, v in st.items()}
    write(st, torch.tensor([1, 2, 3], device=d), torch.tensor([0.5, 0.0, 2.0], dtype=torch.float64, device=d),
          mode="freshper", alpha=0.6, eps=0.0, tau=10.0, zero_ok=zero_ok, step=4)
    if zero_ok:
        assert int(st["err"]) == 0 and int(st["size"]) == 3
        return
    assert int(st["err"]) == ERR_ZERO
    for k in before:
        if k != "err":
            assert torch.equal(st[k], before[k]), f"{k} written by a rejected call"


@pytest.mark.parametrize("fn", FNS)
def test_bits_add_up_and_a_good_call_after_writes_nothing(fn):
    write, d = FNS[fn]
    st = state(8, d)
    kw = dict(mode="freshper", alpha=0.6, eps=0.0, tau=10.0, zero_ok=False, step=4)
    write(st, torch.tensor([1, 2], device=d), torch.tensor([-1.0, 0.0], dtype=torch.float64, device=d), **kw)
    assert int(st["err"]) == ERR_PRIORITY | ERR_ZERO
    write(st, torch.tensor([1, 2], device=d), torch.tensor([1.0, 2.0], dtype=torch.float64, device=d), **kw)
    assert int(st["err"]) == ERR_PRIORITY | ERR_ZERO and not st["live"].any()


@pytest.mark.parametrize("fn", FNS)
def test_a_birth_after_the_step_sets_err_birth(fn):
    write, d = FNS[fn]
    st = state(8, d)
    write(st, torch.tensor([1, 2], device=d), torch.ones(2, dtype=torch.float64, device=d), mode="freshper",
          alpha=0.6, eps=0.0, tau=10.0, zero_ok=False, step=4, birth=torch.tensor([4, 5], device=d))
    assert int(st["err"]) == ERR_BIRTH and not st["live"].any()


@pytest.mark.parametrize("sampler", ["scan", "triton"])
def test_buffer_check_names_the_zero_priority(sampler):
    buf = ReplayBuffer(8, sampler=sampler, sync_free=True, eps=0.0, device=DEVICE if sampler == "triton" else "cpu")
    buf.add(torch.tensor([1.0, 0.0], dtype=torch.float64, device=buf.device), step=0)
    assert len(buf) == 0
    with pytest.raises(ValueError, match=r"priority \+ eps must be > 0"):
        buf.check()

"""Write priorities into replay slots on the device, validated, last index wins, with no host sync.

The replay buffer's add and update_priorities both come down to: for slots s (n,) and raw
priorities p (n,), set log(p + eps), optionally the birth step, the live flag, the log-key, the
slot's own priority and its boost flag; count how many slots were empty; raise the running
maximum priority. On a GPU every host read of device data (`bool(bad.any())`, `int(newly)`,
`torch.unique` to resolve duplicate slots) stalls the step, so here nothing is read back:

- Validation sets bits of an error word (int32, on the device) instead of raising: ERR_PRIORITY
  (not finite or < 0), ERR_ZERO (0 with eps = 0), ERR_RANGE (a slot outside [0, capacity)),
  ERR_EMPTY (a slot that must be live is not). A call whose inputs are bad, or that comes after
  an error not yet collected, writes nothing: the error word is sticky until the owner reads it
  (freshper.ReplayBuffer.check) at a sync it makes anyway.
- Duplicate slots: the last occurrence wins. A scratch array (capacity,) int64, kept at -1
  between calls, takes each slot's largest position by a scatter-max; every occurrence of a slot
  then writes the winner's values, so duplicate writes agree and the result is deterministic.
- Counts and maxima stay in device tensors: `size` (number of live slots) and `max_p`; the
  optional `ctr` (4,) int64 holds the owner's other counters (next write position, trajectories
  added, step, boost step), which a call advances only when it writes: a rejected add moves
  nothing, and no host read is needed to know.
- A per-slot `birth` (n,) int64 must lie in [0, step] (ERR_BIRTH otherwise).

`write_slots_reference` is the composite of torch ops (about 40 launches); `write_slots_triton`
is one Triton program over the batch (one launch), the same semantics.
"""
from __future__ import annotations

import torch

from .backend import HAS_TRITON, launch_range, require_triton, use_triton

ERR_PRIORITY, ERR_ZERO, ERR_RANGE, ERR_EMPTY, ERR_BIRTH = 1, 2, 4, 8, 16  # 32: the sampler's ERR_NO_LIVE
MODE_CODES = {"uniform": 0, "per": 1, "freshper": 2}
BOOST_STEPS = {None: 0, "set": 1, "clear": 2}  # what a write does to ctr[3], the boost step
STATE = ("log_base", "birth", "live", "keys", "own", "boosted", "scratch", "err", "max_p", "size")

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _write(slots_ptr, p_ptr, at_ptr, active_ptr, born_ptr, n, cap, step, cfg_ptr,
               log_base_ptr, birth_ptr, live_ptr, keys_ptr, own_ptr, boosted_ptr, scratch_ptr, err_ptr, max_p_ptr,
               size_ptr, ctr_ptr, MODE: tl.constexpr, ZERO_OK: tl.constexpr, STAMP: tl.constexpr,
               NEED_LIVE: tl.constexpr, HAS_ACTIVE: tl.constexpr, HAS_BORN: tl.constexpr, SET_OWN: tl.constexpr,
               BOOST: tl.constexpr, RAISE_MAX: tl.constexpr, AT: tl.constexpr, ADVANCE: tl.constexpr,
               SET_STEP: tl.constexpr, BOOST_STEP: tl.constexpr, BLOCK: tl.constexpr):
        # One program: validation of the whole batch must finish before the first write.
        alpha = tl.load(cfg_ptr + 0)
        eps = tl.load(cfg_ptr + 1)
        tau = tl.load(cfg_ptr + 2)
        lanes = tl.arange(0, BLOCK)
        # one 0/1 lane vector per error kind, reduced by max: no custom reduction (which spilled
        # to local memory under Triton 3.6)
        bad_p = tl.zeros((BLOCK,), tl.int32)
        bad_zero = tl.zeros((BLOCK,), tl.int32)
        bad_range = tl.zeros((BLOCK,), tl.int32)
        bad_live = tl.zeros((BLOCK,), tl.int32)
        bad_born = tl.zeros((BLOCK,), tl.int32)
        for c in range(0, n, BLOCK):
            i = c + lanes
            m = i < n
            s = tl.load(slots_ptr + i, mask=m, other=0)
            p = tl.load(p_ptr + i, mask=m, other=1.0)
            bad_p = tl.maximum(bad_p, tl.where(m & ~((p >= 0) & (p < float("inf"))), 1, 0))  # NaN fails both
            if not ZERO_OK:
                bad_zero = tl.maximum(bad_zero, tl.where(m & (p == 0), 1, 0))
            inb = (s >= 0) & (s < cap)
            bad_range = tl.maximum(bad_range, tl.where(m & ~inb, 1, 0))
            if NEED_LIVE:
                lv = tl.load(live_ptr + tl.where(inb, s, 0), mask=m, other=1)
                bad_live = tl.maximum(bad_live, tl.where(m & inb & (lv == 0), 1, 0))
            if HAS_BORN:
                bn = tl.load(born_ptr + i, mask=m, other=0)
                bad_born = tl.maximum(bad_born, tl.where(m & ((bn < 0) | (bn > step)), 1, 0))
        err = tl.load(err_ptr) | (tl.max(bad_p, axis=0) * 1) | (tl.max(bad_zero, axis=0) * 2) | \
            (tl.max(bad_range, axis=0) * 4) | (tl.max(bad_live, axis=0) * 8) | (tl.max(bad_born, axis=0) * 16)
        tl.store(err_ptr, err)
        if err == 0:
            for c in range(0, n, BLOCK):  # each slot's last active position
                i = c + lanes
                m = i < n
                if HAS_ACTIVE:
                    m = m & (tl.load(active_ptr + i, mask=m, other=0) != 0)
                s = tl.load(slots_ptr + i, mask=m, other=0)
                tl.atomic_max(scratch_ptr + s, i.to(tl.int64), mask=m)
            tl.debug_barrier()
            newly = tl.zeros((BLOCK,), tl.int64)
            top = tl.zeros((BLOCK,), tl.float64)
            for c in range(0, n, BLOCK):
                i = c + lanes
                m = i < n
                s = tl.load(slots_ptr + i, mask=m, other=0)
                win = m & (tl.load(scratch_ptr + s, mask=m, other=-1) == i)
                p = tl.load(p_ptr + i, mask=m, other=0.0)
                top = tl.maximum(top, tl.where(m, p, 0.0))
                newly += tl.where(win & (tl.load(live_ptr + s, mask=win, other=1) == 0), 1, 0)
                if AT:  # every slot enters at one given priority (the running maximum); loaded per
                    # lane: a scalar log of a float64 compiles to a call with a stack frame
                    lb = tl.log(tl.load(at_ptr + lanes * 0) + eps)
                else:
                    lb = tl.log(p + eps)
                tl.store(log_base_ptr + s, lb, mask=win)
                if HAS_BORN:
                    b = tl.load(born_ptr + i, mask=win, other=0).to(tl.int64)
                    tl.store(birth_ptr + s, b, mask=win)
                elif STAMP:
                    b = tl.zeros((BLOCK,), tl.int64) + step
                    tl.store(birth_ptr + s, b, mask=win)
                else:
                    b = tl.load(birth_ptr + s, mask=win, other=0)
                tl.store(live_ptr + s, tl.full((BLOCK,), 1, tl.int8), mask=win)
                if MODE == 0:
                    k = tl.zeros((BLOCK,), tl.float64)
                elif MODE == 1:
                    k = alpha * lb
                else:
                    k = alpha * (lb + b.to(tl.float64) / tau)
                tl.store(keys_ptr + s, k, mask=win)
                if SET_OWN:
                    tl.store(own_ptr + s, p, mask=win)
                tl.store(boosted_ptr + s, tl.full((BLOCK,), BOOST, tl.int8), mask=win)
            tl.debug_barrier()
            for c in range(0, n, BLOCK):  # the scratch back to -1 for the next call
                i = c + lanes
                m = i < n
                s = tl.load(slots_ptr + i, mask=m, other=0)
                tl.store(scratch_ptr + s, tl.full((BLOCK,), -1, tl.int64), mask=m)
            tl.store(size_ptr, tl.load(size_ptr) + tl.sum(newly, axis=0))
            if RAISE_MAX:
                tl.store(max_p_ptr, tl.maximum(tl.load(max_p_ptr), tl.max(top, axis=0)))
            if ADVANCE:  # an add: the next write position and the count of trajectories added
                tl.store(ctr_ptr, (tl.load(ctr_ptr) + n) % cap)
                tl.store(ctr_ptr + 1, tl.load(ctr_ptr + 1) + n)
            # step as an int64 scalar: a step of 1 arrives as a constexpr (Triton specialises it)
            step64 = tl.zeros((), tl.int64) + step
            if SET_STEP:
                tl.store(ctr_ptr + 2, step64)
            if BOOST_STEP == 1:
                tl.store(ctr_ptr + 3, step64)
            elif BOOST_STEP == 2:
                tl.store(ctr_ptr + 3, tl.full((), -1, tl.int64))


def _check(state: dict, slots: torch.Tensor, p: torch.Tensor, active, birth=None, step=None, counters=False) -> None:
    missing = [k for k in STATE if k not in state]
    if missing:
        raise ValueError(f"state is missing {missing}; it needs {STATE}")
    if counters and "ctr" not in state:
        raise ValueError("advance, set_step and boost_step need state['ctr'], (4,) int64")
    if birth is not None and (tuple(birth.shape) != tuple(slots.shape) or birth.dtype != torch.int64 or step is None):
        raise ValueError(f"birth must be (n,) int64 like slots, with a step, got {birth.dtype} {tuple(birth.shape)}, "
                         f"step={step}")
    if slots.dim() != 1 or slots.dtype != torch.int64:
        raise ValueError(f"slots must be (n,) int64, got {slots.dtype} {tuple(slots.shape)}")
    if tuple(p.shape) != tuple(slots.shape) or p.dtype != torch.float64:
        raise ValueError(f"p must be (n,) float64 like slots, got {p.dtype} {tuple(p.shape)}")
    if active is not None and (tuple(active.shape) != tuple(slots.shape) or active.dtype != torch.bool):
        raise ValueError(f"active must be (n,) bool like slots, got {active.dtype} {tuple(active.shape)}")


def write_slots_reference(state: dict, slots, p, *, mode: str, alpha: float, eps: float, tau: float, zero_ok: bool,
                          step: int | None = None, need_live: bool = False, active=None, set_own: bool = True,
                          boosted: bool = False, raise_max: bool = True, at=None, birth=None, advance: bool = False,
                          set_step: bool = False, boost_step: str | None = None) -> None:
    """Torch composite of `write_slots`; same contract, no host sync."""
    _check(state, slots, p, active, birth, step, advance or set_step or boost_step is not None)
    st = state
    cap = st["live"].numel()
    n = slots.numel()
    pos = torch.arange(n, device=slots.device)
    inb = (slots >= 0) & (slots < cap)
    s = torch.where(inb, slots, torch.zeros_like(slots))
    bad_p = ~(torch.isfinite(p) & (p >= 0))
    bits = bad_p.any().int() * ERR_PRIORITY + (~inb).any().int() * ERR_RANGE
    if not zero_ok:
        bits = bits + (p == 0).any().int() * ERR_ZERO
    if need_live:
        bits = bits + (inb & ~st["live"][s]).any().int() * ERR_EMPTY
    if birth is not None:
        bits = bits + ((birth < 0) | (birth > step)).any().int() * ERR_BIRTH
    err = st["err"] | bits
    ok = err == 0
    act = ok.expand(n) if active is None else active & ok
    st["scratch"].scatter_reduce_(0, s, torch.where(act, pos, -1), reduce="amax")
    winner = st["scratch"][s]  # the position whose values every occurrence of this slot writes
    has = winner >= 0
    w = winner.clamp(min=0)
    pw = p[w]
    newly = (has & (winner == pos) & ~st["live"][s]).sum()
    enter = pw if at is None else at.expand(n)
    lb = torch.where(has, torch.log(enter + eps), st["log_base"][s])
    born = torch.full_like(s, 0 if step is None else step) if birth is None else birth[w]
    b = st["birth"][s] if step is None else torch.where(has, born, st["birth"][s])
    if mode == "uniform":
        k = torch.zeros_like(lb)
    elif mode == "per":
        k = alpha * lb
    else:
        k = alpha * (lb + b.double() / tau)
    st["log_base"].index_copy_(0, s, lb)
    st["birth"].index_copy_(0, s, b)
    st["keys"].index_copy_(0, s, torch.where(has, k, st["keys"][s]))
    st["live"].index_copy_(0, s, has | st["live"][s])
    if set_own:
        st["own"].index_copy_(0, s, torch.where(has, pw, st["own"][s]))
    st["boosted"].index_copy_(0, s, torch.where(has, torch.full_like(has, boosted), st["boosted"][s]))
    st["scratch"].index_fill_(0, s, -1)
    st["size"].add_(newly)
    if raise_max:
        st["max_p"].copy_(torch.where(ok, torch.maximum(st["max_p"], p.max()), st["max_p"]))
    ctr = st.get("ctr")  # in-place ops with Python scalars: a setitem would copy each from the host
    if advance:
        ctr[0:2].add_(ok.long() * n)
        ctr[0:1].remainder_(cap)
    if set_step:
        ctr[2:3].masked_fill_(ok, step)
    if boost_step is not None:
        ctr[3:4].masked_fill_(ok, step if boost_step == "set" else -1)
    st["err"].copy_(err)


def write_slots_triton(state: dict, slots, p, *, mode: str, alpha: float, eps: float, tau: float, zero_ok: bool,
                       step: int | None = None, need_live: bool = False, active=None, set_own: bool = True,
                       boosted: bool = False, raise_max: bool = True, at=None, birth=None, advance: bool = False,
                       set_step: bool = False, boost_step: str | None = None) -> None:
    """The one-launch Triton version of `write_slots` (CUDA, or the CPU interpreter)."""
    counters = advance or set_step or boost_step is not None
    _check(state, slots, p, active, birth, step, counters)
    require_triton(slots)
    st = state
    n = slots.numel()
    # alpha, eps and tau enter float64 key arithmetic: passed in a float64 tensor, since a Python
    # float kernel argument compiles to an fp32 parameter
    cfg = torch.tensor([alpha, eps, tau], dtype=torch.float64).to(slots.device, non_blocking=True) \
        if "cfg" not in st else st["cfg"]
    with launch_range("kernel:slot_write"):
        _write[(1,)](slots, p, at if at is not None else p, active if active is not None else slots,
                     birth if birth is not None else slots, n, st["live"].numel(),
                     0 if step is None else step, cfg, st["log_base"], st["birth"], st["live"].view(torch.int8),
                     st["keys"], st["own"], st["boosted"].view(torch.int8), st["scratch"], st["err"], st["max_p"],
                     st["size"], st["ctr"] if counters else st["size"], MODE=MODE_CODES[mode], ZERO_OK=zero_ok,
                     STAMP=step is not None, NEED_LIVE=need_live, HAS_ACTIVE=active is not None,
                     HAS_BORN=birth is not None, SET_OWN=set_own, BOOST=int(boosted), RAISE_MAX=raise_max,
                     AT=at is not None, ADVANCE=advance, SET_STEP=set_step, BOOST_STEP=BOOST_STEPS[boost_step],
                     BLOCK=min(256, max(16, triton.next_power_of_2(n))))


def write_slots(state: dict, slots, p, **kw) -> None:
    """Write raw priorities p (n,) float64 into `slots` (n,) int64 of `state`, a dict of device
    tensors: log_base, keys, own (capacity,) float64; birth, scratch (capacity,) int64 (scratch
    all -1); live, boosted (capacity,) bool; err (1,) int32; max_p (1,) float64; size (1,) int64
    (optionally cfg (3,) float64 = [alpha, eps, tau], made once by the owner, and ctr (4,) int64
    = [next, added, step, boost step], the owner's counters).

    Keywords: mode ("uniform", "per", "freshper"), alpha, eps, tau (inf: no decay), zero_ok
    (whether p = 0 is allowed), step (None: keep each slot's birth), need_live (slots must be
    live already: an update), active (n,) bool (None: all; inactive entries write nothing),
    set_own (also store p as the slot's own priority), boosted (the boost flag written),
    raise_max (max_p = max(max_p, max p)), at (1,) float64 (None: each slot's key from its p;
    else every slot's key from this one priority, p still its own), birth (n,) int64 (with step:
    each slot's birth, in [0, step]; None: step), advance (an add of n: ctr's next and added move
    on), set_step (ctr's step = step), boost_step ("set": ctr's boost step = step, "clear": -1).
    The counters move only when the call writes. See the module docstring for errors and duplicates."""
    if use_triton(slots):
        return write_slots_triton(state, slots, p, **kw)
    return write_slots_reference(state, slots, p, **kw)

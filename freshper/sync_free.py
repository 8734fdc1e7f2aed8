"""The replay buffer's counters and its sync-free write path (mixed into freshper.ReplayBuffer).

A sync-free buffer (the default on CUDA) never makes the host wait for the device in add,
sample or update_priorities. What the host would have to read back lives on the device instead:

- `_ctr` (4,) int64 = [next write position, trajectories added, step, boost step] (-1: none),
  beside `_size_t` (live slots), `_max_p_t` (running maximum priority) and `_err` (the error
  word). The write kernel (freshper.kernels.slot_write) moves them only when it writes, so a
  call whose device input is bad, or that comes after an error not yet collected, moves nothing.
- The host keeps its own view of the step, the boost step and whether a slot may be live: it
  needs them to validate the next call's step and to refuse sampling a buffer it knows is empty,
  and it cannot read the device to learn that a call was rejected. After a rejected call these
  views run ahead of the device until the next sync the buffer makes (`check()`, `state_dict()`),
  which sets them from the device. Until then a sample of a buffer with no live slot is caught
  on the device (the sampler's ERR_NO_LIVE) and never reads outside an array.

A buffer that validates on the host keeps the same counters as host ints.
"""
from __future__ import annotations

import torch

# Error word bits (freshper.kernels.slot_write's, and the sampler's ERR_NO_LIVE) and their words.
ERRORS = {1: ("priority", "must be finite and >= 0"), 2: ("priority", "+ eps must be > 0 (a priority 0 with eps=0)"),
          4: ("indices", "must lie in [0, capacity)"), 8: ("indices", "must point at live slots"),
          16: ("birth", "must lie in [0, step]"), 32: ("sample", "from a buffer with no live entry")}


class Counters:
    """Counters that are host ints or device tensors, the error word and the device write."""

    def _init_counters(self, capacity: int, d: torch.device) -> None:
        self._size_t = torch.zeros(1, dtype=torch.int64, device=d)
        self._ctr = torch.tensor([0, 0, -1, -1], dtype=torch.int64).to(d)
        self._next_t = self._ctr[0:1]  # a view: the kernel and _choose_slots share it
        self._max_p_t = torch.ones(1, dtype=torch.float64, device=d)
        self._err = torch.zeros(1, dtype=torch.int32, device=d)
        self._pending = False  # a host-validating buffer's error word, loaded from a state
        self._scratch = torch.full((capacity,), -1, dtype=torch.int64, device=d) if self.sync_free else None
        self._spare_row = torch.full((1,), capacity, dtype=torch.int64, device=d)  # see ReplayBuffer._declare
        self._maybe_live = False  # host view: whether any slot may be live (sync-free sampling)
        self._size = 0
        self._next = 0  # FIFO write position
        self._added = 0  # trajectories ever added
        self._max_priority = 1.0  # largest raw priority ever written (standard PER starts at 1)

    def _refresh_cfg(self) -> None:
        """The write kernel's float64 device copy of alpha, eps and tau: made anew whenever one
        of them changes (a copy left behind writes keys for the old values)."""
        self._cfg = torch.tensor([self.alpha, self.eps, self.tau], dtype=torch.float64).to(self.device)

    # ----------------------------------------------------- counters: host ints, or device tensors
    @property
    def _size(self) -> int:
        return int(self._size_t) if self.sync_free else self._size_h

    @_size.setter
    def _size(self, v: int) -> None:
        if self.sync_free:
            self._size_t.fill_(v)
        else:
            self._size_h = v
        self._maybe_live = v > 0

    @property
    def _next(self) -> int:
        return int(self._next_t) if self.sync_free else self._next_h

    @_next.setter
    def _next(self, v: int) -> None:
        if self.sync_free:
            self._next_t.fill_(v)
        else:
            self._next_h = v

    @property
    def _added(self) -> int:
        return int(self._ctr[1]) if self.sync_free else self._added_h

    @_added.setter
    def _added(self, v: int) -> None:
        if self.sync_free:
            self._ctr[1:2].fill_(v)
        else:
            self._added_h = v

    @property
    def _max_priority(self) -> float:
        return float(self._max_p_t) if self.sync_free else self._max_h

    @_max_priority.setter
    def _max_priority(self, v: float) -> None:
        if self.sync_free:
            self._max_p_t.fill_(v)
        else:
            self._max_h = v

    def _set_step(self, step: int | None) -> None:
        """The step, set by a call the device cannot reject (sample, probabilities)."""
        if self.sync_free and step != self._step:
            self._ctr[2:3].fill_(-1 if step is None else step)
        self._step = step

    def _load_counters(self, size: int, next_: int, added: int, step, boost_step, max_p: float, err: int) -> None:
        """Every counter, on the host and the device, from a saved state; a pending error word
        too (then check() raises, whether or not this buffer is sync-free)."""
        self._size, self._next, self._added, self._max_priority = size, next_, added, max_p
        self._step, self._boost_step = step, boost_step
        self._ctr[2:].copy_(torch.tensor([-1 if step is None else step, -1 if boost_step is None else boost_step]))
        self._err.fill_(err)
        self._pending = err != 0

    # ---------------------------------------------------------------------------- error word
    def check(self) -> None:
        """Raise ValueError for bad input that a sync-free call took on the device, naming the
        argument; the calls that carried it, and every write after it, wrote nothing. One host
        read of a 4-byte word: call it where the trainer synchronises anyway (after an update).
        A buffer that validates on the host only reports an error carried in a loaded state."""
        if not (self.sync_free or self._pending):
            return
        code = self._settle()
        if code:
            self._err.zero_()
            self._pending = False
            what = "; ".join(f"{arg} {msg}" for bit, (arg, msg) in ERRORS.items() if code & bit)
            raise ValueError(f"bad input to an earlier add / update_priorities / sample (it wrote nothing): {what}")

    def _settle(self) -> int:
        """The error word (one host read); if set, the host's views of the step, the boost and
        the live slots are set from the device, where the rejected calls changed nothing."""
        if not (self.sync_free or self._pending):
            return 0
        code = int(self._err)
        if code and self.sync_free:
            step, boost = self._ctr[2:].tolist()
            self._step = None if step < 0 else step
            self._boost_step = None if boost < 0 else boost
            self._boost_slots = self._boosted.nonzero().squeeze(1)
            self._maybe_live = self._size > 0
        return code

    # -------------------------------------------------------------------------- device writes
    def _device_input(self, x) -> bool:
        """Whether a sync-free buffer takes `x` as it is and validates it on the device."""
        return self.sync_free and isinstance(x, torch.Tensor) and x.device == self.device

    def _device_write(self, slots, p, *, step=None, need_live=False, active=None, set_own=True, boosted=False,
                      raise_max=True, at=None, birth=None, advance=False, set_step=False, boost_step=None) -> None:
        from freshper.kernels.slot_write import write_slots, write_slots_reference, write_slots_triton

        state = {"log_base": self._log_base, "birth": self._birth, "live": self._live, "keys": self._keys,
                 "own": self._own, "boosted": self._boosted, "scratch": self._scratch, "err": self._err,
                 "max_p": self._max_p_t, "size": self._size_t, "cfg": self._cfg, "ctr": self._ctr}
        fn = write_slots_triton if self.sampler == "triton" and slots.device.type == "cpu" else (
            write_slots_reference if self.sampler == "scan" else write_slots)
        fn(state, slots, p, mode=self.mode, alpha=self.alpha, eps=self.eps, tau=self.tau,
           zero_ok=self.mode == "uniform" or self.eps != 0, step=step, need_live=need_live, active=active,
           set_own=set_own, boosted=boosted, raise_max=raise_max, at=at, birth=birth, advance=advance,
           set_step=set_step, boost_step=boost_step)

    def _add_on_device(self, slots, own, at_max: bool, step: int, birth, fields: dict) -> torch.Tensor:
        """`add` with no host sync: one write kernel (which also moves the counters), then the
        fields, written only where the kernel accepted the call, then the end of the last step's
        boost if this step ends it (after the write: a rejected add leaves the word set, and a
        write after it writes nothing)."""
        boost = self.insert == "max-one-step"
        old = self._boost_due(step)
        if old is not None:  # read before the add; the slots it overwrites (fifo: [next, next + n)) keep its values
            ending = self._boosted[old] & ((old - self._next_t) % self.capacity >= slots.numel())
        # at the maximum: the kernel reads max_p and, raising nothing, writes it not
        self._device_write(slots, own, step=step, birth=birth, boosted=boost, raise_max=not at_max,
                           at=self._max_p_t if at_max else None, advance=True, set_step=True,
                           boost_step="set" if boost else None)
        if boost:
            same = self._boost_step == step
            self._boost_slots = torch.cat([self._boost_slots, slots]) if same else slots
            self._boost_step = step
        if fields:  # a rejected add writes no field either: its rows go to the spare row past capacity
            rows = torch.where(self._err == 0, slots, self._spare_row)
            for name, t in fields.items():
                self._field_rows[name].index_copy_(0, rows, t.to(self.device))
        if old is not None:
            self._end_boost(old, ending, clear=not boost)  # a boosting add has set the boost step anew
        self._step = step
        self._maybe_live = True  # the host's view; the device may have refused (see the module docstring)
        return slots

    def _boost_due(self, step: int) -> torch.Tensor | None:
        """The last step's inserts, if a call at `step` ends their boost (the host forgets them
        then), else None."""
        if self._boost_step is None or step <= self._boost_step:
            return None
        old, self._boost_step, self._boost_slots = self._boost_slots, None, self._boost_slots[:0]
        return old if old.numel() else None

    def _end_boost(self, old: torch.Tensor, active: torch.Tensor, clear: bool = True) -> None:
        """The slots `old` still boosted (`active`, (n,) bool) get their own priority back, in
        one write with no boolean index; `clear`: the device's boost step too."""
        self._device_write(old, self._own[old], active=active, raise_max=False, boost_step="clear" if clear else None)

"""ReplayBuffer: trajectory-level FreshPER replay, exact sampling, stratified, with IS weights.

Each slot holds caller fields (token ids, masks, behaviour log-probs, rewards, ...) plus
log(base + eps), the step it was written at (birth) and a live flag. Sampling works on the
time-invariant log-keys of freshper/priorities.py, so the cost of a step never depends on the
step count:

- On CPU a numba sum/min tree over exp(k - ref) gives O(B log N) add, sample and update.
  `ref` is moved (an O(N) rebuild) only when new keys climb 100 nats above it (every ~80k steps
  at alpha=0.6, tau=500) or the total falls below 1e-100; neither can underflow every entry.
- On CUDA the fused Triton kernel scans the keys in place (freshper.kernels.sampler).
- `sampler="scan"` forces the torch reference scan and `"triton"` the kernel on any device
  (interpreted on CPU under TRITON_INTERPRET=1); the tests compare all three.
- `sync_free` (on for CUDA buffers): add, sample and update_priorities never make the host wait
  for the device. The slot writes run as one kernel (freshper.kernels.slot_write) with "last
  index wins" and no `unique`; the counters (next slot, live slots, trajectories added, step,
  running maximum priority) live in device tensors (freshper/sync_free.py); bad device-side input
  sets an error word instead of raising and the call changes nothing, counters included.
  `check()` reads that word at a sync the caller makes anyway and raises, naming the argument.
  Input given on the host (lists, CPU tensors for a CUDA buffer) is still checked on the host,
  before it is copied, and raises at once, except whether an index points at a live slot: the
  live flags are on the device, so that one surfaces at `check()`.

Every public method validates all of its input before it changes any state.
"""
from __future__ import annotations

import importlib.util
import math
import numbers
from typing import Callable

import numpy as np
import torch

from freshper import checkpoint
from freshper.priorities import MODES, log_keys
from freshper.sync_free import Counters

HAS_TRITON = importlib.util.find_spec("triton") is not None  # looked up, not imported


def _sumtree():
    """The numba tree, imported (and its functions compiled) only by buffers that use it."""
    from freshper import sumtree

    return sumtree


def _fused():
    """The sampler kernels and reference, imported on first sample (triton on CUDA)."""
    from freshper.kernels import sampler

    return sampler

EVICTIONS = ("fifo", "stalest")
# How a new trajectory enters (see `ReplayBuffer`): at the priority given, or at the running
# maximum until it is sampled (standard PER), or at the maximum until the step advances.
INSERTS = ("own", "max", "max-one-step")
SAMPLERS = ("auto", "tree", "scan", "triton")
_REBASE_UP = 100.0  # nats a new key may sit above `ref` before the tree is rebuilt
_REBASE_TOTAL = 1e-100  # tree totals below this are rebuilt against the current max key
_NO_BIRTHS = np.zeros(0, np.int64)  # the tree's write: every slot born at the step


class SampleBatch:
    """What `ReplayBuffer.sample` returns.

    indices (B,) int64 slots; weights (B,) float IS weights in (0, 1]; probs (B,) sampling
    probabilities; birth (B,) int64 steps the slots were written at; age (B,) int64 = step - birth;
    beta the exponent used. Every stored field is an attribute too: `batch.tokens` is (B, ...).
    """

    def __init__(self, indices, weights, probs, birth, age, beta, fields):
        self.indices, self.weights, self.probs = indices, weights, probs
        self.birth, self.age, self.beta = birth, age, beta
        self.fields = fields

    def __getattr__(self, name):
        fields = self.__dict__.get("fields", {})
        if name in fields:
            return fields[name]
        raise AttributeError(f"SampleBatch has no field {name!r}; fields: {sorted(fields)}")

    def __len__(self):
        return self.indices.numel()

    @property
    def ess_fraction(self) -> torch.Tensor:
        """ess_fraction(self.weights): see there."""
        return ess_fraction(self.weights)


def ess_fraction(weights: torch.Tensor) -> torch.Tensor:
    """Effective sample size of IS weights (B,) over B, (sum w)^2 / (B sum w^2): 1 for equal
    weights, 1/B when one weight dominates. A 0-d float64 tensor on the weights' device."""
    w = weights.double()
    return w.sum() ** 2 / (w ** 2).sum() / w.numel()


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _last_occurrences(slots: torch.Tensor) -> torch.Tensor:
    """Positions of the last occurrence of each distinct value of `slots` (B,): "last wins"."""
    n = slots.numel()
    uniq, inv = torch.unique(slots.flip(0), return_inverse=True)
    first_rev = torch.full((uniq.numel(),), n, dtype=torch.long, device=slots.device).scatter_reduce(
        0, inv, torch.arange(n, device=slots.device), reduce="amin")
    return n - 1 - first_rev


def _check_tau(tau) -> None:
    # tau = inf is allowed and means no decay: every key loses its b/tau term (the PER keys).
    if not (isinstance(tau, numbers.Real) and not isinstance(tau, bool) and tau > 0 and not math.isnan(tau)):
        raise ValueError(f"tau must be a float > 0 (inf: no decay), got {tau!r}")


class ReplayBuffer(Counters):
    """FreshPER replay buffer over `capacity` trajectory slots on `device`.

    P(i) ∝ ((p_i + eps) · exp(-(t - b_i)/tau))^alpha over live slots ("freshper"); no decay for
    "per"; equal for "uniform". Weights w_i = (N·P(i))^-beta / max_j (N·P(j))^-beta.

    Args:
        capacity: trajectory slots (rows of every field), > 0.
        mode: "freshper" (age decay), "per" (no decay) or "uniform".
        alpha: priority exponent, >= 0 (0: uniform).
        beta: IS-weight exponent in [0, 1], or a callable step -> beta (`linear_beta`).
        tau: decay time in steps, > 0 (inf: no decay); "freshper" only.
        eps: added to every base priority, >= 0 (a zero priority then needs eps > 0).
        eviction: "fifo" (oldest first) or "stalest" (least likely first) once full.
        device: where the state lives; a CUDA buffer samples with the Triton kernels.
        seed: seed of the sampling stream (torch.Generator on `device`).
        fields: {name: (shape without the batch dim, dtype)}; None: the first `add` fixes them.
        sampler: "auto" (the tree on CPU, Triton on CUDA), "tree", "scan" or "triton".
        insert: where new trajectories enter: "own" (their priority), "max" (the running
            maximum until replayed: standard PER) or "max-one-step" (the maximum until the
            step advances: the authors' FreshPER arm).
        sync_free: no host synchronisation in add / sample / update_priorities (see the module
            docstring; errors in device-side input raise at `check()`); None: on for CUDA
            with eviction "fifo". Needs sampler "scan" or "triton" and eviction "fifo".
    """

    def __init__(self, capacity: int, *, mode: str = "freshper", alpha: float = 0.6,
                 beta: float | Callable[[int], float] = 0.4, tau: float = 500.0, eps: float = 1e-6,
                 eviction: str = "fifo", device: str | torch.device = "cpu", seed: int = 0,
                 fields: dict | None = None, sampler: str = "auto", insert: str = "own",
                 sync_free: bool | None = None):
        if not _is_int(capacity) or capacity <= 0:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not (isinstance(alpha, numbers.Real) and math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be a finite float >= 0, got {alpha!r}")
        _check_tau(tau)
        if not (isinstance(eps, numbers.Real) and math.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps must be a finite float >= 0, got {eps!r}")
        if eviction not in EVICTIONS:
            raise ValueError(f"eviction must be one of {EVICTIONS}, got {eviction!r}")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        if insert not in INSERTS:
            raise ValueError(f"insert must be one of {INSERTS}, got {insert!r}")
        if callable(beta):
            self._check_beta(beta(0), "beta(0)")
        else:
            self._check_beta(beta, "beta")
        if not _is_int(seed):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.device = torch.device(device)
        if sampler == "auto":
            sampler = "triton" if self.device.type == "cuda" and HAS_TRITON else (
                "tree" if self.device.type == "cpu" else "scan")
        if sampler == "tree" and self.device.type != "cpu":
            raise ValueError(f"sampler='tree' needs device='cpu', got device={self.device}")
        if sync_free not in (None, True, False):
            raise ValueError(f"sync_free must be None, True or False, got {sync_free!r}")
        # stalest eviction reads the keys on the host to choose its victims
        sync_free = self.device.type == "cuda" and eviction == "fifo" if sync_free is None else sync_free
        if sync_free and sampler == "tree":
            raise ValueError("sync_free=True needs sampler 'scan' or 'triton' (the tree is a host structure)")
        if sync_free and eviction != "fifo":
            raise ValueError(f"sync_free=True needs eviction 'fifo' (stalest reads the keys), got {eviction!r}")
        self.sync_free = sync_free
        self.capacity, self.mode, self.alpha, self.tau, self.eps = capacity, mode, float(alpha), float(tau), float(eps)
        self.beta, self.eviction, self.seed, self.sampler = beta, eviction, seed, sampler
        self.insert = insert

        d = self.device
        self._log_base = torch.zeros(capacity, dtype=torch.float64, device=d)
        self._birth = torch.zeros(capacity, dtype=torch.int64, device=d)
        self._live = torch.zeros(capacity, dtype=torch.bool, device=d)
        self._keys = torch.full((capacity,), -math.inf, dtype=torch.float64, device=d)
        # insert="max-one-step": the caller's own priority of each slot, and which slots still sit
        # at the maximum (only the last step's inserts can: the rest went back to their own).
        self._own = torch.zeros(capacity, dtype=torch.float64, device=d)
        self._boosted = torch.zeros(capacity, dtype=torch.bool, device=d)
        self._boost_step: int | None = None
        self._boost_slots = torch.zeros(0, dtype=torch.int64, device=d)  # the boosted step's inserts
        self._fields: dict[str, torch.Tensor] = {}  # (capacity, ...) views of _field_rows
        self._field_rows: dict[str, torch.Tensor] = {}
        self._aranges: dict[int, torch.Tensor] = {}  # sync-free slot choice: arange(n), made once per n
        self._step: int | None = None  # latest step seen
        # counters: device tensors of a sync-free buffer (read on the host only when asked: len(),
        # checkpoints), else host ints (freshper/sync_free.py)
        self._init_counters(capacity, d)
        self._refresh_cfg()
        self._gen = torch.Generator(device=d)
        self._gen.manual_seed(seed)
        self._st = _sumtree() if sampler == "tree" else None  # the compiled loops, looked up once
        self._tree = self._st.SumMinTree(capacity) if self._st is not None else None
        self._ref = 0.0
        self._mirror = None  # created on the first save
        self._bind_views()
        if fields:
            self._declare({k: (tuple(s), dt) for k, (s, dt) in fields.items()})

    # ----------------------------------------------------------------------------- validation
    @staticmethod
    def _check_beta(b, name):
        if not (isinstance(b, numbers.Real) and 0.0 <= b <= 1.0):
            raise ValueError(f"{name} must be a float in [0, 1], got {b!r}")

    def _check_step(self, step, name="step") -> int:
        if not _is_int(step):
            raise ValueError(f"{name} must be an int, got {step!r}")
        if self._step is not None and step < self._step:
            raise ValueError(f"{name}={step} is earlier than step {self._step} already seen")
        return int(step)

    def _check_priority(self, priority, n: int | None) -> tuple[torch.Tensor, float]:
        """(priority as a (B,) float64 tensor on the device, its largest entry), or an error."""
        src = torch.as_tensor(priority).detach()
        # host input is checked on the host, before it is copied; device input of a sync-free buffer on the device
        p = src.to(self.device if self._device_input(priority) or not self.sync_free else "cpu", torch.float64)
        if p.dim() != 1 or p.numel() == 0:
            raise ValueError(f"priority must be a non-empty 1-D sequence (B,), got shape {tuple(p.shape)}")
        if n is not None and p.numel() != n:
            raise ValueError(f"priority has {p.numel()} entries, expected {n} (one per index)")
        if self._device_input(priority):
            return p, None  # checked by the write kernel; errors at check()
        zero_ok = self.mode == "uniform" or self.eps != 0
        if self._st is not None:  # one compiled pass; the passes below only word a refusal
            code, pmax = self._st.check_priorities(p.numpy(), zero_ok)
            if code == 0:
                return p, pmax
        x, xp = (p.numpy(), np) if p.device.type == "cpu" else (p, torch)  # numpy: ~1 us a check
        bad = ~xp.isfinite(x) | (x < 0)
        if bool(bad.any()):
            raise ValueError(f"priority must be finite and >= 0; got {x[bad][:4].tolist()}")
        if not zero_ok and bool((x == 0).any()):
            raise ValueError("priority + eps must be > 0; got priority 0 with eps=0")
        return p.to(self.device), float(x.max())

    def _declare(self, spec: dict, values: dict | None = None) -> None:
        """Allocate the fields of `spec` {name: (shape, dtype)}, filled from `values` where given.
        Each has one spare row past capacity: a sync-free add the device rejects writes its rows
        there (one gated index_copy a field, no read of the old rows)."""
        for name, (shape, dtype) in spec.items():
            if not name.isidentifier() or name in ("indices", "weights", "probs", "birth", "age", "beta", "fields"):
                raise ValueError(f"field name {name!r} is not an identifier or is reserved")
        for name, (shape, dtype) in spec.items():
            rows = torch.zeros((self.capacity + 1, *shape), dtype=dtype, device=self.device)
            if values is not None:
                rows[:self.capacity] = values[name]
            self._field_rows[name], self._fields[name] = rows, rows[:self.capacity]

    def _check_fields(self, fields: dict, n: int) -> None:
        known = self._fields
        if known and set(fields) != set(known):
            raise ValueError(f"fields must be exactly {sorted(known)}, got {sorted(fields)}")
        for name, t in fields.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"field {name!r} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() == 0 or t.shape[0] != n:
                raise ValueError(f"field {name!r} must have leading dim {n} (len(priority)), "
                                 f"got shape {tuple(t.shape)}")
            if name in known:
                want = known[name]
                if tuple(t.shape[1:]) != tuple(want.shape[1:]):
                    raise ValueError(f"field {name!r} must have shape (B, {', '.join(map(str, want.shape[1:]))}), "
                                     f"got {tuple(t.shape)}")
                if t.dtype != want.dtype:
                    raise TypeError(f"field {name!r} must have dtype {want.dtype}, got {t.dtype}")

    def _check_birth(self, birth, step: int, n: int) -> torch.Tensor | None:
        """None (each slot born at `step`) or the births (n,) int64 on the device. Their values
        are checked here, except a sync-free buffer's tensor on its device: the write kernel
        checks those, and an error surfaces at check()."""
        if birth is None:
            return None
        allowed = f"an int or a ({n},) integer tensor with 0 <= birth <= step={step}"
        if _is_int(birth):
            if not 0 <= birth <= step:
                raise ValueError(f"birth must be {allowed}, got {birth}")
            return None if birth == step else torch.full((n,), int(birth), dtype=torch.int64, device=self.device)
        if not isinstance(birth, torch.Tensor) or birth.dtype.is_floating_point or birth.dtype.is_complex \
                or birth.dtype == torch.bool:
            raise ValueError(f"birth must be {allowed}, got {getattr(birth, 'dtype', type(birth).__name__)}")
        if tuple(birth.shape) != (n,):
            raise ValueError(f"birth must be {allowed}, got shape {tuple(birth.shape)}")
        b = birth.detach().to(torch.int64)
        if self._device_input(birth):
            return b
        bad = (b < 0) | (b > step)
        if bool(bad.any()):
            raise ValueError(f"birth must be {allowed}, got {b[bad][:4].tolist()}")
        return b.to(self.device)

    def _check_indices(self, indices) -> torch.Tensor:
        idx = torch.as_tensor(indices).detach()
        if idx.dim() != 1 or idx.numel() == 0 or idx.dtype.is_floating_point or idx.dtype == torch.bool:
            raise ValueError(f"indices must be a non-empty 1-D integer tensor, "
                             f"got {idx.dtype} of shape {tuple(idx.shape)}")
        if self._device_input(indices):
            return idx.to(torch.int64)  # checked by the write kernel; errors at check()
        if self.sync_free:  # host input: checked here, against the live flags the device holds
            idx = idx.to("cpu", torch.int64)
            out = (idx < 0) | (idx >= self.capacity)
            if bool(out.any()):
                raise ValueError(f"indices must lie in [0, {self.capacity}), got {idx[out][:4].tolist()}")
            return idx.to(self.device)  # liveness: checked by the write kernel (ERR_EMPTY), at check()
        idx = idx.to(self.device, torch.int64)
        if self._st is not None and self._st.check_indices(idx.numpy(), self._np_live, self.capacity) == 0:
            return idx
        x, live = (idx.numpy(), self._np_live) if self.device.type == "cpu" else (idx, self._live)
        out = (x < 0) | (x >= self.capacity)
        if bool(out.any()):
            raise ValueError(f"indices must lie in [0, {self.capacity}), got {x[out][:4].tolist()}")
        if not bool(live[x].all()):
            raise ValueError(f"indices point at empty slots: {x[~live[x]][:4].tolist()}")
        return idx

    # ------------------------------------------------------------------------------ internals
    def _write(self, slots: torch.Tensor, p: torch.Tensor, step: int | None, birth=None) -> int:
        """Set priorities of `slots` (a repeated slot keeps its last value), mark them live and,
        with `step`, re-stamp their birth (at `birth` (n,) where given, else at step). Returns how
        many of them were empty."""
        if self._tree is not None:
            newly, kmax = self._st.write_slots(
                self._np_log_base, self._np_birth, self._np_live, self._np_keys, self._tree.sums, self._tree.mins,
                self._tree.size, slots.numpy(), p.numpy(), self.eps, 0 if step is None else step, step is not None,
                _NO_BIRTHS if birth is None else birth.numpy(), self._st.MODE_CODES[self.mode], self.alpha,
                self.tau, self._ref)
            if kmax > self._ref + _REBASE_UP or self._tree.total < _REBASE_TOTAL:
                self._rebuild()
            return int(newly)
        keep = _last_occurrences(slots)
        slots, p = slots[keep], p[keep]
        newly = int((~self._live[slots]).sum())
        self._log_base[slots] = torch.log(p + self.eps)
        if step is not None:
            self._birth[slots] = step if birth is None else birth[keep]
        self._live[slots] = True
        self._keys[slots] = log_keys(self._log_base[slots], self._birth[slots], mode=self.mode, alpha=self.alpha,
                                     tau=self.tau)
        return newly

    def _bind_views(self) -> None:
        """numpy views of the CPU state, for the compiled tree loops (shared memory, no copy)."""
        if self.device.type == "cpu":
            self._np_log_base, self._np_birth = self._log_base.numpy(), self._birth.numpy()
            self._np_live, self._np_keys = self._live.numpy(), self._keys.numpy()
            self._np_own, self._np_boosted = self._own.numpy(), self._boosted.numpy()

    def _recompute_keys(self, ref: float | None = None) -> None:
        """All keys from log_base, birth and live, and the tree from scratch: O(N), on load.
        Given the saved `ref`, the rebuilt tree is bit-identical to the saved one."""
        k = log_keys(self._log_base, self._birth, mode=self.mode, alpha=self.alpha, tau=self.tau)
        self._keys = torch.where(self._live, k, torch.full_like(k, -math.inf))
        self._bind_views()
        if self._tree is not None:
            self._rebuild(ref)

    def _rebuild(self, ref: float | None = None) -> None:
        kn = self._keys.numpy()
        top = float(kn.max())  # -inf when no slot is live
        self._ref = ref if ref is not None else (top if math.isfinite(top) else 0.0)
        self._tree.rebuild_from_keys(kn, self._ref)

    def _beta_at(self, step: int) -> float:
        if callable(self.beta):
            b = self.beta(step)
            self._check_beta(b, f"beta({step})")
            return float(b)
        return float(self.beta)

    def _choose_slots(self, n: int) -> torch.Tensor:
        if self.eviction == "fifo":
            if self.sync_free:
                if n not in self._aranges:
                    self._aranges[n] = torch.arange(n, device=self.device)
                return (self._next_t + self._aranges[n]) % self.capacity
            if self.device.type == "cpu":
                return torch.from_numpy((self._next + np.arange(n)) % self.capacity)
            return (self._next + torch.arange(n, device=self.device)) % self.capacity
        free = (~self._live).nonzero().squeeze(1)
        if free.numel() >= n:
            return free[:n]
        victims = torch.topk(self._keys.masked_fill(~self._live, math.inf), n - free.numel(), largest=False).indices
        return torch.cat([free, victims])

    # ---------------------------------------------------------------------------------- API
    def __len__(self) -> int:
        return self._size

    @property
    def step(self) -> int | None:
        """The latest step this buffer has been told about."""
        return self._step

    @property
    def field_names(self) -> list[str]:
        return sorted(self._fields)

    def add(self, priority=None, step: int | None = None, birth=None, **fields) -> torch.Tensor:
        """Write B trajectories; returns their slots (B,) int64. A full buffer evicts the oldest
        (fifo) or the least likely (stalest) slots.

        Args:
            priority (torch.Tensor | None): (B,) finite floats >= 0, each trajectory's own
                priority; None: "max".
            step: the step (iteration) they were collected at, an int not earlier than any seen.
            birth (int | torch.Tensor | None): the step each was generated at, an int or (B,)
                integer tensor in [0, step]; None: step. The slots' birth is set to it, so a
                trajectory generated by older weights enters already aged (`age = step - birth`).
            **fields (torch.Tensor): tensors with leading dim B (token ids, masks, log-probs,
                rewards, ...).

        Where they enter depends on `insert`: "own" writes `priority`; "max" writes the largest
        raw priority written so far (at least 1) until `update_priorities` sets the slot (standard
        PER: new data is replayed at least once soon); "max-one-step" writes the maximum until the
        step advances, then the slot's own priority with its decay since `step` (the authors'
        FreshPER arm, whose per-iteration refresh rewrites every slot from its own priority).
        priority=None means "max" for this call (own priority unknown); "max-one-step" needs it."""
        if step is None:
            raise ValueError("step is required: the step (iteration) the trajectories were collected at")
        if priority is None:
            if self.insert == "max-one-step":
                raise ValueError("insert='max-one-step' needs priority: the own priority each slot returns to")
            sizes = {int(v.shape[0]) for v in fields.values() if hasattr(v, "shape") and len(v.shape)}
            if len(sizes) != 1:
                raise ValueError("priority=None needs fields with one leading batch size to know how many to add, "
                                 f"got sizes {sorted(sizes)}")
            n = sizes.pop()
            own = self._max_p_t.expand(n).clone() if self.sync_free else \
                torch.full((n,), self._max_priority, dtype=torch.float64, device=self.device)
        else:
            own, own_max = self._check_priority(priority, None)
        n = own.numel()
        if n > self.capacity:
            raise ValueError(f"priority has {n} entries, more than capacity={self.capacity}")
        step = self._check_step(step)
        birth = self._check_birth(birth, step, n)
        self._check_fields(fields, n)
        if not self._fields:
            self._declare({k: (tuple(v.shape[1:]), v.dtype) for k, v in fields.items()})
        at_max = priority is None or self.insert != "own"
        if self.sync_free:  # it ends the last step's boost itself, after its write: see there
            return self._add_on_device(self._choose_slots(n), own, at_max, step, birth, fields)
        self._expire_boost(step)
        if not at_max:
            self._max_priority = max(self._max_priority, own_max)
        p = torch.full_like(own, self._max_priority) if at_max else own

        slots = self._choose_slots(n)
        self._size += self._write(slots, p, step, birth)
        if self._st is not None:  # slots are distinct here: order does not matter
            self._st.set_own_in_order(self._np_own, self._np_boosted, slots.numpy(), own.numpy(),
                                      self.insert == "max-one-step")
        else:
            self._own[slots] = own
            self._boosted[slots] = self.insert == "max-one-step"
        if self.insert == "max-one-step":
            same = self._boost_step == step
            self._boost_slots = torch.cat([self._boost_slots, slots.to(self.device)]) if same else slots.to(self.device)
            self._boost_step = step
        for name, t in fields.items():
            self._fields[name][slots] = t.to(self.device)
        self._next = (self._next + n) % self.capacity
        self._added += n
        self._step = step
        return slots

    def _expire_boost(self, step: int) -> None:
        """insert="max-one-step": once the step moves past the inserts' step, the slots still at
        the maximum get their own priority back. Only those slots are touched (no O(N) refresh);
        their decay since birth is in the key already (freshper/priorities.py)."""
        old = self._boost_due(step)
        if old is None:
            return
        if self.sync_free:
            self._end_boost(old, self._boosted[old])
            return
        slots = old[self._boosted[old]]  # not since replayed or overwritten
        if slots.numel():
            self._write(slots, self._own[slots], None)
            self._boosted[slots] = False

    @property
    def max_priority(self) -> float:
        """The largest raw priority written so far (at least 1): what `add(None, ...)` inserts at."""
        return self._max_priority

    def set_tau(self, tau: float) -> None:
        """Change the decay time (freshper mode; inf: no decay). Every key depends on tau, so all
        are recomputed: O(N), meant for occasional changes such as an adaptive tau per iteration."""
        _check_tau(tau)
        self.tau = float(tau)
        self._refresh_cfg()
        self._recompute_keys()

    def probabilities(self, step: int | None = None) -> torch.Tensor:
        """Exact sampling distribution, (capacity,) float64, 0 for empty slots. The decay makes it
        depend on ages only through birth-step differences, so `step` merely has to be valid."""
        if step is not None:
            self._set_step(self._check_step(step))
            self._expire_boost(self._step)
        if self._size == 0:
            return torch.zeros(self.capacity, dtype=torch.float64, device=self.device)
        return torch.softmax(self._keys, 0)

    def sample(self, batch_size: int, step: int | None = None) -> SampleBatch:
        """Draw `batch_size` slots, one per stratum of the cumulative distribution (with
        replacement across strata).

        Args:
            batch_size: draws, > 0.
            step: the current step (int), for the IS-weight schedule and the insertion rule;
                None: the latest seen. The decay needs no step: it is in the keys already.

        Returns:
            SampleBatch: indices, IS weights, probabilities, birth, age and every field.
        """
        if not _is_int(batch_size) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not self._maybe_live if self.sync_free else self._size == 0:
            raise ValueError("cannot sample from an empty buffer; add() first")
        step, beta = self._advance(step)

        u = torch.rand(batch_size, generator=self._gen, dtype=torch.float64, device=self.device)
        idx, probs, weights = self._draw(u, beta)
        return self._batch(idx, weights, probs, step, beta)

    def _advance(self, step: int | None) -> tuple[int, float]:
        """(step, beta) of a draw at `step` (None: the latest seen), validated, with the step
        taken as the buffer's latest and any expired insertion boost ended."""
        step = self._check_step(step) if step is not None else self._step
        beta = self._beta_at(step)
        self._set_step(step)
        self._expire_boost(step)
        return step, beta

    def _draw(self, u: torch.Tensor, beta: float):
        """(slots, P(i), IS weights) of the draws whose targets are (j + u_j) / B of the live mass,
        j = 0..B-1; u_j outside [0, 1) is allowed (freshper.distributed places its strata so)."""
        if self.sampler == "tree":
            n = u.numel()
            idx, probs, weights = np.empty(n, np.int64), np.empty(n), np.empty(n)
            t = self._tree
            self._st.sample_slots(t.sums, t.mins, t.size, self._np_keys, u.numpy(), beta, idx, probs, weights)
            return torch.from_numpy(idx), torch.from_numpy(probs), torch.from_numpy(weights)
        # size > 0 is known on the host, or a sync-free buffer's sampler reports none at check()
        err = self._err if self.sync_free else None
        if self.sampler == "triton":
            return _fused().sample_triton(self._keys, u, beta, check_live=False, err=err)
        return _fused().sample_reference(self._keys, u, beta, check_live=False, err=err)

    def _batch(self, idx, weights, probs, step: int, beta: float) -> SampleBatch:
        birth = self._birth[idx]
        fields = {name: t[idx] for name, t in self._fields.items()}
        return SampleBatch(idx, weights, probs, birth, step - birth, beta, fields)

    def sample_groups(self, n_groups: int, step: int | None = None, *, by: str = "group") -> SampleBatch:
        """Draw `n_groups` groups and return every live member of each: a group is drawn by its
        members' priorities (one stratified draw of a slot, as in `sample`, then its group: group
        g is drawn with probability P(g) = sum of its members' P(i)), so group-relative
        advantages computed on the batch keep their meaning. `by` names an integer field (N,)
        holding the group id. Rows come group after group, a group drawn twice appears twice.
        probs (R,) are P(g) of each row's group, weights (R,) its IS weight
        (G·P(g))^-beta / max over live groups (G live groups). One O(N) pass per call."""
        if not _is_int(n_groups) or n_groups <= 0:
            raise ValueError(f"n_groups must be a positive int, got {n_groups!r}")
        field = self._fields.get(by)
        if field is None or field.dim() != 1 or field.dtype.is_floating_point:
            raise ValueError(f"by must name a 1-D integer field, got {by!r}; fields: {self.field_names}")
        draw = self.sample(n_groups, step)  # validates the step, advances it and draws by priority
        live = self._live.nonzero().squeeze(1)
        gid = field[live]
        order = torch.argsort(gid, stable=True)
        live, gid = live[order], gid[order]
        uniq, counts = torch.unique_consecutive(gid, return_counts=True)
        # log P(g) = logsumexp of its members' keys - logsumexp of all: in log space, so a group far
        # below the others neither underflows to 0 nor breaks the weights' minimum.
        member = torch.repeat_interleave(torch.arange(uniq.numel(), device=self.device), counts)
        k = self._keys[live]
        gmax = torch.full((uniq.numel(),), -math.inf, dtype=torch.float64, device=self.device).scatter_reduce(
            0, member, k, reduce="amax")
        gsum = torch.zeros_like(gmax).index_add_(0, member, torch.exp(k - gmax[member]))
        log_pg = gmax + torch.log(gsum) - torch.logsumexp(k, 0)
        which = torch.searchsorted(uniq, field[draw.indices])  # drawn slots are live: always found
        starts = torch.cumsum(counts, 0) - counts
        rows_per = counts[which]
        of_row = torch.repeat_interleave(torch.arange(n_groups, device=self.device), rows_per)
        offset = torch.arange(int(rows_per.sum()), device=self.device) - torch.repeat_interleave(
            torch.cumsum(rows_per, 0) - rows_per, rows_per)
        idx = live[starts[which][of_row] + offset]
        lp = log_pg[which][of_row]
        weights = torch.exp(-draw.beta * (lp - log_pg.min()))
        return self._batch(idx, weights, torch.exp(lp), self._step, draw.beta)

    def update_priorities(self, indices, priority, step: int | None = None) -> None:
        """Set the base priority of live slots; with duplicate indices the last value wins.

        Args:
            indices (torch.Tensor): (B,) int slots, from a SampleBatch; each must be live.
            priority (torch.Tensor): (B,) finite floats >= 0.
            step: if given, the slots are re-stamped as born at `step` (their age restarts).
        """
        idx = self._check_indices(indices)
        p, pmax = self._check_priority(priority, idx.numel())
        if step is not None:
            step = self._check_step(step)
        if self.sync_free:
            old = None if step is None else self._boost_due(step)
            self._device_write(idx, p, step=step, need_live=True, set_step=step is not None)
            if old is not None:  # after the write, so a rejected update (the word is sticky) ends nothing;
                self._end_boost(old, self._boosted[old])  # the slots it set are no longer boosted
            if step is not None:
                self._step = step
            return
        if step is not None:
            self._expire_boost(step)
        self._max_priority = max(self._max_priority, pmax)
        self._write(idx, p, step)
        if self._tree is not None:  # CPU: one compiled loop in order, as _write's
            self._st.set_own_in_order(self._np_own, self._np_boosted, idx.numpy(), p.numpy(), False)
        else:
            keep = _last_occurrences(idx)  # a repeated index: the last value wins here too
            self._own[idx[keep]] = p[keep]
            self._boosted[idx] = False
        if step is not None:
            self._step = step

    def evict_older_than(self, step: int) -> int:
        """Remove every live trajectory born before `step`: a hard staleness gate. Their slots
        become empty (the next adds fill them); an O(capacity) scan, meant for once a step.

        Args:
            step: an int; at step t, `evict_older_than(t - N)` leaves only ages <= N to draw.

        Returns:
            int: how many trajectories were removed.
        """
        if not _is_int(step):
            raise ValueError(f"step must be an int, got {step!r}")
        slots = (self._live & (self._birth < step)).nonzero().squeeze(1)
        n = int(slots.numel())
        if n == 0:
            return 0
        self._live[slots] = False
        self._keys[slots] = -math.inf
        self._boosted[slots] = False
        if self._tree is not None:
            self._tree.set(slots.numpy(), np.zeros(n), np.full(n, math.inf))
        self._size -= n
        return n

    # --------------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict:
        """{'meta': JSON-able dict, 'tensors': {name: CPU tensor}}; see freshper/checkpoint.py."""
        return checkpoint.buffer_state(self)

    def load_state_dict(self, sd: dict) -> None:
        checkpoint.load_buffer_state(self, sd)

    def save(self, path) -> None:
        """Write the state atomically to `path` (safetensors with JSON metadata)."""
        self._mirror = self._mirror or checkpoint.CpuMirror()
        checkpoint.save_state(path, checkpoint.buffer_state(self, self._mirror, copy=False))

    @classmethod
    def load(cls, path, *, device=None, beta=None) -> "ReplayBuffer":
        """A buffer from `save`d state. `beta` is required if the saved one was a custom callable."""
        return checkpoint.buffer_from_file(cls, path, device=device, beta=beta)

    @classmethod
    def from_state(cls, sd: dict, *, device=None, beta=None) -> "ReplayBuffer":
        """A buffer built from a `state_dict()` (its capacity and settings), e.g. one of
        freshper.distributed.reshard's."""
        return checkpoint.buffer_from_state(cls, sd, device=device, beta=beta)

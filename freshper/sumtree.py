"""A sum tree and a min tree over the buffer's slots, and the CPU buffer's hot loops, in numba.

The CPU buffer keeps, per slot, exp(k_i - ref) in the sum tree (k_i the log-key, ref a shift
the buffer moves when keys drift) and k_i itself in the min tree. Sampling is O(B log N) and
no step does work that depends on the step count: that is the point of the time-invariant
log-keys (freshper/priorities.py). Leaves live at [size, 2*size), the root at 1; empty leaves
hold 0 (sum) and +inf (min).

`write_slots` and `sample_slots` fuse the per-slot bookkeeping with the tree walk, so one
add, sample or update is a single compiled call instead of dozens of small tensor ops.
Their key formula is the one of `priorities.log_keys`; the tests hold the two equal.
"""
from __future__ import annotations

import math

import numba
import numpy as np

MODE_CODES = {"uniform": 0, "per": 1, "freshper": 2}


@numba.njit(cache=True, nogil=True)
def _set(sums, mins, size, idx, values, keys):
    for j in range(idx.shape[0]):  # in order: a repeated leaf keeps its last value
        sums[size + idx[j]] = values[j]
        mins[size + idx[j]] = keys[j]
    _lift(sums, mins, size, idx)


@numba.njit(cache=True, nogil=True)
def _build(sums, mins, size):
    for pos in range(size - 1, 0, -1):
        left = 2 * pos
        sums[pos] = sums[left] + sums[left + 1]
        mins[pos] = min(mins[left], mins[left + 1])


@numba.njit(cache=True, nogil=True)
def _build_from_keys(sums, mins, size, keys, ref):
    # exp here, not numpy's: leaves must be bit-identical to those write_slots computes.
    for i in range(keys.shape[0]):
        k = keys[i]
        sums[size + i] = math.exp(k - ref)
        mins[size + i] = k if k > -math.inf else math.inf
    _build(sums, mins, size)


@numba.njit(cache=True, nogil=True)
def _find(sums, size, targets, out):
    # All targets descend one level at a time: their loads are independent, so the CPU
    # overlaps the cache misses of the lower levels (4-5x faster than one walk after another
    # at 1e6 leaves). A subtree of zero mass is never entered: a target at or past the total
    # (float rounding) ends on the last leaf of positive mass, never on an empty slot.
    n = targets.shape[0]
    for j in range(n):
        out[j] = 1
    x = targets.copy()
    level = size
    while level > 1:
        for j in range(n):
            left = 2 * out[j]
            s_left = sums[left]
            if sums[left + 1] > 0.0 and (x[j] >= s_left or s_left <= 0.0):
                x[j] -= s_left
                out[j] = left + 1
            else:
                out[j] = left
        level >>= 1
    for j in range(n):
        out[j] -= size


@numba.njit(cache=True, nogil=True)
def _lift(sums, mins, size, idx):
    # Recompute the ancestors of the leaves `idx`, one level at a time (see _find).
    pos = idx + size
    level = size
    while level > 1:
        for j in range(pos.shape[0]):
            p = pos[j] >> 1
            pos[j] = p
            left = 2 * p
            sums[p] = sums[left] + sums[left + 1]
            mins[p] = min(mins[left], mins[left + 1])
        level >>= 1


@numba.njit(cache=True, nogil=True)
def write_slots(log_base, birth, live, keys, sums, mins, size, slots, prio, eps, step, restamp, births,
                mode, alpha, tau, ref):
    """Write priorities (and, if `restamp`, birth = births[j], or step where `births` is empty)
    of `slots` in order, so a repeated slot keeps its last value. Returns (slots that were
    empty, largest key written)."""
    newly = 0
    kmax = -math.inf
    for j in range(slots.shape[0]):
        i = slots[j]
        if not live[i]:
            newly += 1
            live[i] = True
        lb = math.log(prio[j] + eps)
        log_base[i] = lb
        if restamp:
            birth[i] = births[j] if births.shape[0] else step
        if mode == 0:
            k = 0.0
        elif mode == 1:
            k = alpha * lb
        else:
            k = alpha * (lb + birth[i] / tau)
        keys[i] = k
        kmax = max(kmax, k)
        sums[size + i] = math.exp(k - ref)
        mins[size + i] = k
    _lift(sums, mins, size, slots)
    return newly, kmax


@numba.njit(cache=True, nogil=True)
def set_own_in_order(own, boosted, slots, prio, boost):
    """own[slots[j]] = prio[j] in order (a repeated slot keeps its last value) and
    boosted[slots[j]] = boost: the insertion rules' bookkeeping of add and update_priorities,
    without a torch.unique."""
    for j in range(slots.shape[0]):
        own[slots[j]] = prio[j]
        boosted[slots[j]] = boost


@numba.njit(cache=True, nogil=True)
def check_priorities(prio, zero_ok):
    """(code, max) of priorities: code 0 if all are finite and >= 0 (and > 0 unless `zero_ok`),
    1 if one is non-finite or negative, else 2 (a zero). The buffer words the error; this only
    spares the half-dozen numpy passes of the check on every call."""
    pmax = -math.inf
    code = 0
    for j in range(prio.shape[0]):
        x = prio[j]
        if not (x >= 0.0 and x < math.inf):  # NaN fails both
            return 1, pmax
        if x == 0.0 and not zero_ok:
            code = 2
        pmax = max(pmax, x)
    return code, pmax


@numba.njit(cache=True, nogil=True)
def check_indices(idx, live, capacity):
    """0 if every index lies in [0, capacity) and points at a live slot; 1 if one lies outside
    (checked over all of them first), else 2 (an empty slot)."""
    for j in range(idx.shape[0]):
        if idx[j] < 0 or idx[j] >= capacity:
            return 1
    for j in range(idx.shape[0]):
        if not live[idx[j]]:
            return 2
    return 0


@numba.njit(cache=True, nogil=True)
def sample_slots(sums, mins, size, keys, uniforms, beta, idx, probs, weights):
    """Stratified draws: target j is (j + u_j) / B of the total. Fills idx, probs (P(i)) and
    weights exp(-beta (k_i - min k)) = (P(i) / min P)^-beta."""
    n = uniforms.shape[0]
    total = sums[1]
    kmin = mins[1]
    targets = np.empty(n)
    for j in range(n):
        targets[j] = (j + uniforms[j]) / n * total
    _find(sums, size, targets, idx)
    for j in range(n):
        i = idx[j]
        probs[j] = sums[size + i] / total
        weights[j] = math.exp(-beta * (keys[i] - kmin))


class SumMinTree:
    """Sum and min over `n` leaves. Values must be >= 0; keys may be +inf (empty)."""

    def __init__(self, n: int):
        if n <= 0:
            raise ValueError(f"n must be > 0, got {n}")
        self.n = n
        self.size = 1 << max(0, (n - 1).bit_length())
        self.sums = np.zeros(2 * self.size, dtype=np.float64)
        self.mins = np.full(2 * self.size, np.inf, dtype=np.float64)

    def set(self, idx: np.ndarray, values: np.ndarray, keys: np.ndarray) -> None:
        """Write leaves; with duplicate indices the last write wins."""
        _set(self.sums, self.mins, self.size, np.ascontiguousarray(idx, dtype=np.int64),
             np.ascontiguousarray(values, dtype=np.float64), np.ascontiguousarray(keys, dtype=np.float64))

    def rebuild_from_keys(self, keys: np.ndarray, ref: float) -> None:
        """All n leaves from log-keys (-inf for empty): exp(k - ref) and k, O(n)."""
        _build_from_keys(self.sums, self.mins, self.size, np.ascontiguousarray(keys, dtype=np.float64), ref)

    def rebuild(self, values: np.ndarray, keys: np.ndarray) -> None:
        """Replace all n leaves at once, O(n)."""
        self.sums[self.size:self.size + self.n] = values
        self.sums[self.size + self.n:] = 0.0
        self.mins[self.size:self.size + self.n] = keys
        self.mins[self.size + self.n:] = np.inf
        _build(self.sums, self.mins, self.size)

    @property
    def total(self) -> float:
        return float(self.sums[1])

    @property
    def min(self) -> float:
        return float(self.mins[1])

    def find(self, targets: np.ndarray) -> np.ndarray:
        """Leaf index i with prefix(i) <= target < prefix(i+1), for each target in [0, total)."""
        out = np.empty(targets.shape[0], dtype=np.int64)
        _find(self.sums, self.size, np.ascontiguousarray(targets, dtype=np.float64), out)
        return out

"""A sum tree and a min tree over the buffer's slots, and the CPU buffer's hot loops, in numba.

The CPU buffer keeps, per slot, exp(k_i - ref) in the sum tree (k_i the log-key, ref a shift
the buffer moves when keys drift) and k_i itself in the min tree. Sampling is O(B log N) and
no step does work that depends on the step count: that is the point of the time-invariant
log-keys (freshper/priorities.py).

The trees are 8-ary: a node's 8 children are one 64-byte cache line, so a descent or an update
at 1e6 slots crosses 7 levels (one cache miss each at most) instead of a binary tree's 20. Level
d (the root is level 0, the leaves level `depth`) starts at `offs[d]`, a multiple of 8 in an
array aligned to 64 bytes; node j of level d has its children at offs[d + 1] + 8 j + (0..7).
Empty leaves hold 0 (sum) and +inf (min). A node's sum is its children's, added left to right;
a descent compares against the same running sums, so it never enters a subtree of zero mass.

`write_slots` and `sample_slots` fuse the per-slot bookkeeping with the tree walk, so one
add, sample or update is a single compiled call instead of dozens of small tensor ops.
Their key formula is the one of `priorities.log_keys`; the tests hold the two equal.
"""
from __future__ import annotations

import math

import numba
import numpy as np

MODE_CODES = {"uniform": 0, "per": 1, "freshper": 2}
ARITY = 8  # children per node: 8 float64 = one 64-byte cache line


@numba.njit(cache=True, nogil=True, inline="always")
def _pull(sums, mins, offs, d, node):
    # Node `node` of level d from its 8 children, summed left to right.
    first = offs[d + 1] + ARITY * node
    s = 0.0
    m = math.inf
    for c in range(ARITY):
        s += sums[first + c]
        m = min(m, mins[first + c])
    sums[offs[d] + node] = s
    mins[offs[d] + node] = m


@numba.njit(cache=True, nogil=True)
def _set(sums, mins, offs, idx, values, keys):
    leaves = offs[offs.shape[0] - 1]
    for j in range(idx.shape[0]):  # in order: a repeated leaf keeps its last value
        sums[leaves + idx[j]] = values[j]
        mins[leaves + idx[j]] = keys[j]
    _lift(sums, mins, offs, idx)


@numba.njit(cache=True, nogil=True)
def _build(sums, mins, offs):
    depth = offs.shape[0] - 1
    for d in range(depth - 1, -1, -1):
        for node in range((offs[d + 1] - offs[d]) if d > 0 else 1):
            _pull(sums, mins, offs, d, node)


@numba.njit(cache=True, nogil=True)
def _build_from_keys(sums, mins, offs, keys, ref):
    # exp here, not numpy's: leaves must be bit-identical to those write_slots computes.
    leaves = offs[offs.shape[0] - 1]
    for i in range(keys.shape[0]):
        k = keys[i]
        sums[leaves + i] = math.exp(k - ref)
        mins[leaves + i] = k if k > -math.inf else math.inf
    _build(sums, mins, offs)


@numba.njit(cache=True, nogil=True)
def _find(sums, offs, targets, out):
    # All targets descend one level at a time: their loads are independent, so the CPU overlaps
    # the cache misses of the lower levels. At each node the child taken is the first whose
    # running sum passes the target; a target at or past the node's total (float rounding) takes
    # the last child of positive mass, so no draw ever ends on an empty slot.
    n = targets.shape[0]
    depth = offs.shape[0] - 1
    for j in range(n):
        out[j] = 0
    x = targets.copy()
    for d in range(depth):
        base = offs[d + 1]
        for j in range(n):
            first = base + ARITY * out[j]
            xj = x[j]
            acc = 0.0
            chosen = -1
            last = 0
            before_last = 0.0
            for c in range(ARITY):
                s = sums[first + c]
                if s > 0.0:
                    if xj < acc + s:
                        chosen = c
                        break
                    last = c
                    before_last = acc
                    acc += s
            if chosen < 0:
                chosen = last
                acc = before_last
            x[j] = xj - acc
            out[j] = ARITY * out[j] + chosen


@numba.njit(cache=True, nogil=True)
def _lift(sums, mins, offs, idx):
    # Recompute the ancestors of the leaves `idx`, one level at a time (see _find).
    depth = offs.shape[0] - 1
    pos = idx.copy()
    for d in range(depth - 1, -1, -1):
        for j in range(pos.shape[0]):
            pos[j] //= ARITY
            _pull(sums, mins, offs, d, pos[j])


@numba.njit(cache=True, nogil=True)
def write_slots(log_base, birth, live, keys, sums, mins, offs, slots, prio, eps, step, restamp,
                mode, alpha, tau, ref):
    """Write priorities (and, if `restamp`, birth = step) of `slots` in order, so a repeated
    slot keeps its last value. Returns (slots that were empty, largest key written)."""
    newly = 0
    kmax = -math.inf
    leaves = offs[offs.shape[0] - 1]
    for j in range(slots.shape[0]):
        i = slots[j]
        if not live[i]:
            newly += 1
            live[i] = True
        lb = math.log(prio[j] + eps)
        log_base[i] = lb
        if restamp:
            birth[i] = step
        if mode == 0:
            k = 0.0
        elif mode == 1:
            k = alpha * lb
        else:
            k = alpha * (lb + birth[i] / tau)
        keys[i] = k
        kmax = max(kmax, k)
        sums[leaves + i] = math.exp(k - ref)
        mins[leaves + i] = k
    _lift(sums, mins, offs, slots)
    return newly, kmax


@numba.njit(cache=True, nogil=True)
def set_own_in_order(own, boosted, slots, prio):
    """own[slots[j]] = prio[j] in order (a repeated slot keeps its last value) and the slots'
    boost ended: update_priorities' bookkeeping of the insertion rules, without a torch.unique."""
    for j in range(slots.shape[0]):
        own[slots[j]] = prio[j]
        boosted[slots[j]] = False


@numba.njit(cache=True, nogil=True)
def sample_slots(sums, mins, offs, keys, uniforms, beta, idx, probs, weights):
    """Stratified draws: target j is (j + u_j) / B of the total. Fills idx, probs (P(i)) and
    weights exp(-beta (k_i - min k)) = (P(i) / min P)^-beta."""
    n = uniforms.shape[0]
    total = sums[0]
    kmin = mins[0]
    leaves = offs[offs.shape[0] - 1]
    targets = np.empty(n)
    for j in range(n):
        targets[j] = (j + uniforms[j]) / n * total
    _find(sums, offs, targets, idx)
    for j in range(n):
        i = idx[j]
        probs[j] = sums[leaves + i] / total
        weights[j] = math.exp(-beta * (keys[i] - kmin))


def _aligned(n: int, fill: float) -> np.ndarray:
    """A float64 array of n entries whose first one sits on a 64-byte boundary."""
    raw = np.full(n + ARITY, fill, dtype=np.float64)
    shift = (-raw.ctypes.data % 64) // 8
    return raw[shift:shift + n]


class SumMinTree:
    """Sum and min over `n` leaves. Values must be >= 0; keys may be +inf (empty)."""

    def __init__(self, n: int):
        if n <= 0:
            raise ValueError(f"n must be > 0, got {n}")
        self.n = n
        depth = 1
        while ARITY ** depth < n:
            depth += 1
        self.size = ARITY ** depth  # leaves, n of them used
        # level 0 (the root) is padded to ARITY entries, so every level starts on a cache line
        self.offs = np.cumsum([0, ARITY] + [ARITY ** d for d in range(1, depth)]).astype(np.int64)
        total = int(self.offs[-1]) + self.size
        self.sums = _aligned(total, 0.0)
        self.mins = _aligned(total, np.inf)

    @property
    def leaves(self) -> int:
        """Where the leaves start in `sums` and `mins`."""
        return int(self.offs[-1])

    def set(self, idx: np.ndarray, values: np.ndarray, keys: np.ndarray) -> None:
        """Write leaves; with duplicate indices the last write wins."""
        _set(self.sums, self.mins, self.offs, np.ascontiguousarray(idx, dtype=np.int64),
             np.ascontiguousarray(values, dtype=np.float64), np.ascontiguousarray(keys, dtype=np.float64))

    def rebuild_from_keys(self, keys: np.ndarray, ref: float) -> None:
        """All n leaves from log-keys (-inf for empty): exp(k - ref) and k, O(n)."""
        _build_from_keys(self.sums, self.mins, self.offs, np.ascontiguousarray(keys, dtype=np.float64), ref)

    def rebuild(self, values: np.ndarray, keys: np.ndarray) -> None:
        """Replace all n leaves at once, O(n)."""
        lo = self.leaves
        self.sums[lo:lo + self.n] = values
        self.sums[lo + self.n:] = 0.0
        self.mins[lo:lo + self.n] = keys
        self.mins[lo + self.n:] = np.inf
        _build(self.sums, self.mins, self.offs)

    @property
    def total(self) -> float:
        return float(self.sums[0])

    @property
    def min(self) -> float:
        return float(self.mins[0])

    def find(self, targets: np.ndarray) -> np.ndarray:
        """Leaf index i with prefix(i) <= target < prefix(i+1), for each target in [0, total)."""
        out = np.empty(targets.shape[0], dtype=np.int64)
        _find(self.sums, self.offs, np.ascontiguousarray(targets, dtype=np.float64), out)
        return out

"""Fused FreshPER sampler: stable decayed weights, prefix sums, stratified search, IS weights.

Input is the buffer's per-slot log-keys k (N,), -inf for empty slots (see
freshper/priorities.py: the age decay is already inside k), B uniforms in [0, 1), and beta.
Output, for draw j, the slot i whose prefix interval holds the target
u_j = (j + U_j) / B * sum(exp(k - max k)), its probability P(i) = softmax(k)_i and its
importance weight w_i = (P(i) / min_live P)^-beta = exp(-beta (k_i - min_live k)) <= 1.

Everything is float64: masses, prefix sums, targets and residuals. In float32 the targets and
the scan carry the magnitude of the total, so at 1e6-1e7 slots a few percent of draws land in a
neighbouring slot while the returned probability is that slot's exact one, and the IS weights
cannot correct the distortion. float64 costs little here: the work is memory-bound.

Three launches, three levels, chosen by bytes moved per call and by what stays in registers
when compiled (see BENCHMARKS.md; tests/kernels/test_compile_cuda.py compiles every launch for
sm_90 and sm_80 and holds it to no spills):
`_block_stats` reads every key once (the floor: 8 N bytes) and writes, per block of BLOCK keys,
its max, min and mass sum(exp(k - block max)), and the masses of its BLOCK / SUB sub-blocks.
`_block_scan`, one program, turns the block masses (rescaled to the global max) into an
inclusive prefix sum with a running carry, chunk by chunk, and writes the global max, min and
total. `_search` takes DRAWS draws per program: a binary search of the block prefix picks each
draw's block, the stored sub-block masses its sub-block, and a rescan of that sub-block's SUB
keys its slot. A draw reads about 8 (log2(N / BLOCK) + BLOCK / SUB + SUB) bytes, and no tile is
wider than DRAWS x 64, whatever N. A float scan need not agree exactly with the separately reduced
totals, so each level picks only entries of positive mass (a block of zero mass maps to the last
positive block before it) and falls back to the last such entry: an empty slot is never returned.
With no live slot at all there is no such entry: a caller that skips the host check passes an
error word instead, every index is clamped to slot 0 (no read before an array, which on CUDA is
an illegal address) with probability and weight 0, and the word gets ERR_NO_LIVE.

Scalars that enter float64 arithmetic (beta) travel in a float64 tensor: a Python float kernel
argument is compiled as an fp32 parameter, which would round beta before the weight math.
"""
from __future__ import annotations

import torch

from .backend import HAS_TRITON, interpreted, launch_range, require_triton, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _block_stats(keys_ptr, n, bmax_ptr, bsum_ptr, bmin_ptr, sub_ptr, BLOCK: tl.constexpr, SUB: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        k = tl.load(keys_ptr + offs, mask=offs < n, other=-float("inf")).to(tl.float64)
        live = k > -float("inf")
        m = tl.max(k, axis=0)
        m_safe = tl.where(m > -float("inf"), m, 0.0)
        e = tl.where(live, tl.exp(k - m_safe), 0.0)
        sub = tl.sum(tl.reshape(e, (BLOCK // SUB, SUB)), axis=1)
        tl.store(sub_ptr + pid * (BLOCK // SUB) + tl.arange(0, BLOCK // SUB), sub)
        tl.store(bmax_ptr + pid, m)
        tl.store(bsum_ptr + pid, tl.sum(sub, axis=0))
        tl.store(bmin_ptr + pid, tl.min(tl.where(live, k, float("inf")), axis=0))

    @triton.jit
    def _max_int(a, b):
        return tl.maximum(a, b)

    @triton.jit
    def _block_scan(bmax_ptr, bsum_ptr, bmin_ptr, nb, prefix_ptr, owner_ptr, scal_ptr, err_ptr, HAS_ERR: tl.constexpr,
                    CHUNK: tl.constexpr):
        # One program: the global max and min key, then the block masses rescaled to the global
        # max, their inclusive prefix sum (chunk by chunk with a running carry) and, per block,
        # the last block of positive mass at or before it (its owner).
        lane = tl.arange(0, CHUNK)
        big = tl.full((CHUNK,), -float("inf"), tl.float64)
        low = tl.full((CHUNK,), float("inf"), tl.float64)
        for c in range(0, nb, CHUNK):
            o = c + lane
            big = tl.maximum(big, tl.load(bmax_ptr + o, mask=o < nb, other=-float("inf")))
            low = tl.minimum(low, tl.load(bmin_ptr + o, mask=o < nb, other=float("inf")))
        top = tl.max(big, axis=0)
        carry = tl.zeros((), tl.float64)
        last = tl.full((), -1, tl.int32)
        first = tl.full((), -1, tl.int32)
        for c in range(0, nb, CHUNK):
            o = c + lane
            bsum = tl.load(bsum_ptr + o, mask=o < nb, other=0.0)
            bm = tl.load(bmax_ptr + o, mask=o < nb, other=-float("inf"))
            mass = tl.where(bsum > 0, bsum * tl.exp(bm - top), 0.0)
            incl = carry + tl.cumsum(mass, axis=0)
            tl.store(prefix_ptr + o, incl, mask=o < nb)
            pos = tl.where(mass > 0, o, -1)
            own = tl.maximum(tl.associative_scan(pos, 0, _max_int), last)
            tl.store(owner_ptr + o, own, mask=o < nb)
            last = tl.max(own, axis=0)
            cand = tl.min(tl.where(mass > 0, o, 2147483647), axis=0)
            first = tl.where((first < 0) & (cand < 2147483647), cand, first)
            carry = tl.max(tl.where(o < nb, incl, 0.0), axis=0)
        # No block of positive mass (no live slot): every draw reads slot 0's key, -inf. total 1,
        # max 0, min 0 and beta -1 make its probability exp(-inf - 0) / 1 and its weight
        # exp(1 * (-inf - 0)) both 0, with no select in _search (one spilled on sm_80).
        none = first < 0
        tl.store(scal_ptr + 0, tl.where(none, 1.0, carry))
        tl.store(scal_ptr + 1, tl.where(none, 0.0, top))
        tl.store(scal_ptr + 2, tl.where(none, 0.0, tl.min(low, axis=0)))
        beta = tl.load(scal_ptr + 3)
        tl.store(scal_ptr + 3, tl.where(none, -1.0, beta))
        tl.store(scal_ptr + 4, first.to(tl.float64))
        if HAS_ERR:  # no block of positive mass: no live slot
            e = tl.load(err_ptr)
            tl.store(err_ptr, tl.where(first < 0, e | 32, e))

    @triton.jit
    def _pick(incl, mass, target, lanes, WIDTH: tl.constexpr):
        """Per row: the first lane of positive mass whose inclusive sum exceeds the target, else
        the last lane of positive mass. incl, mass: [R, WIDTH]; target: [R]."""
        pos = mass > 0
        hit = (incl > target[:, None]) & pos
        first = tl.min(tl.where(hit, lanes, WIDTH), axis=1)
        last = tl.max(tl.where(pos, lanes, -1), axis=1)
        return tl.where(first == WIDTH, last, first)

    @triton.jit
    def _search(keys_ptr, n, bmax_ptr, bsum_ptr, prefix_ptr, owner_ptr, sub_ptr, scal_ptr, nb, n_steps, u_ptr,
                n_draws, idx_ptr, prob_ptr, w_ptr, BLOCK: tl.constexpr, SUB: tl.constexpr, NSUB: tl.constexpr,
                DRAWS: tl.constexpr):
        j = tl.program_id(0) * DRAWS + tl.arange(0, DRAWS)
        jmask = j < n_draws
        total = tl.load(scal_ptr + 0)
        top = tl.load(scal_ptr + 1)
        kmin = tl.load(scal_ptr + 2)
        beta = tl.load(scal_ptr + 3)
        first = tl.load(scal_ptr + 4).to(tl.int32)
        u = tl.load(u_ptr + j, mask=jmask, other=0.0).to(tl.float64)
        target = (j.to(tl.float64) + u) / n_draws * total
        # Level 1: the first block whose inclusive prefix exceeds the target (binary search).
        lo = tl.zeros((DRAWS,), tl.int32)
        hi = tl.full((DRAWS,), nb, tl.int32)
        for _ in range(n_steps):
            mid = (lo + hi) // 2
            right = tl.load(prefix_ptr + mid, mask=mid < nb, other=float("inf")) <= target
            lo = tl.where(right & (lo < hi), mid + 1, lo)
            hi = tl.where(~right & (lo < hi), mid, hi)
        b = tl.load(owner_ptr + tl.minimum(lo, nb - 1))
        # only zero-mass blocks before it: the first positive one (none: block 0, never block -1)
        b = tl.where(b < 0, tl.maximum(first, 0), b)
        bm = tl.load(bmax_ptr + b)
        scale = tl.exp(bm - top)
        mass = tl.load(bsum_ptr + b) * scale
        # Residual inside block b, in units of exp(k - block max), so no block underflows.
        rest = (target - (tl.load(prefix_ptr + b) - mass)) / scale
        b = b.to(tl.int64)
        # Level 2: the block's sub-block masses, written by _block_stats.
        so = tl.arange(0, NSUB)
        s = tl.load(sub_ptr + b[:, None] * NSUB + so[None, :], mask=jmask[:, None], other=0.0)
        cs = tl.cumsum(s, axis=1)
        c = tl.maximum(_pick(cs, s, rest, so[None, :], NSUB), 0)
        csel = so[None, :] == c[:, None]
        rest = rest - tl.sum(tl.where(csel, cs - s, 0.0), axis=1)
        # Level 3: the SUB keys of that sub-block.
        lo3 = tl.arange(0, SUB)
        offs = b[:, None] * BLOCK + c[:, None] * SUB + lo3[None, :]
        k = tl.load(keys_ptr + offs, mask=(offs < n) & jmask[:, None], other=-float("inf")).to(tl.float64)
        e = tl.where(k > -float("inf"), tl.exp(k - bm[:, None]), 0.0)
        i = tl.maximum(_pick(tl.cumsum(e, axis=1), e, rest, lo3[None, :], SUB), 0)
        ki = tl.sum(tl.where(lo3[None, :] == i[:, None], k, 0.0), axis=1)
        tl.store(idx_ptr + j, b * BLOCK + c * SUB + i, mask=jmask)
        tl.store(prob_ptr + j, tl.exp(ki - top) / total, mask=jmask)
        tl.store(w_ptr + j, tl.exp(-beta * (ki - kmin)), mask=jmask)


# Elements of the widest per-program tile (draws x max(sub-blocks, SUB)) and of a scan chunk:
# small enough to stay in registers when compiled (no spills on sm_80/sm_90, tested); the CPU
# interpreter pays per program and per loop trip, so it gets more.
_TILE, _CHUNK = 1024, 1024
_TILE_INTERPRETED, _CHUNK_INTERPRETED = 65536, 16384
_SUB = 64  # keys per sub-block: 512 bytes of float64, one coalesced read per draw
MAX_SLOTS = 2**31 - 1  # int32 slot counts and block indices in the kernels
# Set in a caller's error word when no slot is live; the bit is free in freshper.kernels.slot_write's word
# (the buffer shares one word between writes and draws). 32 is written literally in _block_scan.
ERR_NO_LIVE = 32


def _check(keys: torch.Tensor, uniforms: torch.Tensor, beta: float, check_live: bool, err=None) -> None:
    if keys.dim() != 1 or keys.numel() == 0:
        raise ValueError(f"keys must be a non-empty 1-D tensor, got shape {tuple(keys.shape)}")
    if uniforms.dim() != 1 or uniforms.numel() == 0:
        raise ValueError(f"uniforms must be a non-empty 1-D tensor, got shape {tuple(uniforms.shape)}")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    if err is not None and (tuple(err.shape) != (1,) or err.dtype != torch.int32 or err.device != keys.device):
        raise ValueError(f"err must be a (1,) int32 tensor on the keys' device, got {err.dtype} {tuple(err.shape)} "
                         f"on {err.device}")
    if check_live and not bool((keys > float("-inf")).any()):  # one host sync; callers that know skip it
        raise ValueError("keys has no live slot (every key is -inf): nothing to sample")


def sample_reference(keys: torch.Tensor, uniforms: torch.Tensor, beta: float, *, check_live: bool = True,
                     err: torch.Tensor | None = None):
    """Torch reference, float64. keys (N,), uniforms (B,) in [0, 1) -> (indices (B,) int64,
    probs (B,) float64, weights (B,) float64). At least one key must be finite; `check_live=False`
    skips that check (a host sync) for callers that know, or that pass `err` (1,) int32: with no
    live slot every draw is then slot 0 with probability and weight 0, and ERR_NO_LIVE is or-ed
    into err. No other host sync: it is also the fair torch composite (exp, cumsum, searchsorted)
    the kernel is benchmarked against."""
    _check(keys, uniforms, beta, check_live, err)
    k = keys.double()
    n = k.numel()
    live = k > float("-inf")
    big = k.max()
    e = torch.where(live, torch.exp(k - big), torch.zeros_like(k))
    prefix = torch.cumsum(e, 0)
    total = prefix[-1]
    n_draws = uniforms.numel()
    j = torch.arange(n_draws, device=k.device, dtype=torch.float64)
    targets = (j + uniforms.double()) / n_draws * total
    idx = torch.searchsorted(prefix, targets, right=True)
    # First slot of positive mass at or after idx; past the end, the last positive slot.
    positive = e > 0
    ar = torch.arange(n, device=k.device)
    nxt = torch.where(positive, ar, n).flip(0).cummin(0).values.flip(0)
    last = torch.where(positive, ar, -1).max()
    idx = torch.minimum(torch.where(idx < n, nxt[idx.clamp(max=n - 1)], last), last).clamp(min=0)  # none: -1
    kmin = torch.where(live, k, float("inf")).min()
    ki = k[idx]
    none = last < 0
    if err is not None:
        err.bitwise_or_(none.int() * ERR_NO_LIVE)
    zero = torch.zeros((), dtype=torch.float64, device=k.device)
    probs = torch.where(none, zero, torch.exp(ki - big) / total)
    return idx, probs, torch.where(none, zero, torch.exp(-beta * (ki - kmin)))


def _plan(n: int, n_draws: int, block: int | None, *, compiled: bool | None = None) -> tuple[int, int, int, int, int]:
    """(BLOCK, SUB, number of blocks, draws per program, scan chunk) for N keys and B draws, for
    compiled code or the interpreter (None: whichever runs here)."""
    if n > MAX_SLOTS:
        raise ValueError(f"keys has {n} slots; the sampler supports at most {MAX_SLOTS} (2^31 - 1)")
    if block is None:
        block = min(4096, triton.next_power_of_2(max(n, 2 * _SUB)))
    elif not (isinstance(block, int) and block >= 16 and block & (block - 1) == 0):
        raise ValueError(f"block must be a power of two >= 16, got {block!r}")
    sub = min(_SUB, block // 2)  # at least two sub-blocks: no scan runs over an axis of length 1
    nb = triton.cdiv(n, block)
    compiled = not interpreted() if compiled is None else compiled
    tile, chunk = (_TILE, _CHUNK) if compiled else (_TILE_INTERPRETED, _CHUNK_INTERPRETED)
    draws = max(1, min(triton.next_power_of_2(n_draws), tile // max(block // sub, sub)))
    return block, sub, nb, draws, min(chunk, max(16, triton.next_power_of_2(nb)))


def sample_triton(keys: torch.Tensor, uniforms: torch.Tensor, beta: float, block: int | None = None, *,
                  check_live: bool = True, err: torch.Tensor | None = None):
    """The fused Triton sampler; same contract as `sample_reference` (float64 probs and weights,
    `err`). block: keys per first-level block, a power of two >= 16 (None: up to 4096). At most
    2^31 - 1 slots."""
    _check(keys, uniforms, beta, check_live, err)
    require_triton(keys)
    n = keys.numel()
    n_draws = uniforms.numel()
    block, sub, nb, draws, chunk = _plan(n, n_draws, block)
    dev = keys.device
    keys = keys.contiguous()
    f64 = dict(dtype=torch.float64, device=dev)
    bmax, bsum, bmin, prefix = (torch.empty(nb, **f64) for _ in range(4))
    owner = torch.empty(nb, dtype=torch.int32, device=dev)
    subs = torch.empty(nb * (block // sub), **f64)
    scal = torch.full((5,), float(beta), **f64)  # [total, max, min, beta, first positive block]
    idx = torch.empty(n_draws, dtype=torch.int64, device=dev)
    prob = torch.empty(n_draws, **f64)
    w = torch.empty(n_draws, **f64)
    with launch_range("kernel:sampler"):
        _block_stats[(nb,)](keys, n, bmax, bsum, bmin, subs, BLOCK=block, SUB=sub)
        _block_scan[(1,)](bmax, bsum, bmin, nb, prefix, owner, scal, owner if err is None else err,
                          HAS_ERR=err is not None, CHUNK=chunk)
        _search[(triton.cdiv(n_draws, draws),)](keys, n, bmax, bsum, prefix, owner, subs, scal, nb,
                                                nb.bit_length(), uniforms.contiguous(), n_draws, idx, prob, w,
                                                BLOCK=block, SUB=sub, NSUB=block // sub, DRAWS=draws)
    return idx, prob, w


def sample(keys: torch.Tensor, uniforms: torch.Tensor, beta: float, *, check_live: bool = True, err=None):
    """Stratified FreshPER draw: Triton on CUDA, the torch reference elsewhere."""
    if use_triton(keys):
        return sample_triton(keys, uniforms, beta, check_live=check_live, err=err)
    return sample_reference(keys, uniforms, beta, check_live=check_live, err=err)

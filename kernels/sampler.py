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

Two launches, three levels, chosen by bytes moved per call (see BENCHMARKS.md):
`_block_stats` reads every key once (the floor: 8 N bytes) and writes, per block of BLOCK keys,
its max, min and mass sum(exp(k - block max)), and the masses of its BLOCK / SUB sub-blocks.
`_search` takes DRAWS draws per program: it scans the block masses (rescaled to the global max,
a few thousand at most, from L2), picks each draw's block, then its sub-block from the stored
sub-block masses, then rescans only that sub-block's SUB keys. A draw reads about
8 (BLOCK / SUB + SUB) bytes instead of a whole block. A float scan need not agree exactly with
the separately reduced totals, so each level picks only entries of positive mass and falls back
to the last such entry: an empty slot is never returned.
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
    def _pick(incl, mass, target, lanes, WIDTH: tl.constexpr):
        """Per row: the first lane of positive mass whose inclusive sum exceeds the target, else
        the last lane of positive mass. incl, mass: [R, WIDTH] (or [WIDTH]); target: [R]."""
        pos = mass > 0
        hit = (incl > target[:, None]) & pos
        first = tl.min(tl.where(hit, lanes, WIDTH), axis=1)
        last = tl.max(tl.where(pos, lanes, -1), axis=1)
        return tl.where(first == WIDTH, last, first)

    @triton.jit
    def _search(keys_ptr, n, bmax_ptr, bsum_ptr, bmin_ptr, sub_ptr, nb, u_ptr, n_draws, beta,
                idx_ptr, prob_ptr, w_ptr, BLOCK: tl.constexpr, SUB: tl.constexpr, NSUB: tl.constexpr,
                NB_BLOCK: tl.constexpr, DRAWS: tl.constexpr):
        j = tl.program_id(0) * DRAWS + tl.arange(0, DRAWS)
        jmask = j < n_draws
        # Level 1: blocks. Masses rescaled to the global max; every program rescans them (L2).
        bo = tl.arange(0, NB_BLOCK)
        bmask = bo < nb
        bmax = tl.load(bmax_ptr + bo, mask=bmask, other=-float("inf"))
        bsum = tl.load(bsum_ptr + bo, mask=bmask, other=0.0)
        kmin = tl.min(tl.load(bmin_ptr + bo, mask=bmask, other=float("inf")), axis=0)
        big = tl.max(bmax, axis=0)
        scale = tl.where(bsum > 0, tl.exp(bmax - big), 0.0)
        mass = bsum * scale
        incl = tl.cumsum(mass, axis=0)
        total = tl.sum(mass, axis=0)
        u = tl.load(u_ptr + j, mask=jmask, other=0.0).to(tl.float64)
        target = (j.to(tl.float64) + u) / n_draws * total
        b = _pick(incl[None, :], mass[None, :], target, bo[None, :], NB_BLOCK)
        sel = bo[None, :] == b[:, None]
        before = tl.sum(tl.where(sel, (incl - mass)[None, :], 0.0), axis=1)
        # Residual inside block b, in units of exp(k - block max), so no block underflows.
        rest = (target - before) / tl.sum(tl.where(sel, scale[None, :], 0.0), axis=1)
        bm = tl.sum(tl.where(sel, bmax[None, :], 0.0), axis=1)
        b = b.to(tl.int64)
        # Level 2: the block's sub-block masses, written by _block_stats.
        so = tl.arange(0, NSUB)
        s = tl.load(sub_ptr + b[:, None] * NSUB + so[None, :], mask=jmask[:, None], other=0.0)
        cs = tl.cumsum(s, axis=1)
        c = _pick(cs, s, rest, so[None, :], NSUB)
        csel = so[None, :] == c[:, None]
        rest = rest - tl.sum(tl.where(csel, cs - s, 0.0), axis=1)
        # Level 3: the SUB keys of that sub-block.
        lo = tl.arange(0, SUB)
        offs = b[:, None] * BLOCK + c[:, None] * SUB + lo[None, :]
        k = tl.load(keys_ptr + offs, mask=(offs < n) & jmask[:, None], other=-float("inf")).to(tl.float64)
        e = tl.where(k > -float("inf"), tl.exp(k - bm[:, None]), 0.0)
        i = _pick(tl.cumsum(e, axis=1), e, rest, lo[None, :], SUB)
        ki = tl.sum(tl.where(lo[None, :] == i[:, None], k, 0.0), axis=1)
        tl.store(idx_ptr + j, b * BLOCK + c * SUB + i, mask=jmask)
        tl.store(prob_ptr + j, tl.exp(ki - big) / total, mask=jmask)
        tl.store(w_ptr + j, tl.exp(-beta * (ki - kmin)), mask=jmask)


# Elements of the widest per-program tile, draws x max(blocks, sub-blocks, SUB): small enough
# to stay in registers when compiled; the CPU interpreter pays per program, so it gets more.
_TILE = 4096
_TILE_INTERPRETED = 65536
_SUB = 64  # keys per sub-block: 512 bytes of float64, one coalesced read per draw


def _check(keys: torch.Tensor, uniforms: torch.Tensor, beta: float, check_live: bool) -> None:
    if keys.dim() != 1 or keys.numel() == 0:
        raise ValueError(f"keys must be a non-empty 1-D tensor, got shape {tuple(keys.shape)}")
    if uniforms.dim() != 1 or uniforms.numel() == 0:
        raise ValueError(f"uniforms must be a non-empty 1-D tensor, got shape {tuple(uniforms.shape)}")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    if check_live and not bool((keys > float("-inf")).any()):  # one host sync; callers that know skip it
        raise ValueError("keys has no live slot (every key is -inf): nothing to sample")


def sample_reference(keys: torch.Tensor, uniforms: torch.Tensor, beta: float, *, check_live: bool = True):
    """Torch reference, float64. keys (N,), uniforms (B,) in [0, 1) -> (indices (B,) int64,
    probs (B,) float64, weights (B,) float64). At least one key must be finite; `check_live=False`
    skips that check (a host sync) for callers that know. No other host sync: it is also the fair
    torch composite (exp, cumsum, searchsorted) the kernel is benchmarked against."""
    _check(keys, uniforms, beta, check_live)
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
    idx = torch.minimum(torch.where(idx < n, nxt[idx.clamp(max=n - 1)], last), last)
    kmin = torch.where(live, k, float("inf")).min()
    ki = k[idx]
    return idx, torch.exp(ki - big) / total, torch.exp(-beta * (ki - kmin))


def _plan(n: int, n_draws: int, block: int | None) -> tuple[int, int, int, int]:
    """(BLOCK, SUB, number of blocks, draws per program) for N keys and B draws."""
    if block is None:
        block = min(4096, triton.next_power_of_2(max(n, _SUB)))
    elif not (isinstance(block, int) and block >= 16 and block & (block - 1) == 0):
        raise ValueError(f"block must be a power of two >= 16, got {block!r}")
    sub = min(_SUB, block)
    nb = triton.cdiv(n, block)
    nb_block = triton.next_power_of_2(nb)
    if nb_block > 16384:
        raise ValueError(f"keys has {n} slots; with block={block} at most {16384 * block} are supported")
    width = max(nb_block, block // sub, sub)
    tile = _TILE_INTERPRETED if interpreted() else _TILE
    draws = max(1, min(triton.next_power_of_2(n_draws), tile // width))
    return block, sub, nb, draws


def sample_triton(keys: torch.Tensor, uniforms: torch.Tensor, beta: float, block: int | None = None, *,
                  check_live: bool = True):
    """The fused Triton sampler; same contract as `sample_reference` (float64 probs and weights).
    block: keys per first-level block, a power of two >= 16 (None: up to 4096)."""
    _check(keys, uniforms, beta, check_live)
    require_triton(keys)
    n = keys.numel()
    n_draws = uniforms.numel()
    block, sub, nb, draws = _plan(n, n_draws, block)
    dev = keys.device
    keys = keys.contiguous()
    bmax = torch.empty(nb, dtype=torch.float64, device=dev)
    bsum = torch.empty(nb, dtype=torch.float64, device=dev)
    bmin = torch.empty(nb, dtype=torch.float64, device=dev)
    subs = torch.empty(nb * (block // sub), dtype=torch.float64, device=dev)
    idx = torch.empty(n_draws, dtype=torch.int64, device=dev)
    prob = torch.empty(n_draws, dtype=torch.float64, device=dev)
    w = torch.empty(n_draws, dtype=torch.float64, device=dev)
    with launch_range("kernel:sampler"):
        _block_stats[(nb,)](keys, n, bmax, bsum, bmin, subs, BLOCK=block, SUB=sub)
        _search[(triton.cdiv(n_draws, draws),)](keys, n, bmax, bsum, bmin, subs, nb, uniforms.contiguous(), n_draws,
                                                float(beta), idx, prob, w, BLOCK=block, SUB=sub,
                                                NSUB=block // sub, NB_BLOCK=triton.next_power_of_2(nb), DRAWS=draws)
    return idx, prob, w


def sample(keys: torch.Tensor, uniforms: torch.Tensor, beta: float, *, check_live: bool = True):
    """Stratified FreshPER draw: Triton on CUDA, the torch reference elsewhere."""
    if use_triton(keys):
        return sample_triton(keys, uniforms, beta, check_live=check_live)
    return sample_reference(keys, uniforms, beta, check_live=check_live)

"""Fused FreshPER sampler: stable decayed weights, prefix sum, stratified search, IS weights.

Input is the buffer's per-slot log-keys k (N,), -inf for empty slots (see
freshper/priorities.py: the age decay is already inside k), B uniforms in [0, 1), and beta.
Output, for draw j, the slot i whose prefix interval holds the target
u_j = (j + U_j) / B * sum(exp(k - max k)), its probability P(i) = softmax(k)_i and its
importance weight w_i = (P(i) / min_live P)^-beta = exp(-beta (k_i - min_live k)) <= 1.

The Triton path is two launches. `_block_stats` reduces each block of keys to its max, its
sum of exp(k - block max) and its min (an online-softmax partial). `_search` handles a few
draws per program: it rescales and scans the block totals itself (at most a few thousand),
picks each draw's block, rescans that block in registers and finds the slot. A float scan need not be monotone
and its total can fall below the last target, so both searches pick only entries of positive
mass and fall back to the last such entry: an empty slot is never returned.
"""
from __future__ import annotations

import torch

from freshper.profiling.nvtx import nvtx_range

from .backend import HAS_TRITON, require_triton, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _block_stats(keys_ptr, n, bmax_ptr, bsum_ptr, bmin_ptr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        k = tl.load(keys_ptr + offs, mask=offs < n, other=-float("inf")).to(tl.float64)
        live = k > -float("inf")
        m = tl.max(k, axis=0)
        m_safe = tl.where(m > -float("inf"), m, 0.0)
        e = tl.where(live, tl.exp((k - m_safe).to(tl.float32)), 0.0)
        tl.store(bmax_ptr + pid, m)
        tl.store(bsum_ptr + pid, tl.sum(e, axis=0))
        tl.store(bmin_ptr + pid, tl.min(tl.where(live, k, float("inf")), axis=0))

    @triton.jit
    def _search(keys_ptr, n, bmax_ptr, bsum_ptr, bmin_ptr, nb, u_ptr, n_draws, beta,
                idx_ptr, prob_ptr, w_ptr, BLOCK: tl.constexpr, NB_BLOCK: tl.constexpr, DRAWS: tl.constexpr):
        # DRAWS draws per program, as rows of 2-D tiles: [DRAWS, NB_BLOCK] to pick the block,
        # [DRAWS, BLOCK] to search inside it. The wrapper keeps both tiles near 8k elements.
        j = tl.program_id(0) * DRAWS + tl.arange(0, DRAWS)
        jmask = j < n_draws
        bo = tl.arange(0, NB_BLOCK)
        bmask = bo < nb
        bmax = tl.load(bmax_ptr + bo, mask=bmask, other=-float("inf"))
        bsum = tl.load(bsum_ptr + bo, mask=bmask, other=0.0)
        kmin = tl.min(tl.load(bmin_ptr + bo, mask=bmask, other=float("inf")), axis=0)
        big = tl.max(bmax, axis=0)
        scale = tl.where(bsum > 0, tl.exp((bmax - big).to(tl.float32)), 0.0)
        mass = bsum * scale
        incl = tl.cumsum(mass, axis=0)
        total = tl.sum(mass, axis=0)
        u = tl.load(u_ptr + j, mask=jmask, other=0.0).to(tl.float32)
        target = (j.to(tl.float32) + u) / n_draws * total
        pos = mass > 0
        hit = (incl[None, :] > target[:, None]) & pos[None, :]
        b = tl.min(tl.where(hit, bo[None, :], NB_BLOCK), axis=1)
        b = tl.where(b == NB_BLOCK, tl.max(tl.where(pos, bo, -1), axis=0), b)
        sel = bo[None, :] == b[:, None]
        # Residual inside block b, in units of exp(k - block max) so the block never underflows.
        before = tl.sum(tl.where(sel, (incl - mass)[None, :], 0.0), axis=1)
        rest = (target - before) / tl.sum(tl.where(sel, scale[None, :], 0.0), axis=1)
        bm = tl.sum(tl.where(sel, bmax[None, :], 0.0), axis=1)

        lo = tl.arange(0, BLOCK)
        offs = b[:, None] * BLOCK + lo[None, :]
        k = tl.load(keys_ptr + offs, mask=(offs < n) & jmask[:, None], other=-float("inf")).to(tl.float64)
        e = tl.where(k > -float("inf"), tl.exp((k - bm[:, None]).to(tl.float32)), 0.0)
        c = tl.cumsum(e, axis=1)
        i = tl.min(tl.where((c > rest[:, None]) & (e > 0), lo[None, :], BLOCK), axis=1)
        i = tl.where(i == BLOCK, tl.max(tl.where(e > 0, lo[None, :], -1), axis=1), i)
        ki = tl.sum(tl.where(lo[None, :] == i[:, None], k, 0.0), axis=1)
        tl.store(idx_ptr + j, (b * BLOCK + i).to(tl.int64), mask=jmask)
        tl.store(prob_ptr + j, tl.exp((ki - big).to(tl.float32)) / total, mask=jmask)
        tl.store(w_ptr + j, tl.exp((-beta * (ki - kmin)).to(tl.float32)), mask=jmask)


_TILE = 8192  # elements of a search tile: draws per program x max(block, number of blocks)


def _check(keys: torch.Tensor, uniforms: torch.Tensor, beta: float) -> None:
    if keys.dim() != 1 or keys.numel() == 0:
        raise ValueError(f"keys must be a non-empty 1-D tensor, got shape {tuple(keys.shape)}")
    if uniforms.dim() != 1 or uniforms.numel() == 0:
        raise ValueError(f"uniforms must be a non-empty 1-D tensor, got shape {tuple(uniforms.shape)}")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")


def sample_reference(keys: torch.Tensor, uniforms: torch.Tensor, beta: float):
    """Torch reference, float64. keys (N,), uniforms (B,) -> (indices (B,) int64,
    probs (B,) float64, weights (B,) float64). At least one key must be finite."""
    _check(keys, uniforms, beta)
    k = keys.double()
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
    ar = torch.arange(k.numel(), device=k.device)
    nxt = torch.where(positive, ar, k.numel()).flip(0).cummin(0).values.flip(0)
    last = int(ar[positive].max())
    idx = torch.where(idx < k.numel(), nxt[idx.clamp(max=k.numel() - 1)], last).clamp(max=last)
    kmin = k[live].min()
    ki = k[idx]
    return idx, torch.exp(ki - big) / total, torch.exp(-beta * (ki - kmin))


def sample_triton(keys: torch.Tensor, uniforms: torch.Tensor, beta: float, block: int | None = None):
    """The fused Triton sampler; same contract as `sample_reference`, float32 probs and weights."""
    _check(keys, uniforms, beta)
    require_triton(keys)
    n = keys.numel()
    if block is None:
        block = min(4096, triton.next_power_of_2(max(n, 16)))
    nb = triton.cdiv(n, block)
    nb_block = triton.next_power_of_2(nb)
    if nb_block > 16384:
        raise ValueError(f"keys has {n} slots; with block={block} at most {16384 * block} are supported")
    dev = keys.device
    keys = keys.contiguous()
    bmax = torch.empty(nb, dtype=torch.float64, device=dev)
    bsum = torch.empty(nb, dtype=torch.float32, device=dev)
    bmin = torch.empty(nb, dtype=torch.float64, device=dev)
    n_draws = uniforms.numel()
    idx = torch.empty(n_draws, dtype=torch.int64, device=dev)
    prob = torch.empty(n_draws, dtype=torch.float32, device=dev)
    w = torch.empty(n_draws, dtype=torch.float32, device=dev)
    draws = max(1, min(triton.next_power_of_2(n_draws), _TILE // max(block, nb_block)))
    with nvtx_range("kernel:sampler"):
        _block_stats[(nb,)](keys, n, bmax, bsum, bmin, BLOCK=block)
        _search[(triton.cdiv(n_draws, draws),)](keys, n, bmax, bsum, bmin, nb, uniforms.contiguous(), n_draws,
                                                float(beta), idx, prob, w, BLOCK=block, NB_BLOCK=nb_block,
                                                DRAWS=draws)
    return idx, prob, w


def sample(keys: torch.Tensor, uniforms: torch.Tensor, beta: float):
    """Stratified FreshPER draw: Triton on CUDA, the torch reference elsewhere."""
    if use_triton(keys):
        return sample_triton(keys, uniforms, beta)
    return sample_reference(keys, uniforms, beta)

"""One pass over rows of logits: log-prob of the target, the policy term, and the gradient in place.

This is the row half of freshper.kernels.fused_linear_policy_loss. A chunk of n active tokens has
its (n, V) logits z written by cuBLAS into a reused buffer; for each row this op computes, in
float32,

    lse = logsumexp_v z_v        logp = z_y - lse
    l, dl = the token's policy term and its derivative d l / d logp (token_terms.py)

and then, when a gradient is wanted, writes

    d_v = coef * dl * (1[v = y] - exp(z_v - lse))          (d loss / d z_v, in the GEMMs' dtype)

over the row, or into `out`: the buffer of the GEMMs' dtype (`grad_buffer`), so that the two
GEMMs after it (d @ W for the hidden states, d^T @ h for the head) finish the gradient without
the logits ever existing twice, and float32 logits need no cast pass before bf16 GEMMs: the
kernel's store rounds. On the Triton path that buffer is the float32 logits' own memory (row i's
bf16 gradient in the first half of row i's bytes). Numerics follow eager autograd: log-softmax
and its gradient run in float32, and the gradient is rounded once to the GEMMs' dtype, as
eager's gradient of its logits is.

Modes (`mode`):
    "logp":  read only; logp and lse.
    "loss":  logp, lse, the token terms, and the gradient written.
    "given": the gradient written from a given per-token g = d loss / d logp and lse
             (the second pass of a loss whose tokens depend on each other, e.g. GSPO's ratio).

Per-token inputs are flat (n,) float32 (the chunk's active tokens in order). Nothing here reads
device data on the host. A target outside [0, V) gives a NaN log-prob (never an out-of-bounds
read); the public fused op can check targets on the host first.
"""
from __future__ import annotations

import torch

from .backend import HAS_TRITON, launch_range, require_triton, use_triton
from .token_terms import token_terms

MODES = ("logp", "loss", "given")

if HAS_TRITON:
    import triton
    import triton.language as tl

    from .token_terms import policy_term

    @triton.jit
    def _rows(z_ptr, stride_z, d_ptr, stride_d, y_ptr, V, lse_ptr, logp_ptr, g_ptr, old_ptr, adv_ptr, scale_ptr,
              coef_ptr, ref_ptr, tis_ptr, terms_ptr, clip_low, clip_high, kl_coef, tis_cap,
              MODE: tl.constexpr, OWN: tl.constexpr, HAS_KL: tl.constexpr, HAS_TIS: tl.constexpr,
              CISPO: tl.constexpr, PACKED: tl.constexpr, BLOCK_V: tl.constexpr):
        # MODE 0: logp, 1: loss (+ gradient), 2: given g (gradient). The gradient goes to d_ptr in its
        # dtype: z itself, another buffer, or (PACKED) z's own row memory read as a narrower dtype.
        row = tl.program_id(0).to(tl.int64)
        base = z_ptr + row * stride_z
        y = tl.load(y_ptr + row)
        valid = (y >= 0) & (y < V)
        cols = tl.arange(0, BLOCK_V)
        if MODE == 2:
            lse = tl.load(lse_ptr + row)
        else:
            # Online logsumexp, one lane per column of a block: a lane's running max and sum.
            m = tl.full((BLOCK_V,), -float("inf"), tl.float32)
            s = tl.zeros((BLOCK_V,), tl.float32)
            for v0 in range(0, V, BLOCK_V):
                x = tl.load(base + v0 + cols, mask=v0 + cols < V, other=-float("inf")).to(tl.float32)
                new = tl.maximum(m, x)
                safe = tl.where(new > -float("inf"), new, 0.0)
                s = s * tl.exp(m - safe) + tl.exp(x - safe)
                m = new
            top = tl.max(m, axis=0)
            s_all = tl.sum(s * tl.exp(m - top), axis=0)
            lse = top + tl.log(s_all)
            zy = tl.load(base + tl.where(valid, y, 0)).to(tl.float32)
            lp = tl.where(valid, zy - lse, float("nan"))
            tl.store(lse_ptr + row, lse)
            tl.store(logp_ptr + row, lp)
        if MODE == 1:
            if OWN:
                old = lp
            else:
                old = tl.load(old_ptr + row)
            ref = 0.0
            if HAS_KL:
                ref = tl.load(ref_ptr + row)
            tis = 0.0
            if HAS_TIS:
                tis = tl.load(tis_ptr + row)
            loss, dl, clip_active, ratio, kl = policy_term(
                lp, old, tl.load(adv_ptr + row), tl.load(scale_ptr + row), ref, tis, clip_low, clip_high, kl_coef,
                tis_cap, HAS_KL, HAS_TIS, CISPO)
            g = tl.load(coef_ptr + row) * dl
            out = terms_ptr + row * 4
            tl.store(out + 0, loss)
            tl.store(out + 1, clip_active.to(tl.float32))
            tl.store(out + 2, ratio)
            tl.store(out + 3, kl)
        if MODE == 2:
            g = tl.load(g_ptr + row)
        if MODE != 0:
            dst = d_ptr + row * stride_d
            for v0 in range(0, V, BLOCK_V):
                c = v0 + cols
                inb = c < V
                x = tl.load(base + c, mask=inb, other=-float("inf")).to(tl.float32)
                d = -g * tl.exp(x - lse)
                d = tl.where(c == y, d + g, d)
                if PACKED:
                    # Columns [v0, v0 + BLOCK_V) written narrow cover z's columns below v0 + BLOCK_V,
                    # all read by now once every warp's loads of this block are done; later blocks
                    # read columns above. The barrier keeps a fast warp from writing over a column
                    # a slow warp has yet to load.
                    tl.debug_barrier()
                tl.store(dst + c, d.to(d_ptr.dtype.element_ty), mask=inb)


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def _check_out(z, out):
    """out: None (z itself) or an (n, V) float tensor with unit column stride. Returns None
    where out is z or a view of z's own elements."""
    if out is None or out is z:
        return None
    if out.dtype == z.dtype and out.data_ptr() == z.data_ptr() and out.stride() == z.stride() \
            and out.shape == z.shape:
        return None
    if tuple(out.shape) != tuple(z.shape) or not out.is_floating_point() or (out.shape[1] > 1 and out.stride(1) != 1):
        raise ValueError(f"out must be None or a floating (n, V) = {tuple(z.shape)} tensor with unit column stride, "
                         f"got {out.dtype} {tuple(out.shape)} strides {out.stride()}")
    return out


def packed(z: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether `out` of dtype `dtype` is z's own memory read narrower (see `grad_buffer`)."""
    return dtype != z.dtype and torch.finfo(dtype).bits < torch.finfo(z.dtype).bits


def grad_buffer(z: torch.Tensor, dtype: torch.dtype, share: bool | None = None) -> torch.Tensor:
    """Where the row pass over the logits buffer z (n, V) writes its gradient in `dtype` (the
    GEMMs' dtype): z itself when the dtypes agree. For float32 logits and a 2-byte dtype, on the
    Triton path, z's own memory: row i's gradient fills the first half of row i's bytes (an
    (n, V) view with row stride 2 V), so the gradient takes no memory and no pass of its own;
    cuBLAS reads that stride as it is. The torch reference cannot write over what it reads, so
    elsewhere a new (n, V) tensor (allocate it once and slice it per chunk). share: whether to
    share z's memory where the dtypes allow (None: where `rows` runs Triton)."""
    if dtype == z.dtype:
        return z
    share = use_triton(z) if share is None else share
    if share and packed(z, dtype) and z.is_contiguous():
        wide = z.element_size() // torch.empty((), dtype=dtype).element_size()
        return z.view(dtype).view(z.shape[0], z.shape[1] * wide)[:, :z.shape[1]]
    return torch.empty(z.shape, dtype=dtype, device=z.device)


def rows_reference(z, y, *, mode="loss", out=None, lse=None, g=None, old=None, adv=None, scale=None, coef=None,
                   ref=None, tis=None, clip_low=0.2, clip_high=0.2, kl_coef=0.0, tis_cap=None, cispo=False):
    """Torch reference of the row pass; same contract as `rows`, except that `out` must not share
    z's memory unless it is z. Float32 arithmetic (float64 logits compute in float64, for
    references)."""
    _check_mode(mode)
    out = _check_out(z, out)
    if out is not None and out is not z and out.untyped_storage().data_ptr() == z.untyped_storage().data_ptr():
        raise ValueError("out must not share z's memory in the torch reference (grad_buffer gives a separate one)")
    dt = torch.float64 if z.dtype == torch.float64 else torch.float32
    V = z.shape[1]
    valid = (y >= 0) & (y < V)
    yc = y.clamp(0, V - 1)[:, None]
    # In modes that overwrite z, a float32 z is worked on in place (exp, normalise, scale): the
    # reference then holds no chunk-sized temporary beyond a bf16 chunk's float32 copy.
    zf = z if z.dtype == dt else z.to(dt)
    if mode != "given":
        zy = zf.gather(1, yc)[:, 0]
        top = zf.amax(1)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        e = torch.exp(zf - top[:, None]) if mode == "logp" else zf.sub_(top[:, None]).exp_()
        total = e.sum(1)
        lse = top + torch.log(total)
        logp = torch.where(valid, zy - lse, torch.full_like(lse, float("nan")))
        p = None if mode == "logp" else e.div_(total[:, None])
    else:
        logp = None
        p = zf.sub_(lse.to(dt)[:, None]).exp_()
    terms = None
    if mode == "loss":
        loss, dl, active, ratio, kl = token_terms(logp, old, adv.to(dt), scale.to(dt), clip_low=clip_low,
                                                  clip_high=clip_high, kl_coef=kl_coef,
                                                  ref=None if ref is None else ref.to(dt),
                                                  tis=None if tis is None else tis.to(dt), tis_cap=tis_cap,
                                                  cispo=cispo)
        g = coef.to(dt) * dl
        terms = torch.stack([loss, active, ratio, kl], 1)
    if mode != "logp":
        d = p.mul_(-g.to(dt)[:, None])
        d.scatter_add_(1, yc, torch.where(valid, g.to(dt), 0.0)[:, None])
        dst = z if out is None else out
        if d is not dst:
            dst.copy_(d)  # rounded once to dst's dtype, as eager's gradient of its logits is
    return logp, lse, terms


def rows_triton(z, y, *, mode="loss", out=None, lse=None, g=None, old=None, adv=None, scale=None, coef=None,
                ref=None, tis=None, clip_low=0.2, clip_high=0.2, kl_coef=0.0, tis_cap=None, cispo=False,
                block_v=None):
    """The Triton row kernel (CUDA, or the CPU interpreter); same contract as `rows`.
    block_v: columns per step of the row loops, a power of two (None: up to 4,096)."""
    _check_mode(mode)
    out = _check_out(z, out)
    require_triton(z)
    n, V = z.shape
    dev = z.device
    d = z if out is None else out
    alias = d is not z and d.untyped_storage().data_ptr() == z.untyped_storage().data_ptr()
    if alias and not (packed(z, d.dtype) and z.is_contiguous() and d.data_ptr() == z.data_ptr()
                      and d.stride(0) * d.element_size() == z.stride(0) * z.element_size()):
        raise ValueError("out may share z's memory only as grad_buffer's view (row i in the first bytes of z's row i)")
    f32 = dict(dtype=torch.float32, device=dev)
    lse_out = lse if mode == "given" else torch.empty(n, **f32)
    logp = torch.empty(n, **f32) if mode != "given" else None
    terms = torch.empty((n, 4), **f32) if mode == "loss" else None
    dummy = lse_out
    if n > 0:
        with launch_range("kernel:logit_rows"):
            _rows[(n,)](z, z.stride(0), d, d.stride(0), y, V, lse_out, logp if logp is not None else dummy,
                        g if g is not None else dummy, old if old is not None else dummy,
                        adv if adv is not None else dummy, scale if scale is not None else dummy,
                        coef if coef is not None else dummy, ref if ref is not None else dummy,
                        tis if tis is not None else dummy, terms if terms is not None else dummy,
                        float(clip_low), float(clip_high), float(kl_coef),
                        float(tis_cap) if tis_cap is not None else float("inf"),
                        MODE=MODES.index(mode), OWN=old is None, HAS_KL=ref is not None and kl_coef > 0,
                        HAS_TIS=tis is not None, CISPO=cispo, PACKED=alias,
                        BLOCK_V=block_v or min(4096, triton.next_power_of_2(V)))
    return logp, lse_out, terms


def rows(z, y, **kw):
    """The row pass over logits z (n, V) (row stride free, unit column stride) with targets y (n,)
    int64. Returns (logp (n,), lse (n,), terms (n, 4) of [loss, clip-active, ratio, kl] or None),
    float32; in modes "loss" and "given" the gradient d loss / d z is written, rounded once, to
    `out` in its dtype (None: over z, in z's dtype; `grad_buffer` gives the GEMMs' buffer).
    Keyword inputs, (n,) float32: `old` (None: ratio 1), `adv`, `scale` (the row's IS weight),
    `coef` (the aggregation's d loss / d token term), `ref` (KL reference), `tis` (engine
    log-probs for truncated IS), `g` and `lse` for mode "given"; floats clip_low, clip_high,
    kl_coef, tis_cap; `cispo`. Triton on CUDA, the torch reference elsewhere."""
    if use_triton(z):
        return rows_triton(z, y, **kw)
    return rows_reference(z, y, **kw)

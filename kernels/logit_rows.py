"""One pass over rows of logits: log-prob of the target, the policy term, and the gradient in place.

This is the row half of freshper.kernels.fused_linear_policy_loss. A chunk of n active tokens has
its (n, V) logits z written by cuBLAS into a reused buffer; for each row this op computes, in
float32,

    lse = logsumexp_v z_v        logp = z_y - lse
    l, dl = the token's policy term and its derivative d l / d logp (see policy_loss.py)

and then, when a gradient is wanted, overwrites the row with

    d_v = coef * dl * (1[v = y] - exp(z_v - lse))          (d loss / d z_v, in z's dtype)

so that the two GEMMs after it (d @ W for the hidden states, d^T @ h for the head) finish the
gradient without the logits ever existing twice. Numerics follow eager autograd through
bf16 logits: the logits are rounded to z's dtype by the GEMM, log-softmax and its gradient run in
float32, and the gradient is rounded to z's dtype once, as eager's grad of the bf16 logits is.

Modes (`mode`):
    "logp":  read only; logp and lse.
    "loss":  logp, lse, the token terms, and the gradient written in place.
    "given": the gradient written in place from a given per-token g = d loss / d logp and lse
             (the second pass of a loss whose tokens depend on each other, e.g. GSPO's ratio).

Per-token inputs are flat (n,) float32 (the chunk's active tokens in order). Nothing here reads
device data on the host. A target outside [0, V) gives a NaN log-prob (never an out-of-bounds
read); the public fused op can check targets on the host first.
"""
from __future__ import annotations

import torch

from .backend import HAS_TRITON, launch_range, require_triton, use_triton

MODES = ("logp", "loss", "given")

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rows(z_ptr, stride_z, y_ptr, V, lse_ptr, logp_ptr, g_ptr, old_ptr, adv_ptr, scale_ptr, coef_ptr, ref_ptr,
              tis_ptr, terms_ptr, clip_low, clip_high, kl_coef, tis_cap,
              MODE: tl.constexpr, OWN: tl.constexpr, HAS_KL: tl.constexpr, HAS_TIS: tl.constexpr,
              CISPO: tl.constexpr, BLOCK_V: tl.constexpr):
        # MODE 0: logp, 1: loss (+ gradient in place), 2: given g (gradient in place).
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
            a = tl.load(adv_ptr + row)
            if OWN:
                old = lp
            else:
                old = tl.load(old_ptr + row)
            ratio = tl.exp(lp - old)
            if CISPO:
                capped = tl.minimum(ratio, 1.0 + clip_high)
                pg = -capped * a * lp
                dpg = -capped * a
                clip_active = (a > 0) & (ratio > 1.0 + clip_high)
            else:
                clipped = tl.minimum(tl.maximum(ratio, 1.0 - clip_low), 1.0 + clip_high)
                s1 = ratio * a
                s2 = clipped * a
                binds = s2 < s1  # the clipped branch binds when strictly smaller: zero gradient
                pg = -tl.where(binds, s2, s1)
                dpg = tl.where(binds, 0.0, -s1)
                clip_active = ((a > 0) & (ratio > 1.0 + clip_high)) | ((a < 0) & (ratio < 1.0 - clip_low))
            scale = tl.load(scale_ptr + row)
            if HAS_TIS:
                scale = scale * tl.minimum(tl.exp(old - tl.load(tis_ptr + row)), tis_cap)
            loss = scale * pg
            dl = scale * dpg
            kl = 0.0
            if HAS_KL:
                ref = tl.load(ref_ptr + row)
                e = tl.exp(ref - lp)
                kl = e - (ref - lp) - 1.0
                loss += kl_coef * kl
                dl += kl_coef * (1.0 - e)
            g = tl.load(coef_ptr + row) * dl
            out = terms_ptr + row * 4
            tl.store(out + 0, loss)
            tl.store(out + 1, clip_active.to(tl.float32))
            tl.store(out + 2, ratio)
            tl.store(out + 3, kl)
        if MODE == 2:
            g = tl.load(g_ptr + row)
        if MODE != 0:
            for v0 in range(0, V, BLOCK_V):
                c = v0 + cols
                inb = c < V
                x = tl.load(base + c, mask=inb, other=-float("inf")).to(tl.float32)
                d = -g * tl.exp(x - lse)
                d = tl.where(c == y, d + g, d)
                tl.store(base + c, d.to(z_ptr.dtype.element_ty), mask=inb)


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def token_terms(lp, old, adv, scale, *, clip_low, clip_high, kl_coef=0.0, ref=None, tis=None, tis_cap=None,
                cispo=False):
    """Per-token policy terms in torch, (n,) float32 each: (loss l, d l / d logp, clip-active
    as 0/1, ratio, k3 KL). `old` None: the ratio is 1 (the old policy is the current one)."""
    old = lp if old is None else old
    ratio = torch.exp(lp - old)
    if cispo:
        capped = ratio.clamp(max=1.0 + clip_high)
        pg, dpg = -capped * adv * lp, -capped * adv
        active = (adv > 0) & (ratio > 1.0 + clip_high)
    else:
        clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
        s1, s2 = ratio * adv, clipped * adv
        binds = s2 < s1
        pg, dpg = -torch.where(binds, s2, s1), torch.where(binds, torch.zeros_like(s1), -s1)
        active = ((adv > 0) & (ratio > 1.0 + clip_high)) | ((adv < 0) & (ratio < 1.0 - clip_low))
    if tis is not None:  # truncated at tis_cap; None: the plain IS ratio
        c = torch.exp(old - tis)
        scale = scale * (c if tis_cap is None else c.clamp(max=tis_cap))
    loss, dl = scale * pg, scale * dpg
    kl = torch.zeros_like(lp)
    if ref is not None and kl_coef > 0:
        e = torch.exp(ref - lp)
        kl = e - (ref - lp) - 1.0
        loss, dl = loss + kl_coef * kl, dl + kl_coef * (1.0 - e)
    return loss, dl, active.to(lp.dtype), ratio, kl


def rows_reference(z, y, *, mode="loss", lse=None, g=None, old=None, adv=None, scale=None, coef=None, ref=None,
                   tis=None, clip_low=0.2, clip_high=0.2, kl_coef=0.0, tis_cap=None, cispo=False):
    """Torch reference of the row pass; same contract as `rows`. Float32 arithmetic (float64
    logits compute in float64, for references)."""
    _check_mode(mode)
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
        if d is not z:
            z.copy_(d)
    return logp, lse, terms


def rows_triton(z, y, *, mode="loss", lse=None, g=None, old=None, adv=None, scale=None, coef=None, ref=None,
                tis=None, clip_low=0.2, clip_high=0.2, kl_coef=0.0, tis_cap=None, cispo=False, block_v=None):
    """The Triton row kernel (CUDA, or the CPU interpreter); same contract as `rows`.
    block_v: columns per step of the row loops, a power of two (None: up to 4,096)."""
    _check_mode(mode)
    require_triton(z)
    n, V = z.shape
    dev = z.device
    f32 = dict(dtype=torch.float32, device=dev)
    lse_out = lse if mode == "given" else torch.empty(n, **f32)
    logp = torch.empty(n, **f32) if mode != "given" else None
    terms = torch.empty((n, 4), **f32) if mode == "loss" else None
    dummy = lse_out
    if n > 0:
        with launch_range("kernel:logit_rows"):
            _rows[(n,)](z, z.stride(0), y, V, lse_out, logp if logp is not None else dummy,
                        g if g is not None else dummy, old if old is not None else dummy,
                        adv if adv is not None else dummy, scale if scale is not None else dummy,
                        coef if coef is not None else dummy, ref if ref is not None else dummy,
                        tis if tis is not None else dummy, terms if terms is not None else dummy,
                        float(clip_low), float(clip_high), float(kl_coef),
                        float(tis_cap) if tis_cap is not None else float("inf"),
                        MODE=MODES.index(mode), OWN=old is None, HAS_KL=ref is not None and kl_coef > 0,
                        HAS_TIS=tis is not None, CISPO=cispo, BLOCK_V=block_v or min(4096, triton.next_power_of_2(V)))
    return logp, lse_out, terms


def rows(z, y, **kw):
    """The row pass over logits z (n, V) (row stride free, unit column stride) with targets y (n,)
    int64. Returns (logp (n,), lse (n,), terms (n, 4) of [loss, clip-active, ratio, kl] or None),
    float32; in modes "loss" and "given" z is overwritten with d loss / d z in its own dtype.
    Keyword inputs, (n,) float32: `old` (None: ratio 1), `adv`, `scale` (the row's IS weight),
    `coef` (the aggregation's d loss / d token term), `ref` (KL reference), `tis` (engine
    log-probs for truncated IS), `g` and `lse` for mode "given"; floats clip_low, clip_high,
    kl_coef, tis_cap; `cispo`. Triton on CUDA, the torch reference elsewhere."""
    if use_triton(z):
        return rows_triton(z, y, **kw)
    return rows_reference(z, y, **kw)

"""The per-token policy term, written once in torch (the reference) and once in Triton.

For one token with log-prob lp, old log-prob old, advantage A and IS weight w:

    r   = exp(log_ratio)                 log_ratio = lp - old (GSPO: the sequence's mean of it)
    pg  = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)       (PPO's clip)
        = -sg(min(r, 1 + clip_high)) A lp                        (CISPO)
    c   = exp(old - tis), truncated at tis_cap                   (engine / trainer mismatch)
    l   = w c pg + kl_coef k3,   k3 = exp(ref - lp) - (ref - lp) - 1

and dl = d l / d lp along a token-level ratio. `token_terms` is the one torch reference:
policy_loss_reference (autograd through it) and logit_rows' reference (its explicit dl) both
call it, so every Triton kernel is tested against the same formula. `policy_term` is the same
arithmetic as a Triton device function, inlined by both kernels that need it (policy_loss's
per-token pass and logit_rows' row pass): a kernel cannot call torch.
"""
from __future__ import annotations

import torch

from .backend import HAS_TRITON


def token_terms(lp, old, adv, scale, *, clip_low, clip_high, kl_coef=0.0, ref=None, tis=None, tis_cap=None,
                cispo=False, log_ratio=None):
    """Per-token policy terms in torch, each the shape of `lp`: (loss l, d l / d lp, clip-active
    as 0/1, ratio, k3 KL), in lp's dtype.

    lp, old, adv, scale (the IS weight), ref, tis: tensors of one shape (scale may broadcast).
    old None: the old policy is the current one (ratio 1, no gradient through it).
    log_ratio: the ratio's log where it is not lp - old (GSPO's sequence mean); dl is then the
    token-level derivative, and autograd through `loss` is the way to the sequence-level one.
    Differentiable: autograd through `loss` gives dl at token level (CISPO's capped ratio and
    the truncated IS factor are constants, as in the kernels)."""
    old = lp.detach() if old is None else old
    if log_ratio is None:
        log_ratio = lp - old
    ratio = torch.exp(log_ratio)
    if cispo:
        capped = ratio.detach().clamp(max=1.0 + clip_high)
        pg, dpg = -capped * adv * lp, -capped * adv
        active = (adv > 0) & (ratio > 1.0 + clip_high)
    else:
        clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
        s1, s2 = ratio * adv, clipped * adv
        binds = s2 < s1  # the clipped branch binds when strictly smaller: zero gradient
        pg, dpg = -torch.where(binds, s2, s1), torch.where(binds, torch.zeros_like(s1), -s1)
        active = ((adv > 0) & (ratio > 1.0 + clip_high)) | ((adv < 0) & (ratio < 1.0 - clip_low))
    if tis is not None:  # truncated at tis_cap; None: the plain IS ratio
        c = torch.exp(old - tis).detach()
        scale = scale * (c if tis_cap is None else c.clamp(max=tis_cap))
    loss, dl = scale * pg, scale * dpg
    kl = torch.zeros_like(lp)
    if ref is not None and kl_coef > 0:
        e = torch.exp(ref - lp)
        kl = e - (ref - lp) - 1.0
        loss, dl = loss + kl_coef * kl, dl + kl_coef * (1.0 - e)
    return loss, dl, active.to(lp.dtype), ratio, kl


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def policy_term(lp, old, a, scale, ref, tis, clip_low, clip_high, kl_coef, tis_cap,
                    HAS_KL: tl.constexpr, HAS_TIS: tl.constexpr, CISPO: tl.constexpr):
        """`token_terms` in Triton, float32, on scalars or blocks: (loss, dl, clip-active, ratio,
        kl). `ref` and `tis` are read only where HAS_KL and HAS_TIS."""
        ratio = tl.exp(lp - old)
        if CISPO:  # the capped ratio is a constant factor: d/dlogp of -c A logp is -c A
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
        if HAS_TIS:
            scale = scale * tl.minimum(tl.exp(old - tis), tis_cap)
        loss = scale * pg
        dl = scale * dpg
        kl = tl.zeros_like(ratio)
        if HAS_KL:
            e = tl.exp(ref - lp)
            kl = e - (ref - lp) - 1.0
            loss += kl_coef * kl
            dl += kl_coef * (1.0 - e)
        return loss, dl, clip_active, ratio, kl

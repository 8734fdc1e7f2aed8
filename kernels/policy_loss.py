"""IS-weighted token-level clipped policy loss: Triton forward+gradient in one pass, torch reference.

Per unmasked token t of sequence b, with r = exp(logp - old_logp):

    l_t = w_b * c_t * -min(r A_t, clip(r, 1 - clip_low, 1 + clip_high) A_t)  +  kl_coef * k3_t
    c_t = min(exp(old_logp - tis_logp), tis_cap)      truncated IS for engine/trainer mismatch (else 1)
    k3_t = exp(ref - logp) - (ref - logp) - 1         (Schulman's k3 estimator of KL(pi || ref))

w_b is the replay buffer's per-sequence IS weight; it scales the policy-gradient term, not the KL
penalty, which regularises the current policy whatever the sampling distribution. The token
losses are then aggregated over the mask:

    "token-mean":          sum_bt l / number of unmasked tokens
    "seq-mean-token-mean": mean over non-empty sequences of (sum_t l / their token count)
    "seq-mean-token-sum":  mean over non-empty sequences of sum_t l

Fully masked sequences contribute nothing and do not count; an all-masked batch gives 0.

Two variants of the policy term (`loss`, `ratio_level`):

    loss="cispo":            l_t = w_b * c_t * -sg(min(r, 1 + clip_high)) A_t logp_t   (MiniMax-M1's CISPO:
                             the IS weight clipped and detached, every token keeps a gradient)
    ratio_level="sequence":  r is the sequence's exp(mean over its tokens of logp - old_logp) for
                             every token of it (GSPO), so a token's loss depends on its whole row

Sequence-level ratios run in the torch reference on every device: the kernel's one pass treats
tokens independently. The per-token term itself is token_terms.py's, in torch (the reference
here, through autograd) and in Triton (the kernel here and logit_rows' row pass).

Every token's loss depends on its own log-prob alone, so d loss / d logp_t = coef_b * dl_t with
coef_b fixed by the mask. The kernel runs one program per (sequence, block of tokens), computes
dl_t and the partial sums in the same pass, and backward only scales dl by coef_b and the
incoming gradient.
"""
from __future__ import annotations

import math

import torch

from .backend import HAS_TRITON, launch_range, require_triton, use_triton
from .token_terms import token_terms

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
LOSSES = ("clip", "cispo")
RATIO_LEVELS = ("token", "sequence")
_STATS = ("clip_frac", "ratio_mean", "kl_mean", "tokens")

if HAS_TRITON:
    import triton
    import triton.language as tl

    from .token_terms import policy_term

    @triton.jit
    def _policy_loss_fwd(logp_ptr, old_ptr, adv_ptr, mask_ptr, w_ptr, ref_ptr, tis_ptr, dl_ptr, part_ptr,
                         T, stride_lp, stride_old, stride_adv_b, stride_adv_t, stride_mask, stride_ref, stride_tis,
                         stride_dl,
                         clip_low, clip_high, kl_coef, tis_cap,
                         HAS_W: tl.constexpr, HAS_KL: tl.constexpr, HAS_TIS: tl.constexpr, CISPO: tl.constexpr,
                         BLOCK_T: tl.constexpr):
        # Program (b, c) handles tokens [c*BLOCK_T, (c+1)*BLOCK_T) of sequence b and writes its five
        # partial sums; a grid over tokens as well as sequences keeps every SM busy when B is small.
        b = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1)
        n_chunks = tl.num_programs(1)
        w = tl.load(w_ptr + b).to(tl.float32) if HAS_W else 1.0
        t = c * BLOCK_T + tl.arange(0, BLOCK_T)
        inb = t < T
        m = (tl.load(mask_ptr + b * stride_mask + t, mask=inb, other=0) != 0) & inb
        lp = tl.load(logp_ptr + b * stride_lp + t, mask=m, other=0.0).to(tl.float32)
        old = tl.load(old_ptr + b * stride_old + t, mask=m, other=0.0).to(tl.float32)
        a = tl.load(adv_ptr + b * stride_adv_b + t * stride_adv_t, mask=m, other=0.0).to(tl.float32)
        ref = lp
        if HAS_KL:
            ref = tl.load(ref_ptr + b * stride_ref + t, mask=m, other=0.0).to(tl.float32)
        tis = old
        if HAS_TIS:
            tis = tl.load(tis_ptr + b * stride_tis + t, mask=m, other=0.0).to(tl.float32)
        loss, dl, clip_active, ratio, kl = policy_term(lp, old, a, w, ref, tis, clip_low, clip_high, kl_coef,
                                                       tis_cap, HAS_KL, HAS_TIS, CISPO)
        tl.store(dl_ptr + b * stride_dl + t, tl.where(m, dl, 0.0), mask=inb)
        out = part_ptr + (b * n_chunks + c) * 5
        tl.store(out + 0, tl.sum(tl.where(m, loss, 0.0), axis=0))
        tl.store(out + 1, tl.sum(m.to(tl.float32), axis=0))
        tl.store(out + 2, tl.sum(tl.where(m & clip_active, 1.0, 0.0), axis=0))
        tl.store(out + 3, tl.sum(tl.where(m, ratio, 0.0), axis=0))
        tl.store(out + 4, tl.sum(tl.where(m, kl, 0.0), axis=0))


def check_inputs(logp, old_logp, advantages, mask, weights, clip_low, clip_high, agg, ref_logp, kl_coef,
                 tis_logp, tis_cap, loss="clip", ratio_level="token") -> None:
    """Raise ValueError naming the first bad argument."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(f"ratio_level must be one of {RATIO_LEVELS}, got {ratio_level!r}")
    if logp.dim() != 2:
        raise ValueError(f"logp must be (B, T), got shape {tuple(logp.shape)}")
    shape = tuple(logp.shape)
    for name, t in (("old_logp", old_logp), ("mask", mask), ("ref_logp", ref_logp), ("tis_logp", tis_logp)):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} must have the shape of logp {shape}, got {tuple(t.shape)}")
    if tuple(advantages.shape) not in (shape, shape[:1]):
        raise ValueError(f"advantages must be (B, T) or (B,) = {shape} or {shape[:1]}, got {tuple(advantages.shape)}")
    if weights is not None and tuple(weights.shape) != shape[:1]:
        raise ValueError(f"weights must be (B,) = {shape[:1]}, got {tuple(weights.shape)}")
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must lie in [0, 1), got {clip_low}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if not (kl_coef >= 0.0 and math.isfinite(kl_coef)):
        raise ValueError(f"kl_coef must be a finite float >= 0, got {kl_coef}")
    if kl_coef > 0 and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp (B, T)")
    if tis_cap is not None and (tis_logp is None or not tis_cap > 0):
        raise ValueError(f"tis_cap needs tis_logp and must be > 0, got tis_cap={tis_cap}, "
                         f"tis_logp={'given' if tis_logp is not None else None}")


def aggregate(tok: torch.Tensor, mask: torch.Tensor, agg: str) -> torch.Tensor:
    """Token terms (B, T) aggregated over `mask` as the loss is (see the module docstring);
    masked entries are ignored even when inf or nan."""
    m = mask.to(tok.dtype)
    tok = torch.where(m > 0, tok, torch.zeros_like(tok))
    counts = m.sum(-1)
    nseq = (counts > 0).sum().clamp_min(1)
    if agg == "token-mean":
        return tok.sum() / counts.sum().clamp_min(1.0)
    if agg == "seq-mean-token-mean":
        return (tok.sum(-1) / counts.clamp_min(1.0)).sum() / nseq
    return tok.sum(-1).sum() / nseq


def _row_coef(tokens: torch.Tensor, agg: str) -> torch.Tensor:
    """d loss / d (row sum of token losses), (B,) float32, from per-row token counts."""
    nonempty = tokens > 0
    if agg == "token-mean":
        return torch.full_like(tokens, 1.0) / tokens.sum().clamp_min(1.0)
    nseq = nonempty.sum().clamp_min(1).to(tokens.dtype)
    if agg == "seq-mean-token-sum":
        return torch.where(nonempty, 1.0 / nseq, torch.zeros_like(tokens))
    return torch.where(nonempty, 1.0 / (nseq * tokens.clamp_min(1.0)), torch.zeros_like(tokens))


def _stats(rows: torch.Tensor) -> dict:
    tok = rows[:, 1].sum()
    denom = tok.clamp_min(1.0)
    return {"clip_frac": rows[:, 2].sum() / denom, "ratio_mean": rows[:, 3].sum() / denom,
            "kl_mean": rows[:, 4].sum() / denom, "tokens": tok}


def loss_and_grad_triton(logp, old_logp, advantages, mask, weights=None, *, clip_low=0.2, clip_high=0.2,
                         agg="token-mean", ref_logp=None, kl_coef=0.0, tis_logp=None, tis_cap=None, loss="clip",
                         ratio_level="token"):
    """(loss, d loss / d logp (B, T) float32, stats) from the Triton kernel; no autograd."""
    check_inputs(logp, old_logp, advantages, mask, weights, clip_low, clip_high, agg, ref_logp, kl_coef,
                 tis_logp, tis_cap, loss, ratio_level)
    if ratio_level != "token":
        raise ValueError("the kernel computes token-level ratios; ratio_level='sequence' runs in the reference")
    require_triton(logp)
    B, T = logp.shape
    dev = logp.device

    def rowmajor(t):
        return t if t.stride(-1) == 1 else t.contiguous()

    logp, old_logp, mask = rowmajor(logp), rowmajor(old_logp), rowmajor(mask)
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)
    adv = advantages.contiguous()
    adv_strides = (adv.stride(0), 1) if adv.dim() == 2 else (1, 0)  # (B,): one advantage per sequence
    ref = rowmajor(ref_logp) if ref_logp is not None else logp
    tis = rowmajor(tis_logp) if tis_logp is not None else logp
    w = weights.contiguous() if weights is not None else logp
    dl = torch.empty((B, T), dtype=torch.float32, device=dev)
    block_t = min(1024, triton.next_power_of_2(max(T, 16)))
    n_chunks = triton.cdiv(T, block_t) if T > 0 else 0
    parts = torch.empty((B, n_chunks, 5), dtype=torch.float32, device=dev)
    if B > 0 and T > 0:
        with launch_range("kernel:policy_loss"):
            _policy_loss_fwd[(B, n_chunks)](
                logp, old_logp, adv, mask, w, ref, tis, dl, parts, T,
                logp.stride(0), old_logp.stride(0), *adv_strides, mask.stride(0),
                ref.stride(0), tis.stride(0), dl.stride(0),
                float(clip_low), float(clip_high), float(kl_coef),
                float(tis_cap) if tis_cap is not None else float("inf"),
                HAS_W=weights is not None, HAS_KL=ref_logp is not None and kl_coef > 0, HAS_TIS=tis_logp is not None,
                CISPO=loss == "cispo", BLOCK_T=block_t)
    rows = parts.sum(1)  # (B, 5): loss, tokens, clipped, ratio and kl sums per sequence
    coef = _row_coef(rows[:, 1], agg)
    total = (rows[:, 0] * coef).sum()
    return total, dl * coef[:, None], _stats(rows)


def policy_loss_reference(logp, old_logp, advantages, mask, weights=None, *, clip_low=0.2, clip_high=0.2,
                          agg="token-mean", ref_logp=None, kl_coef=0.0, tis_logp=None, tis_cap=None,
                          loss="clip", ratio_level="token", return_stats=False):
    """The loss in plain torch ops, differentiable by autograd; computes in logp's dtype
    (pass float64 for a reference)."""
    check_inputs(logp, old_logp, advantages, mask, weights, clip_low, clip_high, agg, ref_logp, kl_coef,
                 tis_logp, tis_cap, loss, ratio_level)
    dt = logp.dtype if logp.dtype == torch.float64 else torch.float32
    lp = logp.to(dt)
    old = old_logp.to(dt)
    m = mask.to(dt)
    a = advantages.to(dt)
    a = a[:, None].expand_as(lp) if a.dim() == 1 else a
    log_ratio = None
    if ratio_level == "sequence":  # GSPO: the row's mean log-ratio, for each of its tokens
        live = m > 0
        seq = torch.where(live, lp - old, torch.zeros_like(lp)).sum(-1) / m.sum(-1).clamp_min(1.0)
        log_ratio = seq[:, None].expand_as(lp)
    scale = torch.ones_like(lp) if weights is None else weights.to(dt)[:, None].expand_as(lp)
    tok, _, active, ratio, kl = token_terms(lp, old, a, scale, clip_low=clip_low, clip_high=clip_high,
                                            kl_coef=kl_coef, ref=None if ref_logp is None else ref_logp.to(dt),
                                            tis=None if tis_logp is None else tis_logp.to(dt), tis_cap=tis_cap,
                                            cispo=loss == "cispo", log_ratio=log_ratio)
    counts = m.sum(-1)
    total = aggregate(tok, m, agg)
    if not return_stats:
        return total
    with torch.no_grad():
        live = m > 0
        denom = counts.sum().clamp_min(1.0)
        stats = {"clip_frac": torch.where(live, active, 0.0).sum() / denom,
                 "ratio_mean": torch.where(live, ratio, 0.0).sum() / denom,
                 "kl_mean": torch.where(live, kl, 0.0).sum() / denom, "tokens": counts.sum()}
    return total, stats


def loss_and_grad_reference(logp, old_logp, advantages, mask, weights=None, **kw):
    """(loss, d loss / d logp, stats) by autograd on the reference; no graph is kept."""
    with torch.enable_grad():
        lp = logp.detach().requires_grad_(True)
        loss, stats = policy_loss_reference(lp, old_logp, advantages, mask, weights, return_stats=True, **kw)
        (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, stats


class _PolicyLoss(torch.autograd.Function):
    """Outputs the loss and, as non-differentiable outputs, the stats of the same kernel pass."""

    @staticmethod
    def forward(ctx, logp, old_logp, advantages, mask, weights, kw):
        loss, grad, stats = loss_and_grad_triton(logp, old_logp, advantages, mask, weights, **kw)
        ctx.save_for_backward(grad)
        ctx.logp_dtype = logp.dtype
        outs = [stats[k] for k in _STATS]
        ctx.mark_non_differentiable(*outs)
        return (loss, *outs)

    @staticmethod
    def backward(ctx, grad_out, *unused):
        (grad,) = ctx.saved_tensors
        return (grad * grad_out).to(ctx.logp_dtype), None, None, None, None, None


def policy_loss(logp, old_logp, advantages, mask, weights=None, *, clip_low=0.2, clip_high=0.2,
                agg="token-mean", ref_logp=None, kl_coef=0.0, tis_logp=None, tis_cap=None, loss="clip",
                ratio_level="token", return_stats=False):
    """IS-weighted clipped token-level policy loss, a scalar differentiable w.r.t. `logp`.

    logp, old_logp, mask, ref_logp, tis_logp: (B, T); advantages: (B, T) or (B,); weights: (B,)
    per-sequence PER weights. `loss` "clip" (PPO's) or "cispo"; `ratio_level` "token" or
    "sequence" (GSPO). Triton on CUDA for token-level ratios, the torch reference otherwise. With
    `return_stats`, also a dict of detached scalars: clip_frac and ratio_mean over unmasked
    tokens, kl_mean (0 without KL), tokens.
    """
    kw = dict(clip_low=clip_low, clip_high=clip_high, agg=agg, ref_logp=ref_logp, kl_coef=kl_coef,
              tis_logp=tis_logp, tis_cap=tis_cap, loss=loss, ratio_level=ratio_level)
    if use_triton(logp) and ratio_level == "token":
        return policy_loss_triton(logp, old_logp, advantages, mask, weights, return_stats=return_stats, **kw)
    return policy_loss_reference(logp, old_logp, advantages, mask, weights, return_stats=return_stats, **kw)


def policy_loss_triton(logp, old_logp, advantages, mask, weights=None, *, return_stats=False, **kw):
    """`policy_loss` through the Triton kernel (CUDA, or the CPU interpreter)."""
    loss, *stats = _PolicyLoss.apply(logp, old_logp.detach(), advantages.detach(), mask,
                                     weights.detach() if weights is not None else None, kw)
    return (loss, dict(zip(_STATS, stats))) if return_stats else loss


def loss_and_grad(logp, old_logp, advantages, mask, weights=None, **kw):
    """(loss, d loss / d logp, stats): the kernel on CUDA (token-level ratios), autograd on the
    reference otherwise."""
    if use_triton(logp) and kw.get("ratio_level", "token") == "token":
        return loss_and_grad_triton(logp, old_logp, advantages, mask, weights, **kw)
    return loss_and_grad_reference(logp, old_logp, advantages, mask, weights, **kw)

"""The policy loss fused with the LM head: log-probs of the taken tokens without the logits.

At V = 151,936 and 16k tokens the (tokens, V) logits are 10 GB in float32, several times over
once log_softmax and its gradient exist. Here the head is applied to tiles of `chunk_size`
tokens by `vocab_chunk` vocabulary rows; an online logsumexp over the vocabulary chunks gives
log pi(y_t) = z_ty - logsumexp_v(z_tv), z = h W^T, for each unmasked token (masked ones are not
computed at all). Backward recomputes each tile from the saved logsumexp:

    d loss / d z_tv = g_t (1[v = y_t] - p_tv)       g_t = d loss / d logp_t
    d loss / d h = (d loss / d z) W                  d loss / d W = (d loss / d z)^T h

Numerics follow eager bf16 autograd (bf16 logits -> float32 log_softmax): each tile's product
runs in the inputs' dtype (tensor cores), is upcast once, and both the target logit and the
logsumexp come from that same upcast tile, so log pi <= 0 always. The factor (1[v = y] - p) is
formed in float32 inside the tile before the cast for the two backward matmuls: for a confident
token (p ~ 1) a separate one-hot term would cancel against a bf16-rounded p and leave noise.

Memory: the vocabulary loop is outside the token loop in backward, so each vocabulary chunk's
weight gradient is finished in a (vocab_chunk, H) float32 accumulator and written once in the
weight's dtype; no full-size float32 copy of the weight gradient exists, and no index_add_ (whose
CUDA atomics are nondeterministic) is needed. Peak extra memory is the gradients themselves plus
one float32 tile. A frozen head (or hidden states) skips its gradient entirely.
The policy-loss part is freshper.kernels.policy_loss (its Triton kernel on CUDA).
"""
from __future__ import annotations

import torch

from .policy_loss import _STATS, loss_and_grad

_MM_OUT_DTYPE: bool | None = None  # whether torch.mm(..., out_dtype=float32) runs on this CUDA build


def _vocab_chunks(v: int, vocab_chunk: int):
    return [(s, min(s + vocab_chunk, v)) for s in range(0, v, vocab_chunk)]


def default_chunks(n_tokens: int, vocab: int, hidden: int, dtype: torch.dtype) -> tuple[int, int]:
    """(chunk_size, vocab_chunk): 1,024 tokens, and the largest power-of-two vocabulary chunk
    whose float32 tile stays within 1/8 of the weight gradient (at least 1,024 rows), so the
    tile never dominates peak memory and the GPU still gets large matmuls (few launches)."""
    chunk = max(1, min(1024, n_tokens))
    budget = vocab * hidden * torch.finfo(dtype).bits // 8 // 8  # bytes: 1/8 of the weight gradient
    rows = max(1024, budget // (4 * chunk))
    vc = 1 << (rows.bit_length() - 1)
    return chunk, min(vc, vocab)


def _mm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b as float32 from operands in the weight's dtype. On CUDA a bf16/fp16 product
    accumulates straight into float32 output (no rounding of each partial to bf16); elsewhere
    the same arithmetic is emulated by upcasting the operands, which are exact in float32."""
    global _MM_OUT_DTYPE
    if a.dtype in (torch.float32, torch.float64):
        return a @ b
    if a.is_cuda and _MM_OUT_DTYPE is not False:
        try:
            out = torch.mm(a, b, out_dtype=torch.float32)
            _MM_OUT_DTYPE = True
            return out
        except (RuntimeError, TypeError):
            _MM_OUT_DTYPE = False  # a torch without mm(out_dtype=): upcast instead
    return a.float() @ b.float()


def _tile_logits(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(n, vc) float32 logits of one tile, computed in the inputs' dtype as eager does."""
    return (h @ w.T).float()


@torch.no_grad()
def _excluded(exclude: torch.Tensor | None, v0: int, v1: int):
    """Columns of the tile [v0, v1) that `exclude` removes from the softmax (None: none)."""
    if exclude is None:
        return None
    cols = exclude[(exclude >= v0) & (exclude < v1)] - v0
    return cols if cols.numel() else None


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                   chunk_size: int | None = None, vocab_chunk: int | None = None,
                   exclude: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(target) and logsumexp of the logits, both (N,) float32, for hidden (N, H),
    weight (V, H), targets (N,) int64, never holding more than one (chunk_size, vocab_chunk) tile
    of logits. log pi is <= 0 exactly: the target logit is read from the same tile as the lse.
    `exclude` (int64 vocabulary ids): tokens the sampler never draws (an engine's suppressed
    tokens), taken out of the softmax as -inf logits, so pi is the distribution sampled from."""
    if exclude is not None:
        exclude = exclude.to(hidden.device)
    n = hidden.shape[0]
    dc, dv = default_chunks(n, weight.shape[0], weight.shape[1], weight.dtype)
    chunk_size, vocab_chunk = chunk_size or dc, vocab_chunk or dv
    logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
    lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
    chunks = _vocab_chunks(weight.shape[0], vocab_chunk)
    for s in range(0, n, chunk_size):
        h, y = hidden[s:s + chunk_size], targets[s:s + chunk_size]
        run_max = torch.full((h.shape[0],), -float("inf"), dtype=torch.float32, device=h.device)
        run_sum = torch.zeros(h.shape[0], dtype=torch.float32, device=h.device)
        target_logit = torch.zeros(h.shape[0], dtype=torch.float32, device=h.device)
        for v0, v1 in chunks:
            z = _tile_logits(h, weight[v0:v1])
            cols = _excluded(exclude, v0, v1)
            if cols is not None:
                z[:, cols] = -float("inf")
            inside = (y >= v0) & (y < v1)
            picked = z.gather(1, (y - v0).clamp(0, v1 - v0 - 1)[:, None])[:, 0]
            target_logit = torch.where(inside, picked, target_logit)
            new_max = torch.maximum(run_max, z.max(dim=1).values)
            run_sum = run_sum * torch.exp(run_max - new_max) + z.sub_(new_max[:, None]).exp_().sum(dim=1)
            run_max = new_max
        # run_sum >= 1 (the maximum's own term), so lse >= run_max >= target_logit.
        lse[s:s + chunk_size] = run_max + torch.log(run_sum)
        logp[s:s + chunk_size] = target_logit - lse[s:s + chunk_size]
    return logp, lse


def _dlogits(h, w, y, lse, g, v0, cols=None) -> torch.Tensor:
    """d loss / d z for one tile, (n, vc) float32: g (1[v = y] - p), formed in float32; p = 0 at
    the excluded columns `cols`."""
    d = _tile_logits(h, w).sub_(lse[:, None]).exp_().mul_(-g[:, None])  # -g p
    if cols is not None:
        d[:, cols] = 0.0
    rows = ((y >= v0) & (y < v0 + w.shape[0])).nonzero().squeeze(1)
    d[rows, y[rows] - v0] += g[rows]  # at most one target per row: no duplicate writes
    return d


class _FusedLinearPolicyLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, old_logp, advantages, mask, weights, kw, chunk_size, vocab_chunk,
                exclude):
        B, T, H = hidden.shape
        active = mask.reshape(-1).nonzero().squeeze(1)
        h = hidden.reshape(-1, H).index_select(0, active)
        y = targets.reshape(-1).index_select(0, active)
        dc, dv = default_chunks(active.numel(), weight.shape[0], H, weight.dtype)
        chunk_size, vocab_chunk = chunk_size or dc, vocab_chunk or dv
        logp_a, lse = token_logprobs(h, weight, y, chunk_size=chunk_size, vocab_chunk=vocab_chunk, exclude=exclude)
        del h
        logp = torch.zeros(B * T, dtype=torch.float32, device=hidden.device)
        logp[active] = logp_a
        if old_logp is None:  # the old policy is these weights: the ratio is exactly 1
            old_logp = logp.view(B, T)
        loss, dlogp, stats = loss_and_grad(logp.view(B, T), old_logp, advantages, mask, weights, **kw)
        ctx.save_for_backward(hidden, weight, targets, active, lse, dlogp)
        ctx.chunks = (chunk_size, vocab_chunk)
        ctx.exclude = exclude
        outs = [stats[k] for k in _STATS] + [logp.view(B, T)]
        ctx.mark_non_differentiable(*outs)
        return (loss.float(), *outs)

    @staticmethod
    def backward(ctx, grad_out, *unused):
        hidden, weight, targets, active, lse, dlogp = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        chunk_size, vocab_chunk = ctx.chunks
        B, T, H = hidden.shape
        dt = weight.dtype
        g = dlogp.reshape(-1).index_select(0, active).float() * grad_out.float()
        h_all = hidden.reshape(-1, H).index_select(0, active)
        y_all = targets.reshape(-1).index_select(0, active)
        n = active.numel()
        grad_h = torch.zeros(n, H, dtype=torch.float32, device=hidden.device) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        for v0, v1 in _vocab_chunks(weight.shape[0], vocab_chunk):
            w = weight[v0:v1]
            # float32 accumulator for this chunk only; float32 weights accumulate in place.
            gw = (grad_w[v0:v1] if dt == torch.float32 else torch.zeros(v1 - v0, H, dtype=torch.float32,
                                                                          device=weight.device)) if need_w else None
            for s in range(0, n, chunk_size):
                e = min(s + chunk_size, n)
                h = h_all[s:e]
                d = _dlogits(h, w, y_all[s:e], lse[s:e], g[s:e], v0, _excluded(ctx.exclude, v0, v1))
                dc = d if dt == torch.float32 else d.to(dt)
                del d
                if need_h:
                    grad_h[s:e] += _mm_f32(dc, w)
                if need_w:
                    gw += _mm_f32(dc.T, h)
            if need_w and dt != torch.float32:
                grad_w[v0:v1] = gw
        grad_hidden = None
        if need_h:
            grad_hidden = torch.zeros(B * T, H, dtype=hidden.dtype, device=hidden.device)
            grad_hidden[active] = grad_h.to(hidden.dtype)
            grad_hidden = grad_hidden.view(B, T, H)
        return (grad_hidden, grad_w, None, None, None, None, None, None, None, None, None)


def fused_linear_policy_loss(hidden, lm_weight, targets, old_logp, advantages, mask, weights=None, *,
                             clip_low=0.2, clip_high=0.2, agg="token-mean", ref_logp=None, kl_coef=0.0,
                             tis_logp=None, tis_cap=None, loss="clip", ratio_level="token", chunk_size=None,
                             vocab_chunk=None, return_stats=False, exclude=None):
    """`policy_loss` on log pi(targets) = log_softmax(hidden @ lm_weight.T)[targets], computed in
    tiles: hidden (B, T, H), lm_weight (V, H) of hidden's dtype, targets (B, T) int64; the rest as
    in `policy_loss` (`loss`, `ratio_level` too: the log-probs of whole rows are computed before the
    loss). Differentiable w.r.t. hidden and lm_weight (each only if it requires grad).
    chunk_size / vocab_chunk: tile shape in tokens x vocabulary rows; None picks `default_chunks`.
    With `return_stats`, also a dict of the loss's detached statistics (as `policy_loss`) plus
    "logp": the (B, T) float32 log-probs the loss used (0 at masked tokens), at no extra cost.
    `exclude`: vocabulary ids out of the softmax, as in `token_logprobs`; no target may be one.
    `old_logp` None: the old policy is the current one (the first pass over freshly generated
    rows), its log-probs those this call computes, detached; stats["logp"] returns them."""
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be (B, T, H), got shape {tuple(hidden.shape)}")
    if lm_weight.dim() != 2 or lm_weight.shape[1] != hidden.shape[2]:
        raise ValueError(f"lm_weight must be (V, H) with H = {hidden.shape[2]}, got {tuple(lm_weight.shape)}")
    if lm_weight.dtype != hidden.dtype:
        raise ValueError(f"lm_weight and hidden must share a dtype, got {lm_weight.dtype} and {hidden.dtype}")
    if tuple(targets.shape) != tuple(hidden.shape[:2]) or targets.dtype != torch.int64:
        raise ValueError(f"targets must be int64 of shape {tuple(hidden.shape[:2])}, got {targets.dtype} "
                         f"{tuple(targets.shape)}")
    if tuple(mask.shape) != tuple(hidden.shape[:2]):
        raise ValueError(f"mask must have shape {tuple(hidden.shape[:2])}, got {tuple(mask.shape)}")
    for name, c in (("chunk_size", chunk_size), ("vocab_chunk", vocab_chunk)):
        if c is not None and not (isinstance(c, int) and c > 0):
            raise ValueError(f"{name} must be a positive int or None, got {c!r}")
    if exclude is not None:
        exclude = torch.as_tensor(exclude, dtype=torch.int64, device=hidden.device)
    sel = mask.reshape(-1) != 0
    if sel.any():
        y = targets.reshape(-1)[sel]
        if int(y.min()) < 0 or int(y.max()) >= lm_weight.shape[0]:
            raise ValueError(f"targets of unmasked tokens must lie in [0, {lm_weight.shape[0]})")
        if exclude is not None and bool(torch.isin(y, exclude).any()):
            raise ValueError("targets of unmasked tokens must not be in exclude (their probability is 0)")
    kw = dict(clip_low=clip_low, clip_high=clip_high, agg=agg, ref_logp=ref_logp, kl_coef=kl_coef,
              tis_logp=tis_logp, tis_cap=tis_cap, loss=loss, ratio_level=ratio_level)
    out, *stats = _FusedLinearPolicyLoss.apply(
        hidden, lm_weight, targets, None if old_logp is None else old_logp.detach(), advantages.detach(), mask,
        weights.detach() if weights is not None else None, kw, chunk_size, vocab_chunk, exclude)
    return (out, dict(zip((*_STATS, "logp"), stats))) if return_stats else out

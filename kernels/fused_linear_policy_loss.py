"""The policy loss fused with the LM head: log-probs of the taken tokens without the logits.

At V = 151,936 and 16k tokens the (tokens, V) logits are 10 GB in float32, several times over
once log_softmax and its gradient exist. Here the head is applied to chunks of `chunk_size`
tokens and `vocab_chunk` vocabulary rows; an online logsumexp over the vocabulary chunks gives
log pi(y_t) = h_t . W_y - logsumexp_v(h_t . W_v) for each token. Only unmasked tokens are
computed at all. Backward recomputes each chunk's logits from the saved logsumexp:

    d logp_t / d h_t = W_y - sum_v p_tv W_v        d logp_t / d W_v = (1[v = y_t] - p_tv) h_t

so peak extra memory is one (chunk_size, vocab_chunk) tile plus per-token vectors, whatever V and
the token count. The policy-loss part is freshper.kernels.policy_loss (its Triton kernel on CUDA).
Matmuls run in the inputs' dtype (bf16 on a GPU, tensor cores); softmax math and the weight
gradient accumulate in float32.
"""
from __future__ import annotations

import torch

from .policy_loss import _STATS, loss_and_grad


def _vocab_chunks(v: int, vocab_chunk: int):
    return [(s, min(s + vocab_chunk, v)) for s in range(0, v, vocab_chunk)]


@torch.no_grad()
def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, chunk_size: int = 1024,
                   vocab_chunk: int = 16384) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(target) and logsumexp of the logits, both (N,) float32, for hidden (N, H),
    weight (V, H), targets (N,), never holding more than (chunk_size, vocab_chunk) logits."""
    n = hidden.shape[0]
    logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
    lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
    chunks = _vocab_chunks(weight.shape[0], vocab_chunk)
    for s in range(0, n, chunk_size):
        h = hidden[s:s + chunk_size]
        y = targets[s:s + chunk_size]
        run_max = torch.full((h.shape[0],), -float("inf"), dtype=torch.float32, device=h.device)
        run_sum = torch.zeros(h.shape[0], dtype=torch.float32, device=h.device)
        for v0, v1 in chunks:
            logits = (h @ weight[v0:v1].T).float()
            new_max = torch.maximum(run_max, logits.max(dim=1).values)
            run_sum = run_sum * torch.exp(run_max - new_max) + torch.exp(logits - new_max[:, None]).sum(dim=1)
            run_max = new_max
        lse[s:s + chunk_size] = run_max + torch.log(run_sum)
        target_logit = (h.float() * weight[y].float()).sum(dim=1)
        logp[s:s + chunk_size] = target_logit - lse[s:s + chunk_size]
    return logp, lse


class _FusedLinearPolicyLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, old_logp, advantages, mask, weights, kw, chunk_size, vocab_chunk):
        B, T, H = hidden.shape
        active = mask.reshape(-1).nonzero().squeeze(1)
        h = hidden.reshape(-1, H).index_select(0, active)
        y = targets.reshape(-1).index_select(0, active)
        logp_a, lse = token_logprobs(h, weight, y, chunk_size=chunk_size, vocab_chunk=vocab_chunk)
        logp = torch.zeros(B * T, dtype=torch.float32, device=hidden.device)
        logp[active] = logp_a
        loss, dlogp, stats = loss_and_grad(logp.view(B, T), old_logp, advantages, mask, weights, **kw)
        ctx.save_for_backward(hidden, weight, targets, active, lse, dlogp)
        ctx.chunks = (chunk_size, vocab_chunk)
        outs = [stats[k] for k in _STATS]
        ctx.mark_non_differentiable(*outs)
        return (loss.float(), *outs)

    @staticmethod
    def backward(ctx, grad_out, *unused):
        hidden, weight, targets, active, lse, dlogp = ctx.saved_tensors
        chunk_size, vocab_chunk = ctx.chunks
        B, T, H = hidden.shape
        g = dlogp.reshape(-1).index_select(0, active).float() * grad_out.float()
        h_all = hidden.reshape(-1, H).index_select(0, active)
        y_all = targets.reshape(-1).index_select(0, active)
        grad_h = torch.zeros(active.numel(), H, dtype=torch.float32, device=hidden.device)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        chunks = _vocab_chunks(weight.shape[0], vocab_chunk)
        for s in range(0, active.numel(), chunk_size):
            h, y, gc, lc = (h_all[s:s + chunk_size], y_all[s:s + chunk_size], g[s:s + chunk_size],
                            lse[s:s + chunk_size])
            gh = gc[:, None] * weight[y].float()
            for v0, v1 in chunks:
                w = weight[v0:v1]
                gp = gc[:, None] * torch.exp((h @ w.T).float() - lc[:, None])  # g_t p_tv, (chunk, vocab chunk)
                gh -= (gp.to(w.dtype) @ w).float()
                grad_w[v0:v1] -= (gp.T.to(h.dtype) @ h).float()
            grad_w.index_add_(0, y, gc[:, None] * h.float())
            grad_h[s:s + chunk_size] = gh
        grad_hidden = torch.zeros(B * T, H, dtype=hidden.dtype, device=hidden.device)
        grad_hidden[active] = grad_h.to(hidden.dtype)
        return (grad_hidden.view(B, T, H), grad_w.to(weight.dtype), None, None, None, None, None, None, None, None)


def fused_linear_policy_loss(hidden, lm_weight, targets, old_logp, advantages, mask, weights=None, *,
                             clip_low=0.2, clip_high=0.2, agg="token-mean", ref_logp=None, kl_coef=0.0,
                             tis_logp=None, tis_cap=None, chunk_size=1024, vocab_chunk=16384, return_stats=False):
    """`policy_loss` on log pi(targets) = log_softmax(hidden @ lm_weight.T)[targets], computed in
    chunks: hidden (B, T, H), lm_weight (V, H), targets (B, T) int64; the rest as in
    `policy_loss`. Differentiable w.r.t. hidden and lm_weight."""
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be (B, T, H), got shape {tuple(hidden.shape)}")
    if lm_weight.dim() != 2 or lm_weight.shape[1] != hidden.shape[2]:
        raise ValueError(f"lm_weight must be (V, H) with H = {hidden.shape[2]}, got {tuple(lm_weight.shape)}")
    if tuple(targets.shape) != tuple(hidden.shape[:2]) or targets.dtype != torch.int64:
        raise ValueError(f"targets must be int64 of shape {tuple(hidden.shape[:2])}, got {targets.dtype} "
                         f"{tuple(targets.shape)}")
    if tuple(mask.shape) != tuple(hidden.shape[:2]):
        raise ValueError(f"mask must have shape {tuple(hidden.shape[:2])}, got {tuple(mask.shape)}")
    if chunk_size <= 0 or vocab_chunk <= 0:
        raise ValueError(f"chunk_size and vocab_chunk must be > 0, got {chunk_size}, {vocab_chunk}")
    sel = mask.reshape(-1) != 0
    if sel.any():
        y = targets.reshape(-1)[sel]
        if int(y.min()) < 0 or int(y.max()) >= lm_weight.shape[0]:
            raise ValueError(f"targets of unmasked tokens must lie in [0, {lm_weight.shape[0]})")
    kw = dict(clip_low=clip_low, clip_high=clip_high, agg=agg, ref_logp=ref_logp, kl_coef=kl_coef,
              tis_logp=tis_logp, tis_cap=tis_cap)
    loss, *stats = _FusedLinearPolicyLoss.apply(
        hidden, lm_weight, targets, old_logp.detach(), advantages.detach(), mask,
        weights.detach() if weights is not None else None, kw, chunk_size, vocab_chunk)
    return (loss, dict(zip(_STATS, stats))) if return_stats else loss

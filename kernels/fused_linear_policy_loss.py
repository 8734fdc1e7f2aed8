"""The policy loss fused with the LM head: three head GEMMs, one chunk of logits, no host sync.

At V = 151,936 and 16k tokens the (tokens, V) logits are 10 GB in float32, several times over
once log_softmax and its gradient exist. Here the active (unmasked) tokens are taken in chunks;
for each chunk

    1. cuBLAS writes the chunk's logits z = h W^T into one reused buffer (GEMM 1);
    2. one row kernel (freshper.kernels.logit_rows) computes in float32 the logsumexp, the
       target's log-prob, the token's policy term and its derivative, and overwrites the row with
       d loss / d z = coef * dl * (1[v = y] - p);
    3. grad_hidden = d W (GEMM 2) and grad_weight += d^T h (GEMM 3), in the forward.

The backward only scales the stored gradients by the incoming one. That is three GEMMs of
2 n H V FLOPs each against eager autograd's three, where recomputing the logits in the backward
would take a fourth. It works because every token's loss depends on its own log-prob alone, with
a row coefficient fixed by the mask (policy_loss.py); GSPO's sequence-level ratio couples a
row's tokens, so it takes two passes (log-probs, then the loss's gradient, then the chunks again:
four GEMMs).

Numerics follow eager bf16 autograd: logits rounded to the inputs' dtype by the GEMM,
log-softmax and its gradient in float32, the gradient rounded once to the inputs' dtype before
the two backward GEMMs. With `logits_dtype=torch.float32` GEMM 1 keeps its float32 accumulator
instead of rounding the logits (cuBLAS's out_dtype: the same FLOPs, twice the buffer's bytes; on
the CPU an exact upcast and a float32 GEMM), and the row kernel's store rounds the gradient to
the operands' dtype itself: on CUDA into the float32 buffer's own memory
(logit_rows.grad_buffer), so there is no cast pass and nothing is allocated per chunk. Where the
installed torch's mm or addmm cannot write float32 (probed, not read from its version), GEMMs 1
and 3 take another path (`logits32_path`, LOGITS32_PATHS), which callers can name. Chunks
are sized in tokens (`default_chunk`), the same for both logits dtypes. A bf16 logit is off by
up to half a bf16 spacing, 0.06 nats at |z| = 16, and that rounding doubles the log-prob gap
between an engine's decode and the trainer's forward at one set of weights
(results/benchmarks/mismatch-sources-cpu-2026-12-06/). grad_weight accumulates over chunks in
the weight's dtype (one rounding per chunk) or, with `accum_dtype=torch.float32`, and by default
with float32 logits where GEMM 3 has cuBLAS's out_dtype (`default_accum`), in a float32 buffer
rounded once at the end (eager's single rounding, at 4 V H bytes more). `grad_scale` serves
fp16's loss scaling (fused_linear_policy_loss).

Host synchronisation: none when the caller passes `n_active` (the trainer knows it from the one
sync a micro-batch already has) and `check=False`. Otherwise one read of the mask's sum and, with
`check`, the targets' range: a host-side check names bad targets. Without it a target outside
[0, V) gives a NaN log-prob and loss.
"""
from __future__ import annotations

import torch

from .logit_rows import grad_buffer, rows
from .policy_loss import _STATS, _row_coef, check_inputs, loss_and_grad
from .token_terms import token_terms

_OUT_DTYPE: dict[tuple, bool] = {}  # (op, device type, operand dtype) -> whether out_dtype=float32 runs, unrounded
# Chunks are sized in tokens, whatever the logits' dtype: (at least this many tokens, and more
# while the chunk's logits number at most this many). On a GPU the chunk's rows are GEMM 2's
# output tiles and the times W and the weight gradient are streamed, so 1,024 tokens at
# V = 151,936 (622 MB of float32 logits) and more at smaller vocabularies; the CPU reference
# makes float32 temporaries of a chunk, and its GEMMs are efficient at a few dozen rows already.
CHUNK_TOKENS = {"cuda": (1024, 2**27), "cpu": (64, 2**23)}


def default_chunk(n_tokens: int, vocab: int, device: str | torch.device = "cuda") -> int:
    """Tokens per chunk on `device`'s type (CHUNK_TOKENS: the floor, or as many as keep the
    chunk's logits within its element count), a multiple of 64 above 64, at most `n_tokens`,
    at least 1. The same for bf16 and float32 logits: float32 costs the buffer's bytes, not
    the chunk's size."""
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ValueError(f"vocab must be a positive int, got {vocab!r}")
    floor, elements = CHUNK_TOKENS.get(torch.device(device).type, CHUNK_TOKENS["cuda"])
    rows_ = max(floor, elements // vocab)
    if rows_ > 64:
        rows_ -= rows_ % 64
    return max(1, min(rows_, n_tokens))


def has_out_dtype(op: str, device: str | torch.device, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether `torch.<op>` ("mm" or "addmm") with operands in `dtype`, out_dtype=torch.float32 and a
    float32 `out=` runs on `device`'s type and keeps the float32 sum (cuBLAS does; torch's CPU build
    has neither op). Probed once per (op, device type, dtype) on 2x2 tensors whose float32 result,
    1 + 2**-12, rounds to 1 in bf16 and fp16, so a call that runs but rounds reads as unsupported,
    as one that raises does. Each op on its own, since a build may have one and not the other
    (torch 2.8-2.9: mm but not addmm into a float32 accumulator), and never by catching the real
    call's error, which would read an out-of-memory error as "unsupported" and fall back, for
    good, to a path needing more memory. On the meta device (no values) running is enough."""
    if op not in ("mm", "addmm"):
        raise ValueError(f"op must be 'mm' or 'addmm', got {op!r}")
    device = torch.device(device)
    key = (op, device.type, dtype)
    if key not in _OUT_DTYPE:
        small = 2.0 ** -12  # exact in bf16 and fp16, and 1 + small is not: a rounded sum gives 1
        # mm: row 0 of a @ ones is 1 + small; addmm: 1 (the accumulator) + small
        a = torch.tensor([[1.0 if op == "mm" else 0.0, small], [0.0, 0.0]], dtype=dtype, device=device)
        b = torch.ones(2, 2, dtype=dtype, device=device)
        out = torch.full((2, 2), 0.0 if op == "mm" else 1.0, dtype=torch.float32, device=device)
        try:
            if op == "mm":
                torch.mm(a, b, out_dtype=torch.float32, out=out)
            else:
                torch.addmm(out, a, b, out_dtype=torch.float32, out=out)
            _OUT_DTYPE[key] = device.type == "meta" or float(out[0, 0]) == 1.0 + small
        except (RuntimeError, TypeError):  # NotImplementedError is a RuntimeError; TypeError: no such keyword
            _OUT_DTYPE[key] = False
    return _OUT_DTYPE[key]


# The float32-logits paths, chosen by what this torch's mm and addmm do (has_out_dtype), not by its
# version. The versions are what torch's release notes and issues say (mm's out_dtype from 2.8;
# addmm into a float32 `self` from 2.10, pytorch#167931), never run here: this machine's CPU build
# has neither op.
LOGITS32_PATHS = {
    "out_dtype": "GEMM 1 writes float32 logits and GEMM 3 sums the weight gradient in float32 "
                 "(cuBLAS's out_dtype for mm and addmm, as designed: torch 2.10 and later on CUDA)",
    "out_dtype-mm": "GEMM 1 writes float32 logits; addmm has no float32 accumulator here, so the weight "
                    "gradient is summed in the operands' dtype, rounded once a chunk, as with bf16 logits "
                    "(torch 2.8-2.9 on CUDA)",
    "upcast": "no out_dtype: the head weight is copied to float32 once a call, each chunk's hidden states "
              "a chunk, and GEMM 1 runs in float32; the weight gradient is summed in the operands' dtype "
              "(the CPU's path; torch before 2.8 on CUDA, where a float32 GEMM runs at a fraction of "
              "bf16's rate: predicted about 2x eager's time, never measured)",
}


def logits32_path(device: str | torch.device, dtype: torch.dtype = torch.bfloat16) -> str:
    """Which LOGITS32_PATHS key GEMMs 1 and 3 take for float32 logits from `dtype` operands on
    `device`'s type: "out_dtype" where mm and addmm both write float32, "out_dtype-mm" where
    only mm does, else "upcast"."""
    if not has_out_dtype("mm", device, dtype):
        return "upcast"
    return "out_dtype" if has_out_dtype("addmm", device, dtype) else "out_dtype-mm"


def slower_than_eager(path: str, device: str | torch.device) -> bool:
    """Whether `path` is expected to make the loss slower than eager autograd on `device`: the
    upcast on an accelerator, whose float32 GEMM (without TF32) runs at a fraction of its bf16
    rate. On the CPU the upcast is the designed path (a float32 head GEMM: float32 logits cost the
    default job's update 1.11x rounded logits' time there, BENCHMARKS.md)."""
    if path not in LOGITS32_PATHS:
        raise ValueError(f"path must be one of {sorted(LOGITS32_PATHS)}, got {path!r}")
    return path == "upcast" and torch.device(device).type not in ("cpu", "meta")


def default_accum(logits_dtype: torch.dtype, dtype: torch.dtype, device: str | torch.device) -> torch.dtype:
    """grad_weight's accumulator when the caller names none: float32 for float32 logits from
    lower-precision operands on the "out_dtype" path (GEMM 3 writes float32 itself: the same
    GEMM, rounded once at the end as eager's is, for 4 V H bytes), else the operands' dtype.
    Elsewhere float32 sums would cost an upcast of each chunk's gradient and a float32 GEMM
    (2.5x bf16's addmm on one Xeon core at H 576, V 49,152), so they are left to
    accum_dtype=torch.float32."""
    if logits_dtype == torch.float32 and dtype != torch.float32 and logits32_path(device, dtype) == "out_dtype":
        return torch.float32
    return dtype


def _addmm_f32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b with acc float32 and a, b in a low-precision dtype, products accumulated in
    float32 (cuBLAS's out_dtype where this torch has it; exact upcasts elsewhere)."""
    if has_out_dtype("addmm", a.device, a.dtype):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
        return
    torch.addmm(acc, a.float(), b.float(), out=acc)


class LogitsGemm:
    """GEMM 1: out = h @ weight.T in out's dtype. Where out is float32 and the operands are of a
    lower precision, the products are accumulated and kept in float32: cuBLAS's out_dtype on
    CUDA, else an exact upcast of the operands (the weight's once per call) and a float32 GEMM."""

    def __init__(self, weight: torch.Tensor):
        self.weight, self.up = weight, None

    def __call__(self, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if out.dtype == h.dtype:
            return torch.mm(h, w.T, out=out)
        if logits32_path(h.device, h.dtype) != "upcast":
            return torch.mm(h, w.T, out_dtype=out.dtype, out=out)
        if self.up is None:
            self.up = w.to(out.dtype)
        return torch.mm(h.to(out.dtype), self.up.T, out=out)


def _logits_dtype(logits_dtype: torch.dtype | None, dtype: torch.dtype) -> torch.dtype:
    """The logits buffer's dtype: `dtype` (the operands') unless float32 is asked for."""
    if logits_dtype not in (None, torch.float32):
        raise ValueError(f"logits_dtype must be None or torch.float32, got {logits_dtype!r}")
    return logits_dtype or dtype


def _active(mask: torch.Tensor, n_active: int | None) -> torch.Tensor:
    """Flat positions (n_active,) of the mask's non-zero entries, in order, without a host sync
    when n_active is given."""
    flat = mask.reshape(-1) != 0
    if n_active is None:
        return flat.nonzero().squeeze(1)
    return torch.nonzero_static(flat, size=n_active).squeeze(1)


def _per_token(t, active, shape, dtype=torch.float32):
    if t is None:
        return None
    if t.dim() == 1:  # (B,): one value per sequence
        t = t[:, None].expand(shape)
    return t.reshape(-1).index_select(0, active).to(dtype)


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                   chunk_size: int | None = None, exclude: torch.Tensor | None = None,
                   logits_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(target) and logsumexp of the logits, both (N,) float32, for hidden (N, H),
    weight (V, H), targets (N,) int64, never holding more than one (chunk_size, V) buffer of
    logits; one GEMM. log pi <= 0 exactly: the target logit is read from the same row as the lse.
    `exclude` (int64 vocabulary ids): tokens the sampler never draws (an engine's suppressed
    tokens), taken out of the softmax as -inf logits, so pi is the distribution sampled from.
    `logits_dtype`: None (the weight's) or torch.float32: float32 logits from bf16 or fp16
    operands (the module docstring)."""
    n, V = hidden.shape[0], weight.shape[0]
    ldt = _logits_dtype(logits_dtype, weight.dtype)
    chunk_size = chunk_size or default_chunk(n, V, hidden.device)
    if exclude is not None:
        exclude = exclude.to(hidden.device)
    logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
    lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
    buf = torch.empty((min(chunk_size, n), V), dtype=ldt, device=hidden.device)
    logits = LogitsGemm(weight)
    for s in range(0, n, chunk_size):
        e = min(s + chunk_size, n)
        z = logits(hidden[s:e], buf[:e - s])
        if exclude is not None:
            z.index_fill_(1, exclude, -float("inf"))
        logp[s:e], lse[s:e], _ = rows(z, targets[s:e], mode="logp")
    return logp, lse


class _FusedLinearPolicyLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, old_logp, advantages, mask, weights, kw, opts):
        B, T, H = hidden.shape
        V = weight.shape[0]
        need_h, need_w = opts["need"]
        active = _active(mask, opts["n_active"])
        n = active.numel()
        dev, dt = hidden.device, weight.dtype
        h = hidden.reshape(-1, H).index_select(0, active)
        y = targets.reshape(-1).index_select(0, active)
        ldt = opts["logits_dtype"] or dt
        chunk = opts["chunk_size"] or default_chunk(n, V, dev)
        exclude = opts["exclude"]
        m = mask.reshape(B, T).to(torch.float32)
        coef = _row_coef(m.sum(1), kw["agg"])  # d loss / d (row's sum of token terms), from the mask
        sequence = kw["ratio_level"] == "sequence"
        tok = dict(adv=_per_token(advantages, active, (B, T)),
                   scale=_per_token(weights, active, (B, T)) if weights is not None else
                   torch.ones(n, dtype=torch.float32, device=dev),
                   coef=_per_token(coef, active, (B, T)),
                   old=_per_token(old_logp, active, (B, T)),
                   ref=_per_token(kw["ref_logp"], active, (B, T)) if kw["kl_coef"] > 0 else None,
                   tis=_per_token(kw["tis_logp"], active, (B, T)))
        grad = need_h or need_w
        grad_h = torch.empty((n, H), dtype=dt, device=dev) if need_h else None
        acc_dt = opts["accum_dtype"] or default_accum(ldt, dt, dev)
        grad_w = torch.zeros((V, H), dtype=acc_dt, device=dev) if need_w else None
        logp_a = torch.empty(n, dtype=torch.float32, device=dev)
        terms = torch.empty((n, 4), dtype=torch.float32, device=dev)
        g = None
        if sequence:  # the loss couples a row's tokens: log-probs first, then its gradient
            logp_a, lse_a = token_logprobs(h, weight, y, chunk_size=chunk, exclude=exclude,
                                           logits_dtype=opts["logits_dtype"])
            full = torch.zeros(B * T, dtype=torch.float32, device=dev).index_copy_(0, active, logp_a)
            old = full.view(B, T) if old_logp is None else old_logp
            loss, dlogp, stats = loss_and_grad(full.view(B, T), old, advantages, mask, weights, **kw)
            g = dlogp.reshape(-1).index_select(0, active).float() * opts["grad_scale"]
        # the row pass forms the gradient of grad_scale x loss, so that fp16 keeps its small parts
        row_coef = tok["coef"] * opts["grad_scale"] if opts["grad_scale"] != 1.0 else tok["coef"]
        buf = torch.empty((min(chunk, n), V), dtype=ldt, device=dev)
        # the row pass writes the gradient in the GEMMs' dtype here: no cast pass, nothing allocated per chunk
        dbuf = grad_buffer(buf, dt) if grad else buf
        logits = LogitsGemm(weight)
        if not sequence or grad:
            row_kw = dict(clip_low=kw["clip_low"], clip_high=kw["clip_high"], kl_coef=kw["kl_coef"],
                          tis_cap=kw["tis_cap"], cispo=kw["loss"] == "cispo")
            for s in range(0, n, chunk):
                e = min(s + chunk, n)
                z = logits(h[s:e], buf[:e - s])  # GEMM 1 (2 in a two-pass loss)
                d = z if dbuf is buf else dbuf[:e - s]
                if exclude is not None:
                    z.index_fill_(1, exclude, -float("inf"))
                if sequence:
                    rows(z, y[s:e], mode="given", out=d, g=g[s:e], lse=lse_a[s:e])
                else:
                    part = {k: (v[s:e] if v is not None else None) for k, v in tok.items()}
                    part["coef"] = row_coef[s:e]
                    lp, _, te = rows(z, y[s:e], mode="loss" if grad else "logp", out=d if grad else None, **part,
                                     **row_kw)
                    logp_a[s:e] = lp
                    if te is None:  # no gradient wanted: the terms alone
                        te = _terms_only(lp, part, row_kw)
                    terms[s:e] = te
                if need_h:
                    torch.mm(d, weight, out=grad_h[s:e])  # GEMM 2
                if need_w:
                    if acc_dt == dt:
                        torch.addmm(grad_w, d.T, h[s:e], out=grad_w)  # GEMM 3
                    else:
                        _addmm_f32(grad_w, d.T, h[s:e])
        if not sequence:
            loss = (terms[:, 0] * tok["coef"]).sum()
            tokens = m.sum()
            denom = tokens.clamp_min(1.0)
            stats = {"clip_frac": terms[:, 1].sum() / denom, "ratio_mean": terms[:, 2].sum() / denom,
                     "kl_mean": terms[:, 3].sum() / denom, "tokens": tokens}
        logp = torch.zeros(B * T, dtype=torch.float32, device=dev).index_copy_(0, active, logp_a).view(B, T)
        if need_h:
            full_h = torch.zeros((B * T, H), dtype=hidden.dtype, device=dev)
            full_h.index_copy_(0, active, grad_h.to(hidden.dtype))
            grad_h = full_h.view(B, T, H)
        if need_w and acc_dt != dt:
            grad_w = grad_w.to(dt)
        ctx.save_for_backward(*(t for t in (grad_h, grad_w) if t is not None))
        ctx.need = (need_h, need_w)
        ctx.done = False
        ctx.grad_scale = opts["grad_scale"]
        outs = [stats[k] for k in _STATS] + [logp]
        ctx.mark_non_differentiable(*outs)
        return (loss.float(), *outs)

    @staticmethod
    def backward(ctx, grad_out, *unused):
        if ctx.done:
            raise RuntimeError("fused_linear_policy_loss: a second backward through the same forward; its "
                               "gradients were formed in the forward and scaled in place by the first")
        ctx.done = True
        saved = list(ctx.saved_tensors)
        need_h, need_w = ctx.need
        # scaled in place: a copy would add a (V, H) tensor to the peak; a 0-d grad_out keeps bf16 bf16
        if ctx.grad_scale != 1.0:
            grad_out = grad_out / ctx.grad_scale
        gh = saved.pop(0).mul_(grad_out) if need_h else None
        gw = saved.pop(0).mul_(grad_out) if need_w else None
        return (gh, gw, None, None, None, None, None, None, None)


def _terms_only(lp, part, row_kw):
    loss, _, active, ratio, kl = token_terms(lp, part["old"], part["adv"], part["scale"],
                                             clip_low=row_kw["clip_low"], clip_high=row_kw["clip_high"],
                                             kl_coef=row_kw["kl_coef"], ref=part["ref"], tis=part["tis"],
                                             tis_cap=row_kw["tis_cap"], cispo=row_kw["cispo"])
    return torch.stack([loss, active, ratio, kl], 1)


def fused_linear_policy_loss(hidden, lm_weight, targets, old_logp, advantages, mask, weights=None, *,
                             clip_low=0.2, clip_high=0.2, agg="token-mean", ref_logp=None, kl_coef=0.0,
                             tis_logp=None, tis_cap=None, loss="clip", ratio_level="token", chunk_size=None,
                             return_stats=False, exclude=None, n_active=None, check=True, accum_dtype=None,
                             logits_dtype=None, grad_scale=1.0):
    """`policy_loss` on log pi(targets) = log_softmax(hidden @ lm_weight.T)[targets], computed
    chunk by chunk: hidden (B, T, H), lm_weight (V, H) of hidden's dtype, targets (B, T) int64;
    the rest as in `policy_loss` (`loss`, `ratio_level` too). Differentiable w.r.t. hidden and
    lm_weight (each only if it requires grad and grad mode is on); the gradients are formed in
    the forward (see the module docstring).

    chunk_size: active tokens per chunk (None: `default_chunk`: 1,024 on CUDA at V = 151,936).
    return_stats: also a dict of the loss's detached statistics (as `policy_loss`) plus "logp":
        the (B, T) float32 log-probs the loss used (0 at masked tokens), at no extra cost.
    exclude: vocabulary ids out of the softmax, as in `token_logprobs`; no target may be one.
    old_logp None: the old policy is the current one (ratio 1); stats["logp"] returns them.
    n_active: the number of non-zero mask entries, if the caller knows it (no host sync).
    check: check the targets on the host (syncs); off, bad targets give NaN (see the module).
    accum_dtype: None (`default_accum`: float32 with float32 logits where the GEMM can write
        float32, as on CUDA; else the weight's dtype) or torch.float32 for grad_weight across chunks.
    logits_dtype: None (the weight's dtype) or torch.float32: GEMM 1 keeps float32 logits (the
        module docstring); the gradient is still rounded to the weight's dtype for GEMMs 2 and 3.
    grad_scale: the loss scale S of a dynamic loss-scaling caller, which backpropagates S x loss.
        The gradients are formed in the forward, before that incoming gradient exists, so they
        are formed for S x loss (rounded to fp16 at that scale, not underflowing) and the
        backward divides S out of the incoming gradient. The loss returned is not scaled."""
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
    if chunk_size is not None and not (isinstance(chunk_size, int) and chunk_size > 0):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    if n_active is not None and not (isinstance(n_active, int) and 0 <= n_active <= mask.numel()):
        raise ValueError(f"n_active must be an int in [0, {mask.numel()}] or None, got {n_active!r}")
    if accum_dtype not in (None, torch.float32):
        raise ValueError(f"accum_dtype must be None or torch.float32, got {accum_dtype!r}")
    _logits_dtype(logits_dtype, lm_weight.dtype)
    if isinstance(grad_scale, bool) or not isinstance(grad_scale, (int, float)) or \
            not (0 < grad_scale < float("inf")):
        raise ValueError(f"grad_scale must be a finite number > 0, got {grad_scale!r}")
    check_inputs(torch.empty(hidden.shape[:2], device="meta"), old_logp, advantages, mask, weights, clip_low,
                 clip_high, agg, ref_logp, kl_coef, tis_logp, tis_cap, loss, ratio_level)
    if exclude is not None:
        exclude = torch.as_tensor(exclude, dtype=torch.int64, device=hidden.device)
    if check:
        sel = mask.reshape(-1) != 0
        if n_active is not None and int(sel.sum()) != n_active:
            raise ValueError(f"n_active={n_active} but the mask has {int(sel.sum())} non-zero entries")
        y = targets.reshape(-1)[sel]
        if y.numel():
            if int(y.min()) < 0 or int(y.max()) >= lm_weight.shape[0]:
                raise ValueError(f"targets of unmasked tokens must lie in [0, {lm_weight.shape[0]})")
            if exclude is not None and bool(torch.isin(y, exclude).any()):
                raise ValueError("targets of unmasked tokens must not be in exclude (their probability is 0)")
    grad_on = torch.is_grad_enabled()
    kw = dict(clip_low=clip_low, clip_high=clip_high, agg=agg, ref_logp=ref_logp, kl_coef=kl_coef,
              tis_logp=tis_logp, tis_cap=tis_cap, loss=loss, ratio_level=ratio_level)
    opts = dict(need=(grad_on and hidden.requires_grad, grad_on and lm_weight.requires_grad), n_active=n_active,
                chunk_size=chunk_size, exclude=exclude, accum_dtype=accum_dtype, logits_dtype=logits_dtype,
                grad_scale=float(grad_scale))
    out, *stats = _FusedLinearPolicyLoss.apply(
        hidden, lm_weight, targets, None if old_logp is None else old_logp.detach(), advantages.detach(), mask,
        weights.detach() if weights is not None else None, kw, opts)
    return (out, dict(zip((*_STATS, "logp"), stats))) if return_stats else out

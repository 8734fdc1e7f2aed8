"""The trainable policy: log-prob recompute and the clipped IS-weighted update.

Rows are whole episodes: one chat per row, right-padded, the mask on the assistant's tokens.
Inputs may live on any device; they are moved once and results stay on the training device. The loss runs through
freshper.kernels.fused_linear_policy_loss on the decoder's last hidden states and the LM head,
so the (tokens, vocab) logits are never materialised (Triton policy-loss kernel on CUDA).
Micro-batches are weighted so that the accumulated gradient equals that of one big batch under
the chosen aggregation.

On several ranks (torchrun) the model is sharded with FSDP2 (trainer/model/sharding.py) and each rank
holds its own rows of the global batch: token and sequence counts are summed over ranks before
the loss is normalised, gradients are summed (not averaged) over ranks, and every rank runs the
same number of micro-batches (a rank with fewer rows runs empty ones), because each forward
gathers parameters collectively. The step then equals one process's step on all the rows.

On one process a micro-batch without signal (every response token's advantage 0, no KL term)
skips its backward: its gradient is exactly zero. Under the batch whitening that happens when no
group of the batch has signal (a collapsed policy), where those backwards were most of the update.
"""
from __future__ import annotations

import contextlib
import copy
import math

import torch

from freshper.batch_weight import weigh_momentum
from freshper.kernels import fused_linear_policy_loss, token_logprobs

from ..config import Config
from ..dist import SINGLE, Dist
from .load import full_attention
from .lora import adapters_off, has_lora
from .loss_scale import LossScale
from .precision import compute_dtype as run_compute_dtype
from .precision import log_head_path
from .prefix import reply_starts, share_order
from .sharding import PolicyNet, shard


def row_lengths(mask: torch.Tensor) -> torch.Tensor:
    """(R,) tokens up to and including the last response token of each row."""
    L = mask.shape[1]
    pos = torch.arange(L, device=mask.device).expand_as(mask)
    return torch.where(mask, pos + 1, torch.zeros_like(pos)).max(1).values


def lr_lambda(schedule: str, warmup: int, total: int):
    """Multiplier of the peak learning rate at optimizer step s: linear warm-up over `warmup`
    steps, then constant or cosine down to 0 at step `total`. Past `total` the cosine goes on
    (it rises again), as transformers' cosine schedule does in the paper's code, whose replay
    steps advance a schedule sized for the on-policy steps alone."""
    def f(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = (s - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return f


def _empty(hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """A zero that depends on every parameter: the stand-in micro-batch of a rank with no rows left
    (its backward still joins the ranks' gradient reductions)."""
    return (hidden.sum() + head.sum()) * 0.0


class Policy:
    def __init__(self, model, cfg: Config, device: torch.device, total_steps: int = 1, dist: Dist = SINGLE,
                 compute_dtype: torch.dtype | None = None, exclude_ids: list[int] | None = None, stand_in=None):
        """`model` a Hugging Face causal LM on `device`. With `dist.world` > 1 it is sharded here
        (FSDP2, in place; `compute_dtype` the mixed-precision compute dtype, None: the weights'
        own) and the optimizer holds this rank's shards. `exclude_ids`: tokens the engine never
        samples (a VLM's vision tokens), out of the policy's softmax as they are out of the
        sampler's, so the ratio compares the distributions sampled from. `stand_in`: a VLM's
        (tokens (1, n), VisionRows) row with an image, the stand-in micro-batch of a rank with no
        rows left, so that the vision tower joins every rank's forward and backward too."""
        self.cfg, self.device, self.dist = cfg, device, dist
        self.stand_in = stand_in
        self.exclude = torch.tensor(exclude_ids, dtype=torch.long, device=device) if exclude_ids else None
        # float32 logits from bf16 operands, as the HF engine samples from (model.logits_dtype)
        self.logits_dtype = torch.float32 if cfg.model.logits_dtype == "float32" else None
        a = cfg.algo
        # the KL reference: a frozen copy, or for a LoRA run the base itself, its adapters switched off
        self.ref_is_base = a.kl_coef > 0 and has_lora(model)
        ref = copy.deepcopy(model).eval().requires_grad_(False) if a.kl_coef > 0 and not self.ref_is_base else None
        compute = run_compute_dtype(model)
        log_head_path(cfg.model.logits_dtype, device, compute_dtype if dist.on else compute)  # the path, once a run
        if ref is not None and compute is not None and not dist.on:
            ref.to(compute)  # frozen: no float32 masters (trainer/model/precision.py)
        self.net = PolicyNet(model)
        self.ref_net = PolicyNet(ref) if ref is not None else None
        if dist.on:
            shard(self.net, compute_dtype)
            if self.ref_net is not None:
                shard(self.ref_net, compute_dtype)
        self.model = self.net.model
        self.ref_model = ref
        # the trainable parameters: all of them, or with LoRA the adapters (the base is frozen)
        self.opt = torch.optim.AdamW([p for p in self.net.parameters() if p.requires_grad], lr=a.lr,
                                     weight_decay=a.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(a.lr_schedule, a.warmup_steps, total_steps))
        # fp16 compute: dynamic loss scaling (one process; config/checks.py refuses fp16 on several ranks)
        self.loss_scale = LossScale() if (compute_dtype if dist.on else compute) == torch.float16 else None

    def scale_stats(self) -> dict:
        """The fp16 loss scale and the updates it skipped so far, for the metrics; {} otherwise."""
        s = self.loss_scale
        return {} if s is None else {"loss_scale": s.scale, "skipped_updates": s.skipped}

    def _micro_batches(self, rows: int) -> int:
        """How many micro-batches every rank runs: the most any rank needs (FSDP2 gathers the
        parameters collectively in each forward, so all ranks run the same number)."""
        mb = self.cfg.algo.micro_batch
        n = torch.tensor([-(-rows // mb)], device=self.device)
        return int(self.dist.max(n)[0])

    def _dummy(self) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """(tokens, lengths, vision inputs) of the stand-in micro-batch: one row of two tokens, or
        a VLM's row with an image."""
        if self.stand_in is not None:
            tokens, vision = self.stand_in
            tokens = tokens.to(self.device)
            return tokens, torch.full((1,), tokens.shape[1], dtype=torch.long, device=self.device), \
                vision.kwargs(slice(0, 1), tokens)
        return (torch.zeros((1, 2), dtype=torch.long, device=self.device),
                torch.full((1,), 2, dtype=torch.long, device=self.device), {})

    def _starts(self, mask: torch.Tensor, lengths: torch.Tensor, vision) -> torch.Tensor | None:
        """(R,) where each row's reply begins, for the shared-prompt forward (trainer/model/prefix.py),
        or None where rows run whole: `model.share_prefix` off, a vision-language model (its
        M-RoPE positions come from the whole row), several ranks (FSDP2 would gather every layer
        twice per micro-batch; not tested there), gradient checkpointing (Hugging Face turns
        the key/value cache off under it), or sliding-window attention (the padded prefix block
        would shift a shorter prompt's window)."""
        m = self.cfg.model
        vlm = vision is not None or getattr(self.model.config, "vision_config", None) is not None
        if not m.share_prefix or m.gradient_checkpointing or vlm or self.dist.on:
            return None
        if not full_attention(self.model.config):
            return None
        return reply_starts(mask, lengths)

    def _order(self, tokens: torch.Tensor, starts: torch.Tensor | None, lengths: torch.Tensor) -> torch.Tensor | None:
        """(R,) the order the rows run in (prefix.share_order), or None: rows as given. Only where
        the shared-prompt forward runs and there is more than one micro-batch; within one
        micro-batch the order would change nothing but float rounding."""
        if starts is None or tokens.shape[0] <= self.cfg.algo.micro_batch:
            return None
        return share_order(tokens, starts, lengths)

    # ------------------------------------------------------------------ log-prob recompute
    @torch.no_grad()
    def logprobs(self, tokens: torch.Tensor, mask: torch.Tensor, ref: bool = False, vision=None) -> torch.Tensor:
        """(R, L) float32 on the training device: log pi(token i | tokens < i) at response
        positions, 0 elsewhere (`ref`: under the reference model; `vision`: a VLM's
        trainer.vision.VisionRows of these rows). Collective on several ranks."""
        net = self.ref_net if ref and not self.ref_is_base else self.net
        if ref and self.ref_is_base:
            with adapters_off(self.model):
                return self.logprobs(tokens, mask, vision=vision)
        tokens, mask = tokens.to(self.device), mask.to(self.device)
        out = torch.zeros(tokens.shape, dtype=torch.float32, device=self.device)
        lengths = row_lengths(mask)
        starts = self._starts(mask, lengths, vision)
        order = self._order(tokens, starts, lengths)
        if order is not None:
            tokens, mask, lengths, starts = tokens[order], mask[order], lengths[order], starts[order]
        mb = self.cfg.algo.micro_batch
        for i in range(self._micro_batches(tokens.shape[0])):
            sl = slice(i * mb, (i + 1) * mb)
            n = int(lengths[sl].max()) if i * mb < tokens.shape[0] else 0
            if n == 0:
                if self.dist.on:
                    tk, ln, vis = self._dummy()
                    net(tk, ln, _empty, **vis)
                continue
            tk, mk = tokens[sl, :n].long(), mask[sl, :n]
            sel = mk[:, 1:]
            lp = net(tk, lengths[sl],
                     lambda h, w: token_logprobs(h[sel], w, tk[:, 1:][sel], exclude=self.exclude,
                                                 logits_dtype=self.logits_dtype)[0],
                     starts=None if starts is None else starts[sl],
                     **(vision.kwargs(sl, tk) if vision is not None else {}))
            block = out[sl, 1:n]
            block[sel] = lp.float()
        if order is not None:  # back to the caller's order
            out[order] = out.clone()
        return out

    def _silent(self, adv: torch.Tensor, resp: torch.Tensor, ref_logp, count: int) -> list[bool]:
        """Per micro-batch of the update: True where its backward would add exactly zero, so it is
        skipped (`algo.skip_zero_adv`). Every loss multiplies each token's term by its advantage, so
        a micro-batch whose response tokens all have advantage 0 has a zero gradient unless a KL
        term is on. Not on several ranks, where every rank's backward joins FSDP2's collectives.
        When every micro-batch is silent the last one still runs its backward, so that every
        parameter gets its (zero) gradient and AdamW steps as it would (its momentum moves the
        weights even on a zero gradient; a parameter without a gradient it leaves alone)."""
        a = self.cfg.algo
        if not a.skip_zero_adv or self.dist.on or (ref_logp is not None and a.kl_coef > 0):
            return [False] * count
        live = ((adv[:, 1:] != 0) & resp.bool()).any(1)  # (R,) rows with a token of non-zero advantage
        pad = count * a.micro_batch - live.shape[0]
        live = torch.cat([live, live.new_zeros(pad)]).view(count, a.micro_batch).any(1)  # padding rows: no signal
        silent = (~live).tolist()
        if silent and all(silent):  # (no micro-batch at all: an update of no rows stays as it was)
            silent[-1] = False
        return silent

    # ------------------------------------------------------------------------- the update
    def update(self, tokens, mask, old_logp, adv, weights=None, tis_logp=None, vision=None, tis_cap=None,
               batch_weight: float = 1.0, ess_lr: bool = False) -> dict:
        """One optimizer step on rows (R, L): clipped surrogate with per-row IS `weights` (R,)
        (None: all 1) and token advantages `adv` (R, L); `vision`: a VLM's VisionRows of the
        rows. `batch_weight` in [0, 1] multiplies the clipped gradient where it enters AdamW's
        first moment, not its second (freshper/batch_weight.py): the rows' contribution to
        this step and to the momentum that carries it on is that factor times what it would be,
        while the step's scale stays as the rows at weight 1 make it. (A factor on the loss would
        not act: the clip divides it back out.) `ess_lr`: multiply this step's learning rate by
        sqrt(ESS / R) of the rows' sequence-level importance ratios pi_theta(y) / mu(y) against the
        engine's `tis_logp` (VCPO, Huang et al. 2026, arXiv 2602.17616: their default sqrt rule,
        unclipped ratios, ESS = (sum w)^2 / sum w^2); a learning-rate factor shrinks the whole
        step, the momentum of earlier batches included, while these rows' gradient still enters
        the momentum in full. "batch_weight", and with `ess_lr` "ess" and "lr_scale", come back.
        Returns detached scalar stats and two estimates (R,) of each row's per-token KL(mu || pi)
        from this update's own log-probs, means over its response tokens with d = logp - old_logp:
        "row_kl", k3 = e^d - 1 - d (never negative; what the metrics and freshper-auto use), and
        "row_kl1", k1 = -d (unbiased, but negative on a row where pi happens to favour the sampled
        tokens). On several ranks the rows are this rank's share of the global batch and the scalar stats are global.
        `old_logp` None: the old policy is the current weights (the first pass over rows these
        weights' log-probs were not yet computed for); the update's own forward gives them, and
        they come back as "logp" (R, L), equal to what `logprobs` would have returned.
        `tis_cap`: the truncated IS cap for these rows (None: algo.tis_cap; a stale batch's is
        algo.stale_tis_cap, trainer/train/staleness.py)."""
        a = self.cfg.algo
        if not (math.isfinite(batch_weight) and 0 <= batch_weight <= 1):
            raise ValueError(f"batch_weight={batch_weight}: expected a number in [0, 1]")
        if ess_lr and tis_logp is None:
            raise ValueError("ess_lr needs tis_logp, the engine's log-probs the importance ratios are taken against")
        cap = a.tis_cap if tis_cap is None else tis_cap
        dev = self.device
        own = old_logp is None
        tokens, mask, adv = tokens.to(dev), mask.to(dev), adv.to(dev)
        old_logp = torch.zeros(tokens.shape, dtype=torch.float32, device=dev) if own else old_logp.to(dev)
        weights = None if weights is None else weights.to(dev).float()
        behaviour = tis_logp.to(dev) if ess_lr else None  # the ESS's mu, whether or not truncated IS is on
        tis_logp = tis_logp.to(dev) if (tis_logp is not None and cap > 0) else None
        self.net.train()
        ref_logp = self.logprobs(tokens, mask, ref=True, vision=vision) if self.ref_net is not None or \
            self.ref_is_base else None
        lengths = row_lengths(mask)
        starts = self._starts(mask, lengths, vision)
        order = self._order(tokens, starts, lengths)
        if order is not None:  # micro-batches that share prompts and pad little; undone on the way out
            pick = lambda t: None if t is None else t[order]  # noqa: E731
            tokens, mask, adv, old_logp, lengths, starts = map(pick, (tokens, mask, adv, old_logp, lengths, starts))
            weights, tis_logp, ref_logp, behaviour = map(pick, (weights, tis_logp, ref_logp, behaviour))
        resp = mask[:, 1:]
        # the global batch's token and sequence counts normalise every rank's loss
        total_tok, total_seq = self.dist.sum(torch.stack([resp.sum(), resp.any(1).sum()]))
        self.opt.zero_grad(set_to_none=True)
        sums = torch.zeros(4, dtype=torch.float64, device=dev)  # loss, clip_frac, ratio_mean, kl_mean
        row_kl = torch.zeros(tokens.shape[0], dtype=torch.float32, device=dev)
        row_kl1 = torch.zeros_like(row_kl)
        seq_log_ratio = torch.zeros_like(row_kl) if ess_lr else None  # log pi_theta(y) - log mu(y) per row
        mb = a.micro_batch
        n_micro = self._micro_batches(tokens.shape[0])
        silent = self._silent(adv, resp, ref_logp, n_micro)
        S = self.loss_scale.scale if self.loss_scale is not None else 1.0  # S x loss is backpropagated
        for i in range(n_micro):
            sl = slice(i * mb, (i + 1) * mb)
            # the one host sync of a micro-batch: its row width and its number of reply tokens
            n, n_act = torch.stack([lengths[sl].max(), mask[sl, 1:].sum()]).tolist() if i * mb < tokens.shape[0] \
                else (0, 0)
            if n == 0:
                if self.dist.on:
                    tk, ln, vis = self._dummy()
                    self.net(tk, ln, _empty, **vis).backward()
                continue
            tk, mk = tokens[sl, :n].long(), mask[sl, :n]
            micro_tok = mk[:, 1:].sum()
            share = (micro_tok / total_tok.clamp_min(1) if a.agg == "token-mean"
                     else mk[:, 1:].any(1).sum() / total_seq.clamp_min(1))
            cut = lambda t: None if t is None else t[sl, 1:n]  # noqa: E731
            with torch.no_grad() if silent[i] else contextlib.nullcontext():
                loss, st = self.net(tk, lengths[sl], lambda h, w: fused_linear_policy_loss(
                    h, w, tk[:, 1:], None if own else old_logp[sl, 1:n], adv[sl, 1:n], mk[:, 1:],
                    None if weights is None else weights[sl],
                    clip_low=a.clip_low, clip_high=a.clip_high, agg=a.agg, loss=a.loss, ratio_level=a.ratio_level,
                    ref_logp=cut(ref_logp),
                    kl_coef=a.kl_coef if ref_logp is not None else 0.0,
                    tis_logp=cut(tis_logp), tis_cap=cap if tis_logp is not None else None, return_stats=True,
                    exclude=self.exclude, n_active=n_act, check=False, logits_dtype=self.logits_dtype,
                    grad_scale=S),
                    starts=None if starts is None else starts[sl],
                    **(vision.kwargs(sl, tk) if vision is not None else {}))
            if own:  # this forward's log-probs are the old policy's: kept for the caller
                old_logp[sl, 1:n] = st["logp"]
            if not silent[i]:
                (loss * (share * S)).backward()
            tok_share = micro_tok / total_tok.clamp_min(1)
            sums += torch.stack([loss.detach() * share, st["clip_frac"] * tok_share, st["ratio_mean"] * tok_share,
                                 st["kl_mean"] * tok_share]).double()
            m = mk[:, 1:].float()
            d = (st["logp"] - old_logp[sl, 1:n]).masked_fill(m == 0, 0.0)
            count = m.sum(1).clamp_min(1.0)
            row_kl[sl] = ((torch.expm1(d) - d) * m).sum(1) / count
            row_kl1[sl] = -(d * m).sum(1) / count
            if seq_log_ratio is not None:
                seq_log_ratio[sl] = (st["logp"].detach() - behaviour[sl, 1:n]).masked_fill(m == 0, 0.0).sum(1)
        # the ESS's check runs before the loss scale or the optimizer changes
        ess = self._ess_fraction(seq_log_ratio, resp.any(1)) if seq_log_ratio is not None else None
        lr_scale = 1.0 if ess is None else math.sqrt(ess)
        if self.loss_scale is not None:
            self.loss_scale.unscale_(self.net.parameters())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), a.grad_clip)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2: the global norm
            grad_norm = grad_norm.full_tensor()
        sums = self.dist.sum(sums)
        vals = torch.cat([sums, grad_norm.detach().double()[None], total_tok.double()[None]]).tolist()  # one sync
        finite = math.isfinite(vals[4])
        if self.loss_scale is not None:  # fp16: an overflow halves S and skips this step
            step = self.loss_scale.update(finite)
        elif not finite:
            self.opt.zero_grad(set_to_none=True)
            raise FloatingPointError(f"non-finite gradient norm {vals[4]}; lower algo.lr or check inputs")
        else:
            step = True
        if step:
            weigh_momentum(self.opt, batch_weight)  # after the clip, into Adam's first moment only
            scheduled = [g["lr"] for g in self.opt.param_groups]
            for g in self.opt.param_groups:
                g["lr"] *= lr_scale
            try:
                self.opt.step()
            finally:
                for g, lr in zip(self.opt.param_groups, scheduled):
                    g["lr"] = lr
            self.sched.step()
        else:
            self.opt.zero_grad(set_to_none=True)
        if order is not None:
            for t in (row_kl, row_kl1, *((old_logp,) if own else ())):
                t[order] = t.clone()
        return {"loss": vals[0], "clip_frac": vals[1], "ratio_mean": vals[2], "kl_mean": vals[3],
                "grad_norm": vals[4], "tokens": int(vals[5]), "row_kl": row_kl, "row_kl1": row_kl1,
                "batch_weight": batch_weight, **({"ess": ess, "lr_scale": lr_scale} if ess is not None else {}),
                **({"logp": old_logp} if own else {})}

    def _ess_fraction(self, log_ratio: torch.Tensor, rows: torch.Tensor) -> float:
        """ESS / N of importance ratios exp(`log_ratio`) (R,) over the `rows` (R,) bool that have
        response tokens, on all ranks: (sum w)^2 / (N sum w^2), in (0, 1], computed with the
        largest log-ratio subtracted so that no ratio overflows."""
        x = log_ratio.double().masked_fill(~rows, -math.inf)
        top = self.dist.max(x.max().reshape(1) if x.numel() else x.new_full((1,), -math.inf))[0]
        w = torch.exp(x - top) if math.isfinite(top) else torch.zeros_like(x)  # no row on any rank: ESS 1
        s = self.dist.sum(torch.stack([w.sum(), (w * w).sum(), rows.sum().double()]))
        if s[2] == 0:
            return 1.0
        ess = float(s[0] ** 2 / (s[1] * s[2]))
        if not math.isfinite(ess):  # an infinite log-ratio: a sampled token the engine gave probability 0
            raise FloatingPointError(f"the importance ratios' ESS is {ess}: a row's log pi - log mu is not finite "
                                     "(the engine's log-prob of a token it sampled is -inf?)")
        return ess

# ------------------------------------------------------------------------- warm start (SFT)

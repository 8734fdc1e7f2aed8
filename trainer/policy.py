"""The trainable policy: log-prob recompute, the clipped IS-weighted update, the warm start.

Rows are whole episodes: one chat per row, right-padded, the mask on the assistant's tokens.
Inputs may live on any device; they are moved once and results stay on the training device. The loss runs through
freshper.kernels.fused_linear_policy_loss on the decoder's last hidden states and the LM head,
so the (tokens, vocab) logits are never materialised (Triton policy-loss kernel on CUDA).
Micro-batches are weighted so that the accumulated gradient equals that of one big batch under
the chosen aggregation.
"""
from __future__ import annotations

import copy
import math
import random

import torch

from freshper.kernels import fused_linear_policy_loss, token_logprobs

from .config import Config


def _parts(model):
    """(decoder returning hidden states, LM-head weight) of a Hugging Face causal LM."""
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("LM heads with a bias are not supported by the fused loss")
    return model.base_model, head.weight


def row_lengths(mask: torch.Tensor) -> torch.Tensor:
    """(R,) tokens up to and including the last response token of each row."""
    L = mask.shape[1]
    pos = torch.arange(L, device=mask.device).expand_as(mask)
    return torch.where(mask, pos + 1, torch.zeros_like(pos)).max(1).values


def pack(tokens: torch.Tensor, lengths: torch.Tensor):
    """Rows (R, n) with valid lengths (R,) -> (ids (1, N), position_ids (1, N)), N = sum(lengths):
    the padding-free layout flash-attention's varlen path reads from position-id restarts."""
    keep = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]
    pos = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    return tokens[keep][None], pos[keep][None], keep


def unpack(hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(1, N, H) packed hidden states -> (R, n, H), zeros at padding."""
    out = hidden.new_zeros(*keep.shape, hidden.shape[-1])
    out[keep] = hidden[0]
    return out


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


class Policy:
    def __init__(self, model, cfg: Config, device: torch.device, total_steps: int = 1):
        self.model, self.cfg, self.device = model, cfg, device
        # Padding-free (varlen) training forward where the attention honours position-id restarts:
        # flash-attention 2 in transformers. sdpa and eager would attend across packed rows.
        self.packed = getattr(model.config, "_attn_implementation", "") == "flash_attention_2"
        a = cfg.algo
        self.opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(a.lr_schedule, a.warmup_steps, total_steps))
        self.ref_model = None
        if a.kl_coef > 0:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)

    def _hidden(self, decoder, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Last hidden states (R, n, H) of right-padded rows, packed when the attention allows."""
        if self.packed:
            ids, pos, keep = pack(tokens, lengths)
            return unpack(decoder(input_ids=ids, position_ids=pos).last_hidden_state, keep)
        attn = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]
        return decoder(input_ids=tokens, attention_mask=attn.long()).last_hidden_state

    # ------------------------------------------------------------------ log-prob recompute
    @torch.no_grad()
    def logprobs(self, tokens: torch.Tensor, mask: torch.Tensor, model=None) -> torch.Tensor:
        """(R, L) float32 on the training device: log pi(token i | tokens < i) at response
        positions, 0 elsewhere."""
        model = model or self.model
        decoder, head = _parts(model)
        tokens, mask = tokens.to(self.device), mask.to(self.device)
        out = torch.zeros(tokens.shape, dtype=torch.float32, device=self.device)
        lengths = row_lengths(mask)
        for s in range(0, tokens.shape[0], self.cfg.algo.micro_batch):
            sl = slice(s, s + self.cfg.algo.micro_batch)
            n = int(lengths[sl].max())
            if n == 0:
                continue
            tk, mk = tokens[sl, :n].long(), mask[sl, :n]
            hidden = self._hidden(decoder, tk, lengths[sl])[:, :-1]
            sel = mk[:, 1:]
            lp, _ = token_logprobs(hidden[sel], head, tk[:, 1:][sel])
            block = out[sl, 1:n]
            block[sel] = lp
        return out

    # ------------------------------------------------------------------------- the update
    def update(self, tokens, mask, old_logp, adv, weights=None, tis_logp=None) -> dict:
        """One optimizer step on rows (R, L): clipped surrogate with per-row IS `weights` (R,)
        (None: all 1) and token advantages `adv` (R, L). Returns detached scalar stats and two
        estimates (R,) of each row's per-token KL(mu || pi) from this update's own log-probs, means
        over its response tokens with d = logp - old_logp: "row_kl", k3 = e^d - 1 - d (never
        negative; what the metrics and freshper-auto use), and "row_kl1", k1 = -d (unbiased, but
        negative on a row where pi happens to favour the sampled tokens)."""
        a = self.cfg.algo
        dev = self.device
        tokens, mask, old_logp, adv = tokens.to(dev), mask.to(dev), old_logp.to(dev), adv.to(dev)
        weights = None if weights is None else weights.to(dev).float()
        tis_logp = tis_logp.to(dev) if (tis_logp is not None and a.tis_cap > 0) else None
        self.model.train()
        decoder, head = _parts(self.model)
        ref_logp = self.logprobs(tokens, mask, self.ref_model) if self.ref_model is not None else None
        lengths = row_lengths(mask)
        resp = mask[:, 1:]
        total_tok = resp.sum()
        total_seq = resp.any(1).sum()
        self.opt.zero_grad(set_to_none=True)
        sums = torch.zeros(4, dtype=torch.float64, device=dev)  # loss, clip_frac, ratio_mean, kl_mean
        row_kl = torch.zeros(tokens.shape[0], dtype=torch.float32, device=dev)
        row_kl1 = torch.zeros_like(row_kl)
        for s in range(0, tokens.shape[0], a.micro_batch):
            sl = slice(s, s + a.micro_batch)
            n = int(lengths[sl].max())  # the one host sync per micro-batch: the row width
            if n == 0:
                continue
            tk, mk = tokens[sl, :n].long(), mask[sl, :n]
            hidden = self._hidden(decoder, tk, lengths[sl])[:, :-1]
            micro_tok = mk[:, 1:].sum()
            share = (micro_tok / total_tok.clamp_min(1) if a.agg == "token-mean"
                     else mk[:, 1:].any(1).sum() / total_seq.clamp_min(1))
            cut = lambda t: None if t is None else t[sl, 1:n]  # noqa: E731
            loss, st = fused_linear_policy_loss(
                hidden, head, tk[:, 1:], old_logp[sl, 1:n], adv[sl, 1:n], mk[:, 1:],
                None if weights is None else weights[sl],
                clip_low=a.clip_low, clip_high=a.clip_high, agg=a.agg, ref_logp=cut(ref_logp),
                kl_coef=a.kl_coef if ref_logp is not None else 0.0,
                tis_logp=cut(tis_logp), tis_cap=a.tis_cap if tis_logp is not None else None, return_stats=True)
            (loss * share).backward()
            tok_share = micro_tok / total_tok.clamp_min(1)
            sums += torch.stack([loss.detach() * share, st["clip_frac"] * tok_share, st["ratio_mean"] * tok_share,
                                 st["kl_mean"] * tok_share]).double()
            m = mk[:, 1:].float()
            d = (st["logp"] - old_logp[sl, 1:n]).masked_fill(m == 0, 0.0)
            count = m.sum(1).clamp_min(1.0)
            row_kl[sl] = ((torch.expm1(d) - d) * m).sum(1) / count
            row_kl1[sl] = -(d * m).sum(1) / count
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.grad_clip)
        vals = torch.cat([sums, grad_norm.detach().double()[None], total_tok.double()[None]]).tolist()  # one sync
        if not math.isfinite(vals[4]):
            self.opt.zero_grad(set_to_none=True)
            raise FloatingPointError(f"non-finite gradient norm {vals[4]}; lower algo.lr or check inputs")
        self.opt.step()
        self.sched.step()
        return {"loss": vals[0], "clip_frac": vals[1], "ratio_mean": vals[2], "kl_mean": vals[3],
                "grad_norm": vals[4], "tokens": int(vals[5]), "row_kl": row_kl, "row_kl1": row_kl1}

    # --------------------------------------------------------------------- warm start (SFT)
    def warm_start(self, tokenizer, make_env, steps: int, lr: float, seed: int, max_words: int, max_len: int,
                   batch: int = 16) -> list[float]:
        """Supervised steps on whole episodes (chats, as the rollout builds them) whose replies are
        uniformly random actions in the answer format. A random-initialised model cannot emit
        the format at all; this teaches the format only, not the task (the actions are random)."""
        if steps == 0:
            return []
        from .chat import Episode

        rng = random.Random(seed + 7919)
        opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.model.train()
        env = make_env()
        losses = []
        for _ in range(steps):
            rows = []
            for _ in range(batch):
                ep = Episode(tokenizer, env.opening(env.reset(rng.randrange(2**31)), max_words))
                while not env.done:
                    reply = tokenizer(env.random_reply(rng), add_special_tokens=False)
                    r = env.step(ep.add_reply(reply["input_ids"] + [tokenizer.eos_token_id], []))
                    if not r.done and not ep.add_user(env.feedback(r, max_words), limit=max_len - max_words):
                        break
                rows.append(ep)
            width = max(len(ep) for ep in rows)
            ids = torch.full((batch, width), tokenizer.pad_token_id, dtype=torch.long)
            labels = torch.full((batch, width), -100, dtype=torch.long)
            attn = torch.zeros((batch, width), dtype=torch.long)
            for i, ep in enumerate(rows):
                t = torch.tensor(ep.ids)
                ids[i, :len(ep)] = t
                labels[i, :len(ep)] = torch.where(torch.tensor(ep.mask), t, -100)
                attn[i, :len(ep)] = 1
            out = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                             labels=labels.to(self.device))
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            opt.step()
            losses.append(float(out.loss.detach()))
        return losses

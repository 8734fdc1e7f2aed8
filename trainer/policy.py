"""The trainable policy: log-prob recompute, the clipped IS-weighted update, the warm start.

Rows are single turns: a prompt followed by the response, right-padded. The loss runs through
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


class Policy:
    def __init__(self, model, cfg: Config, device: torch.device):
        self.model, self.cfg, self.device = model, cfg, device
        # Padding-free (varlen) training forward where the attention honours position-id restarts:
        # flash-attention 2 in transformers. sdpa and eager would attend across packed rows.
        self.packed = getattr(model.config, "_attn_implementation", "") == "flash_attention_2"
        a = cfg.algo
        self.opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / max(1, a.warmup)))
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
        """(R, L) float32: log pi(token i | tokens < i) at response positions, 0 elsewhere."""
        model = model or self.model
        decoder, head = _parts(model)
        out = torch.zeros(tokens.shape, dtype=torch.float32)
        for s in range(0, tokens.shape[0], self.cfg.algo.micro_batch):
            tk, mk = tokens[s:s + self.cfg.algo.micro_batch], mask[s:s + self.cfg.algo.micro_batch]
            n = int(row_lengths(mk).max())
            tk, mk = tk[:, :n].to(self.device), mk[:, :n].to(self.device)
            hidden = self._hidden(decoder, tk, row_lengths(mk))[:, :-1]
            sel = mk[:, 1:]
            lp, _ = token_logprobs(hidden[sel], head, tk[:, 1:][sel])
            block = torch.zeros(tk.shape[0], n - 1, dtype=torch.float32, device=self.device)
            block[sel] = lp
            out[s:s + tk.shape[0], 1:n] = block.cpu()
        return out

    # ------------------------------------------------------------------------- the update
    def update(self, tokens, mask, old_logp, adv, weights=None, tis_logp=None) -> dict:
        """One optimizer step on rows (R, L): clipped surrogate with per-row IS `weights` (R,)
        and advantages `adv` (R,). Returns detached scalar stats."""
        a = self.cfg.algo
        self.model.train()
        decoder, head = _parts(self.model)
        ref_logp = self.logprobs(tokens, mask, self.ref_model) if self.ref_model is not None else None
        lengths = row_lengths(mask)
        active = lengths > 0
        total_tok = int(mask[:, 1:].sum())
        total_seq = int(mask[:, 1:].any(1).sum())
        self.opt.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "clip_frac": 0.0, "ratio_mean": 0.0, "kl_mean": 0.0}
        for s in range(0, tokens.shape[0], a.micro_batch):
            sl = slice(s, s + a.micro_batch)
            if not bool(active[sl].any()):
                continue
            n = int(lengths[sl].max())
            tk, mk = tokens[sl, :n].to(self.device), mask[sl, :n].to(self.device)
            hidden = self._hidden(decoder, tk, lengths[sl].to(self.device))[:, :-1]
            micro_tok = int(mk[:, 1:].sum())
            micro_seq = int(mk[:, 1:].any(1).sum())
            share = micro_tok / max(total_tok, 1) if a.agg == "token-mean" else micro_seq / max(total_seq, 1)
            opt = lambda t: None if t is None else t[sl, 1:n].to(self.device)  # noqa: E731
            loss, st = fused_linear_policy_loss(
                hidden, head, tk[:, 1:], old_logp[sl, 1:n].to(self.device), adv[sl].to(self.device), mk[:, 1:],
                None if weights is None else weights[sl].to(self.device).float(),
                clip_low=a.clip_low, clip_high=a.clip_high, agg=a.agg, ref_logp=opt(ref_logp),
                kl_coef=a.kl_coef if ref_logp is not None else 0.0,
                tis_logp=opt(tis_logp) if a.tis_cap > 0 else None, tis_cap=a.tis_cap if a.tis_cap > 0 else None,
                return_stats=True)
            (loss * share).backward()
            sums["loss"] += float(loss.detach()) * share
            for k in ("clip_frac", "ratio_mean", "kl_mean"):
                sums[k] += float(st[k]) * micro_tok / max(total_tok, 1)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.grad_clip)
        if not math.isfinite(float(grad_norm)):
            self.opt.zero_grad(set_to_none=True)
            raise FloatingPointError(f"non-finite gradient norm {float(grad_norm)}; lower algo.lr or check inputs")
        self.opt.step()
        self.sched.step()
        return {**sums, "grad_norm": float(grad_norm), "tokens": total_tok}

    # --------------------------------------------------------------------- warm start (SFT)
    def warm_start(self, tokenizer, make_env, steps: int, lr: float, seed: int, batch: int = 32) -> list[float]:
        """Supervised steps on prompts of random states answered by a uniformly random action in
        the answer format. A random-initialised model cannot emit the format at all; this
        teaches the format only, not the task (the actions are random)."""
        if steps == 0:
            return []
        rng = random.Random(seed + 7919)
        opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.model.train()
        env = make_env()
        losses = []
        for _ in range(steps):
            rows = []
            for _ in range(batch):
                env.reset(rng.randrange(2**31))
                for _ in range(rng.randrange(env.max_turns)):  # later turns too, not only the first
                    env.step(f"<answer>{rng.choice(env.actions)}</answer>")
                    if env.done:
                        env.reset(rng.randrange(2**31))
                        break
                p = tokenizer(env.prompt(), add_special_tokens=False)["input_ids"]
                r = tokenizer(f"<answer>{rng.choice(env.actions)}</answer>", add_special_tokens=False)["input_ids"]
                rows.append((p, r))
            width = max(len(p) + len(r) for p, r in rows)
            ids = torch.full((batch, width), tokenizer.pad_token_id, dtype=torch.long)
            labels = torch.full((batch, width), -100, dtype=torch.long)
            attn = torch.zeros((batch, width), dtype=torch.long)
            for i, (p, r) in enumerate(rows):
                ids[i, :len(p) + len(r)] = torch.tensor(p + r)
                labels[i, len(p):len(p) + len(r)] = torch.tensor(r)
                attn[i, :len(p) + len(r)] = 1
            out = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                             labels=labels.to(self.device))
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            opt.step()
            losses.append(float(out.loss.detach()))
        return losses

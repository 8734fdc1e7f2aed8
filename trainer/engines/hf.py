"""Generation with transformers' `generate` on the training model itself.

The engine holds the very module the optimizer updates, so weight sync is free; on several
ranks, where that module is sharded, it holds a whole copy that sync_weights refreshes. The recorded
log-probs are those of the sampling distribution after temperature, top-k and top-p (the
processed scores of each step): the behaviour policy the replay ratio needs.
"""
from __future__ import annotations

import torch
from transformers import GenerationConfig

from ..model.cache_name import cache_kwarg, output_cache
from ..model.load import full_attention, stop_token_ids
from ..model.precision import autocast, float32_logits
from .base import Engine, Generation, Sampling, cut_at_stop
from .gqa_sdpa import gqa_sdpa
from .kv_room import room_cache
from .turn_cache import TurnCache


class HFEngine(Engine):
    name = "hf"

    def __init__(self, model, tokenizer, share_prefix: bool = True, turn_cache: bool = True, kv_room: bool = True,
                 gqa: bool = True, logits32: bool = True):
        """`share_prefix`: prefill each distinct prompt of a batch once (a GRPO group's rows
        repeat one prompt) and start every row's generation from its prompt's cache.
        `turn_cache`: keep each episode's key/value cache between its turns (generate's `keys`),
        so a turn prefills only its new tokens (turn_cache.py); text models with full attention.
        `kv_room`: a cache that decodes into room allocated ahead instead of copying itself at
        every token (kv_room.py); text models with full attention. `gqa`: on CPU, attention on the
        key/value heads as they are, not expanded to every query head (gqa_sdpa.py). `logits32`: under a
        bf16 compute dtype, sample from and record float32 logits (precision.float32_logits), as
        the trainer computes them under `model.logits_dtype float32`."""
        self.model = model
        self.tok = tokenizer
        self.stops = stop_token_ids(tokenizer)
        self.share_prefix = share_prefix
        self.text = getattr(model.config, "vision_config", None) is None
        plain = self.text and full_attention(model.config)  # what the turn and room caches need
        self.turns = TurnCache() if turn_cache and plain else None
        self.room = kv_room and plain
        self.gqa = gqa
        self.logits32 = logits32

    def release(self, keys) -> None:
        if self.turns is not None:
            self.turns.release(keys)

    def _prompt_cache(self, ids: torch.Tensor, attn: torch.Tensor, device):
        """A key/value cache of every row's prompt but its last token (left-padded ids, attn
        (R, W)), each distinct prompt computed once and indexed out to its rows, at the
        positions generate gives them (attention-mask cumsum); None where no two rows share a
        prompt. generate then runs only the last prompt token and the reply on top of it."""
        from ..model.prefix import prefix_groups

        # keyed on ids and mask together: the pad id can be a real token, so ids alone could
        # match a shorter prompt to a longer one that starts with that token
        first, group = prefix_groups(torch.cat([ids, attn], 1), torch.full((ids.shape[0],), 2 * ids.shape[1]))
        if len(first) == ids.shape[0] or ids.shape[1] < 2:
            return None
        pos = (attn.cumsum(-1) - 1).masked_fill(attn == 0, 0)
        out = self.model.base_model(input_ids=ids[first, :-1].to(device), attention_mask=attn[first, :-1].to(device),
                                    position_ids=pos[first, :-1].to(device), use_cache=True)
        cache = output_cache(out)
        cache.batch_select_indices(group.to(device))
        return cache

    def _with_room(self, data: list | None, room: int):
        """`data` (per layer (keys, values), or a Cache) as a cache with `room` free positions, or as
        transformers' own cache where kv_room is off; None stays None without kv_room."""
        if data is not None and not isinstance(data, list):
            data = [(layer.keys, layer.values) for layer in data.layers]
        if not self.room:
            if data is None:
                return None
            from transformers import DynamicCache

            return DynamicCache(ddp_cache_data=data)
        return room_cache(self.model.config.get_text_config(decoder=True).num_hidden_layers, room, data)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, sampling: Sampling,
                 stop: tuple[str, ...] = (), images: list | None = None, keys: list | None = None) -> Generation:
        """`stop`: strings that end a reply (after the token completing one). `images`: for a
        VLM, one trainer.vision.VisionInputs per prompt (its pixels and grids; the prompt's ids
        already hold the image placeholders). `keys`: one hashable per prompt naming its episode;
        the episode's cache is kept for its next turn until `release`."""
        if not prompts:
            return Generation([], [])
        device = next(self.model.parameters()).device
        pad = self.tok.pad_token_id
        turns = self.turns if keys is not None and not images else None
        cached = turns.cached_lengths(prompts, keys) if turns is not None else [0] * len(prompts)
        extra = {}  # generate's other inputs: a VLM's images, or the cached keys/values
        if any(cached):  # later turns: each row's cached conversation, then its new tokens
            ids, attn, layers = turns.batch(prompts, keys, cached, pad)
            held = layers[0][0].shape[2]
            extra = {cache_kwarg(self.model): self._with_room(layers, ids.shape[1] - held + max_new_tokens)}
            del layers  # the cache holds its own copy: drop this one before generating
        else:
            width = max(len(p) for p in prompts)
            ids = torch.full((len(prompts), width), pad, dtype=torch.long)
            attn = torch.zeros((len(prompts), width), dtype=torch.long)
            for i, p in enumerate(prompts):  # left padding: every prompt ends where generation starts
                ids[i, width - len(p):] = torch.tensor(p)
                attn[i, width - len(p):] = 1
        width = ids.shape[1]
        was_training = self.model.training
        self.model.eval()
        # A fresh GenerationConfig: a hub model's own defaults (top-k, top-p, repetition penalty)
        # would make the sampling distribution differ from the logits we record.
        s = sampling
        kw = dict(do_sample=False) if s.greedy else dict(do_sample=True, temperature=s.temperature, top_k=s.top_k,
                                                          top_p=s.top_p)
        if images:  # a reply holding an image placeholder would claim image features it has none of
            from ..model.vision import suppressed_ids

            kw["suppress_tokens"] = suppressed_ids(self.tok)
        gen_cfg = GenerationConfig(**kw, repetition_penalty=1.0, max_new_tokens=max_new_tokens,
                                   eos_token_id=self.stops, pad_token_id=pad, output_scores=True,
                                   return_dict_in_generate=True)
        if images:
            # M-RoPE numbers image tokens by mm_token_type_ids; without it generate treats them as text
            with_px = [v for v in images if v.pixel_values.numel()]
            if with_px:
                extra = {"pixel_values": torch.cat([v.pixel_values for v in with_px]).to(device),
                         "image_grid_thw": torch.cat([v.image_grid_thw for v in with_px]).to(device),
                         "mm_token_type_ids": images[0].mm_token_type_ids(ids).to(device)}
        elif not extra and self.text:  # first turns: the shared prompts' cache, or an empty one with room
            with gqa_sdpa(self.model, self.gqa), autocast(self.model):
                cache = self._prompt_cache(ids, attn, device) if self.share_prefix else None
            # the prompt cache holds all but each prompt's last token, which generate runs first;
            # an empty cache's first append is the whole prompt
            cache = self._with_room(cache, max_new_tokens if cache is None else 1 + max_new_tokens)
            if cache is not None:
                extra = {cache_kwarg(self.model): cache}
        with gqa_sdpa(self.model, self.gqa), autocast(self.model), float32_logits(self.model, self.logits32):
            out = self.model.generate(input_ids=ids.to(device), attention_mask=attn.to(device),
                                      generation_config=gen_cfg, **extra)
        self.model.train(was_training)
        new_dev = out.sequences[:, width:]
        # One step at a time on the device, keeping only the sampled token's log-prob: never a
        # (B, steps, V) float copy, which at V = 152k is gigabytes.
        logp = torch.stack([torch.log_softmax(step.float(), -1).gather(-1, new_dev[:, j, None])[:, 0]
                            for j, step in enumerate(out.scores)], 1).cpu()
        new = new_dev.cpu()
        token_ids, logprobs = [], []
        for i in range(len(prompts)):
            row = new[i].tolist()
            n = len(row)
            for j, t in enumerate(row):
                if t in self.stops:
                    n = j + 1
                    break
            # Cut here, not by generate's stop_strings: those also match across the prompt's end, where a
            # reply's own text is what counts (as in vLLM); rows run on until every row stops
            n = cut_at_stop(self.tok, row[:n], stop)
            token_ids.append(row[:n])
            logprobs.append(logp[i, :n].tolist())
        if turns is not None:
            turns.keep(output_cache(out), attn, prompts, token_ids, keys)
        return Generation(token_ids, logprobs)

    @torch.no_grad()
    def sync_weights(self, model) -> float:
        """Free when the engine holds the training model itself (one process). On several ranks
        it holds a whole copy (the training model is sharded): each tensor is gathered in turn
        and copied in (a collective: every rank calls this)."""
        import time

        if model is self.model:
            return 0.0
        from ..model.sharding import full_tensors

        t0 = time.perf_counter()
        own = self.model.state_dict()
        names = set()
        for name, t in full_tensors(model):
            if name not in own:
                raise ValueError(f"HFEngine.sync_weights: {name!r} is not in the engine's model")
            own[name].copy_(t)
            names.add(name)
        if names != set(own):
            raise ValueError(f"HFEngine.sync_weights: the training model lacks {sorted(set(own) - names)[:3]}")
        return time.perf_counter() - t0

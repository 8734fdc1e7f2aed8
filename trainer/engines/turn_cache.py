"""The key/value cache of each multi-turn episode, kept between its turns.

A game episode is one growing token sequence: turn t's prompt is turn t-1's prompt, the reply,
and the next user message. Prefilling it whole at every turn reads the first prompt once per
turn. Here the HF engine keeps, per episode (its `key`), the keys and values of every token it
has already run, and a turn prefills only what is new: the reply's last token (sampled, never
fed back) and the user message after it.

The rows of one generate call have cached prefixes of different lengths. They are laid out as

    [pad .. pad | cached tokens of row i | pad .. pad | new tokens of row i | reply ...]
     <------------- Cmax ---------------> <------------ Nmax ------------->

with the attention mask 0 on every pad. Positions are the mask's cumulative sum (as generate
computes them), so the holes change no token's position and the cached keys, whose rotary
embedding was applied at those same positions, stay valid. After generate, each row's real
tokens are gathered out of the batch cache (an index, so the big batch cache can be freed), up
to its reply but for the last token.

Plain full-attention layers only: a sliding-window layer keeps only its last W positions, so
the holes would shift its window. Equality with the whole re-prefill is tested in
tests/trainer/engines/test_turn_cache.py (greedy replies equal, log-probs within float32's error).
"""
from __future__ import annotations

import torch


class TurnCache:
    """Per episode key: (token ids whose keys/values are cached, per layer (keys, values) of shape
    (heads, len(ids), head_dim)). Memory: 2 x layers x kv_heads x head_dim x dtype bytes per
    token; 46 KB a token for SmolLM2-135M in float32."""

    def __init__(self):
        self.kept: dict = {}

    def __len__(self) -> int:
        return len(self.kept)

    def tokens(self) -> int:
        """Tokens held over all episodes."""
        return sum(len(ids) for ids, _ in self.kept.values())

    def release(self, keys) -> None:
        """Free the caches of `keys` (episodes that ended); unknown keys are ignored."""
        for k in keys:
            self.kept.pop(k, None)

    def cached_lengths(self, prompts: list[list[int]], keys: list) -> list[int]:
        """Per prompt, how many of its leading tokens are cached: the key's cached ids when the
        prompt extends them by at least one token, else 0 (a new episode, or a prompt that does not
        continue what was cached, which is then dropped)."""
        out = []
        for p, k in zip(prompts, keys):
            held = self.kept.get(k)
            if held is not None and len(p) > len(held[0]) and p[:len(held[0])] == held[0]:
                out.append(len(held[0]))
            else:
                self.kept.pop(k, None)
                out.append(0)
        return out

    def batch(self, prompts: list[list[int]], keys: list, cached: list[int], pad: int):
        """The generate inputs of rows with cached prefixes: ids and attention mask (R, Cmax + Nmax)
        int64 in the layout above, and the batch's per-layer (keys, values) (R, heads, Cmax, dim).
        Each row's own cache is handed over to the batch (not copied beside it), so a turn holds
        the conversation's keys once, not twice."""
        R, cmax = len(prompts), max(cached)
        nmax = max(len(p) - c for p, c in zip(prompts, cached))
        ids = torch.full((R, cmax + nmax), pad, dtype=torch.long)
        attn = torch.zeros((R, cmax + nmax), dtype=torch.long)
        some = next(self.kept[k][1] for k, c in zip(keys, cached) if c)
        layers = [(k.new_zeros((R, k.shape[0], cmax, k.shape[2])), v.new_zeros((R, v.shape[0], cmax, v.shape[2])))
                  for k, v in some]
        for i, (p, key, c) in enumerate(zip(prompts, keys, cached)):
            new = p[c:]
            ids[i, cmax - c:cmax] = torch.tensor(p[:c], dtype=torch.long)
            attn[i, cmax - c:cmax] = 1
            ids[i, cmax + nmax - len(new):] = torch.tensor(new, dtype=torch.long)
            attn[i, cmax + nmax - len(new):] = 1
            if c:
                for (K, V), (k, v) in zip(layers, self.kept.pop(key)[1]):  # keep() stores it anew
                    K[i, :, cmax - c:] = k
                    V[i, :, cmax - c:] = v
        return ids, attn, layers

    def keep(self, cache, attn: torch.Tensor, prompts: list[list[int]], replies: list[list[int]], keys: list) -> None:
        """After generate: store each row's keys/values of its prompt and its reply but the last
        token, gathered from the batch `cache` (a transformers Cache whose first attn.shape[1]
        positions are the inputs, laid out with the mask `attn` (R, W), then the generated tokens)."""
        W = attn.shape[1]
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        for i, (p, reply, key) in enumerate(zip(prompts, replies, keys)):
            n = max(len(reply) - 1, 0)
            idx = torch.cat([attn[i].nonzero()[:, 0], W + torch.arange(n)]).to(layers[0][0].device)
            self.kept[key] = (p + reply[:n], [(k[i].index_select(1, idx), v[i].index_select(1, idx))
                                              for k, v in layers])

"""The shared-prompt forward: each distinct prompt of a micro-batch runs through the decoder once.

A GRPO group is G replies to one prompt, and the padded training forward runs that prompt G
times; with SmolLM2's chat template the prompt is most of each row (56 of ~80 tokens in the
math jobs). Here each row is split where its reply begins. The distinct prefixes (compared by
content, so the same problem drawn in two iterations, or replayed beside a fresh group, shares
too) run once and leave a key/value cache; the cache is gathered out to the rows, and the rows'
suffixes run on top of it at their own positions. The gather is an index, so backward sums
every row's gradient into its prefix: the same math as the padded forward, with the prompt's
FLOPs divided by the rows that share it.

Not bit-equal to the padded forward: the matmuls have other shapes, so float32 rounds
differently (tests/trainer/model/test_prefix.py bounds the difference by float32's own error against a
float64 forward). Used for text rows in the padded (sdpa / eager) layout; rows with images and
flash-attention's packed rows run as before.
"""
from __future__ import annotations

import torch

from .cache_name import cache_kwarg, output_cache


def reply_starts(mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(R,) int64: where each row's shareable prefix ends, i.e. its first response token (mask
    (R, L) bool, lengths (R,) valid tokens). A row without response tokens is all prefix. At
    least 1, so that every row has a prefix token to attend to."""
    L = mask.shape[1]
    pos = torch.arange(L, device=mask.device).expand_as(mask)
    first = torch.where(mask, pos, torch.full_like(pos, L)).min(1).values
    return torch.minimum(first, lengths).clamp_min(1)


def prefix_groups(tokens: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows with identical tokens before their start share a prefix. Returns (first (G,): the
    first row of each distinct prefix, group (R,): each row's index into `first`), int64 on
    tokens' device. One host transfer of the rows' prefixes."""
    rows, cut = tokens.tolist(), starts.tolist()
    index: dict[tuple[int, ...], int] = {}
    first, group = [], []
    for r, (row, p) in enumerate(zip(rows, cut)):
        key = tuple(row[:p])
        if key not in index:
            index[key] = len(first)
            first.append(r)
        group.append(index[key])
    as_long = lambda v: torch.tensor(v, dtype=torch.long, device=tokens.device)  # noqa: E731
    return as_long(first), as_long(group)


def share_order(tokens: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(R,) int64: an order of the rows in which rows with the same prefix (tokens before
    `starts`) stand side by side, longest first, and prefixes follow each other by their longest
    row. Micro-batches cut from it share their prompts (a GRPO group, or a replayed episode
    beside its group-mates) and hold rows of similar lengths, so they pad little. The order is
    stable: rows already in it keep their places."""
    first, group = prefix_groups(tokens, starts)
    ln = lengths.tolist()
    blocks: list[list[int]] = [[] for _ in range(len(first))]
    for r, g in enumerate(group.tolist()):
        blocks[g].append(r)
    ordered = sorted((sorted(b, key=lambda r: -ln[r]) for b in blocks), key=lambda b: -ln[b[0]])
    return torch.tensor([r for b in ordered for r in b], dtype=torch.long, device=tokens.device)


def shared_prefix_hidden(decoder, tokens: torch.Tensor, lengths: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden states (R, n, H) of right-padded rows `tokens` (R, n) int64 with
    `lengths` (R,) valid tokens, computed with each distinct prefix tokens[r, :starts[r]] run once
    (`starts` (R,) in [1, n], e.g. reply_starts). `decoder` is a Hugging Face base model (LlamaModel,
    Qwen2Model, ...) that takes a key/value cache. Positions past a row's length hold values of no
    meaning, as in the padded forward."""
    R, n = tokens.shape
    dev = tokens.device
    starts = torch.minimum(starts, torch.full_like(starts, n))
    first, group = prefix_groups(tokens, starts)
    plen = starts[first]
    P = int(plen.max())
    ar = torch.arange(n + P, device=dev)
    pre_valid = ar[None, :P] < plen[:, None]  # (G, P): prefixes of other lengths are right-padded
    pre = decoder(input_ids=tokens[first, :P], attention_mask=pre_valid.long(), use_cache=True)
    pre_hidden = pre.last_hidden_state[group]  # (R, P, H)
    tail = (lengths - starts).clamp_min(0)
    S = int(tail.max())
    if S == 0:
        hidden = pre_hidden
    else:
        cache = output_cache(pre)
        cache.batch_select_indices(group)  # (G, ...) -> (R, ...), an index: differentiable
        # each suffix at its row's own positions; a padded slot past the row's end takes the row's
        # last position (it is masked), so a model with a table of learned positions never indexes
        # past it (the padded rows' slots would reach P + S - 1)
        pos = torch.minimum(starts[:, None] + ar[None, :S], (lengths - 1).clamp_min(0)[:, None])
        suf_valid = ar[None, :S] < tail[:, None]
        suf_ids = tokens.gather(1, pos.clamp_max(n - 1))
        # the 2-D mask covers cache then suffix; causality comes from the cache's length, so a
        # shorter prefix's padding slots are masked and never attended to
        suf = decoder(input_ids=suf_ids, attention_mask=torch.cat([pre_valid[group], suf_valid], 1).long(),
                      position_ids=pos, use_cache=True, **{cache_kwarg(decoder): cache})
        hidden = torch.cat([pre_hidden, suf.last_hidden_state], 1)  # (R, P + S, H)
    # row r's position t is prefix slot t before its start, suffix slot P + t - start after it
    t = ar[None, :n].expand(R, n)
    src = torch.where(t < starts[:, None], t, P + t - starts[:, None]).clamp_max(hidden.shape[1] - 1)
    return hidden.gather(1, src[..., None].expand(R, n, hidden.shape[-1]))

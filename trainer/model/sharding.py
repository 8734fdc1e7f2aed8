"""The policy as one module whose forward runs decoder *and* loss, sharded with FSDP2 on several ranks.

The fused policy loss reads the LM head's weight next to the decoder's hidden states, outside
any Hugging Face forward. Under FSDP2 a parameter is gathered only inside the forward of the
module that owns it, so `PolicyNet.forward` runs both the decoder and a caller's function of
(hidden states, head weight): the root unit (embeddings, final norm, head, tied or not) is
gathered for exactly that span and its gradient is reduce-scattered after backward. The same
module runs on one process, unsharded, so there is one code path.

`shard` puts each decoder layer in its own FSDP unit (gathered one at a time) and the rest in
the root: bf16 compute with float32 master shards and float32 gradient reduction when asked.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .precision import autocast, compute_dtype
from .prefix import shared_prefix_hidden


def _parts(model):
    """(decoder returning hidden states, LM-head weight) of a Hugging Face causal LM."""
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("LM heads with a bias are not supported by the fused loss")
    return model.base_model, head.weight


def pack(tokens: torch.Tensor, lengths: torch.Tensor):
    """Rows (R, n) with valid lengths (R,) -> (ids (1, N), position_ids (1, N), keep (R, n) bool),
    N = sum(lengths): the padding-free layout flash-attention's varlen path reads from position-id
    restarts, and the mask of the kept positions that unpack() scatters back with."""
    keep = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]
    pos = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    return tokens[keep][None], pos[keep][None], keep


def unpack(hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(1, N, H) packed hidden states -> (R, n, H), zeros at padding."""
    out = hidden.new_zeros(*keep.shape, hidden.shape[-1])
    out[keep] = hidden[0]
    return out


class PolicyNet(nn.Module):
    """A causal LM under one forward: hidden states of right-padded rows, then `fn(hidden, head)`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        _parts(model)  # refuses a head with a bias now, not at the first update
        # Padding-free (varlen) forward where the attention honours position-id restarts:
        # flash-attention 2 in transformers. sdpa and eager would attend across packed rows.
        self.packed = getattr(model.config, "_attn_implementation", "") == "flash_attention_2"
        # one process: forwards under autocast in the compute dtype over float32 masters
        # (trainer/model/precision.py); shard() turns it off, FSDP2 casting the weights instead
        self.use_autocast = True

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, fn: Callable, starts: torch.Tensor | None = None,
                **vision):
        """tokens (R, n) int64, lengths (R,) valid tokens per row; returns fn(hidden (R, n - 1, H)
        at the positions that predict tokens 1..n-1, head weight (V, H)). `starts` (R,): where
        each row's reply begins, to run each distinct prompt once (trainer/model/prefix.py; padded text
        rows only; None: every row whole). `vision`: a VLM's pixel_values, image_grid_thw and
        mm_token_type_ids for these rows (trainer/model/vision.py); rows with images run padded, not
        packed."""
        decoder, head = _parts(self.model)
        with autocast(self.model, self.use_autocast):
            if starts is not None and not vision and not self.packed:
                hidden = shared_prefix_hidden(decoder, tokens, lengths, starts)
            elif self.packed and not vision:
                ids, pos, keep = pack(tokens, lengths)
                hidden = unpack(decoder(input_ids=ids, position_ids=pos).last_hidden_state, keep)
            else:
                attn = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]
                hidden = decoder(input_ids=tokens, attention_mask=attn.long(), **vision).last_hidden_state
        # the loss outside autocast, on hidden states and head in the compute dtype, as under FSDP2:
        # autocast would also run in bf16 the matmuls a loss means to run in float32
        dtype = compute_dtype(self.model) if self.use_autocast else None
        if dtype is not None:
            return fn(hidden[:, :-1].to(dtype), head.to(dtype))
        return fn(hidden[:, :-1], head)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a Hugging Face decoder (the units FSDP gathers one at a time)."""
    for path in ("model.layers", "model.language_model.layers", "transformer.h", "gpt_neox.layers",
                 "model.decoder.layers"):
        m = model
        for name in path.split("."):
            m = getattr(m, name, None)
        if isinstance(m, nn.ModuleList):
            return list(m)
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__} to shard; expected model.layers "
                     "(Llama, Qwen, Mistral), model.language_model.layers (Qwen2-VL) or transformer.h (GPT-2)")


def shard(net: PolicyNet, dtype: torch.dtype | None, mesh=None) -> PolicyNet:
    """FSDP2 over the default process group: each decoder layer one unit, the root the rest.
    `dtype`: compute dtype (bf16 on GPUs) with float32 master shards and reductions; None keeps
    the parameters' own dtype. Gradients are summed over ranks, not averaged: the loss is
    already normalised by the global token count (trainer/model/policy.py)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    net.use_autocast = False
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype is not None \
        else MixedPrecisionPolicy()
    for layer in decoder_layers(net.model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(net, mesh=mesh, mp_policy=mp)
    for m in net.modules():
        if hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(1.0)
            # plain SUM collectives: no pre-multiplied sum, which gloo (CPU) does not have
            m.set_force_sum_reduction_for_comms(True)
    return net


@torch.no_grad()
def broadcast_weights(model: nn.Module) -> None:
    """Rank 0's weights on every rank, before sharding: fully_shard keeps each rank's own copy
    of its shard, and a warm start on GPUs need not end bit-identical on every rank."""
    import torch.distributed as dist

    for t in model.state_dict().values():
        dist.broadcast(t, src=0)


def full_tensors(model: nn.Module, skip=()):
    """(name, full tensor) for each entry of `model`'s state dict, one gathered at a time: the
    whole model never sits unsharded on a rank, only the largest single tensor. Collective
    under FSDP: every rank must consume the iterator to the end."""
    from .lora import merged_tensors, whole_tensor

    whole = ((name, whole_tensor(t)) for name, t in model.state_dict().items())
    for name, t in merged_tensors(model, whole):  # LoRA: the adapters merged, under the base's names
        if name not in skip:
            yield name, t

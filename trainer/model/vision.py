"""Vision-language building blocks: a tiny Qwen2-VL / Qwen2.5-VL built offline, images into model
inputs (placeholders expanded, per-row pixels for any slice of a batch), images kept as PNG bytes
(the replay buffer's form: lossless and ~1% of the pixels' size), and boards drawn as pictures
(the FrozenLake-VLM and Sokoban-VLM observations).

No torchvision is needed: images are processed by transformers' PIL image processor for Qwen2-VL
(`Qwen2VLImageProcessorPil`, the same patches and grids as the torchvision one), and prompts are
expanded here (one <|image_pad|> per merged patch between <|vision_start|> and <|vision_end|>),
which is what the Qwen2-VL processor does; its video half is what imports torchvision.

Multimodal rotary positions (M-RoPE) follow `mm_token_type_ids` (0 text, 1 image): every forward
and every `generate` must receive it. transformers' `generate` without it silently numbers the
image tokens as text: the log-probs it samples with then differ from a training forward's by
~2e-3 on the tiny model, where with it they agree to 5e-7 (tests/trainer/model/test_vision.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from freshper.images import from_png, to_png

from ..envs.prompts import IMAGE

VISION_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# An image in a message's text, as Qwen2-VL's chat template renders one: a single <|image_pad|>
# that the tokenised prompt then expands to one pad per merged patch (`expand_ids`).
IMAGE_MIN_PIXELS, IMAGE_MAX_PIXELS = 56 * 56, 112 * 112  # the tiny model's processor limits


def suppressed_ids(tokenizer) -> list[int]:
    """The vision special tokens a VLM's replies never hold: generation suppresses them (a
    reply's <|image_pad|> would claim image features that do not exist), and the trainer's
    softmax leaves them out to match."""
    ids = tokenizer.convert_tokens_to_ids(VISION_SPECIALS)
    return sorted({i for i in ids if i is not None and i != tokenizer.unk_token_id})


@dataclass
class VisionInputs:
    """A token row with its images, as a Qwen2-VL forward takes them."""

    input_ids: list[int]
    pixel_values: torch.Tensor  # (patches, C * temporal * patch * patch) float32
    image_grid_thw: torch.Tensor  # (images, 3) int64
    image_token_id: int
    pngs: tuple = ()  # the images as PNG bytes, in placeholder order (what an engine that processes
    # images itself, vLLM, is given)

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
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    if images:
        pixels, grids, counts = process(processor, images)
    else:
        pixels, grids, counts = torch.zeros(0, 3 * 2 * 14 * 14), torch.zeros(0, 3, dtype=torch.long), []
    ids = expand_ids(tokenizer(IMAGE.join(text_parts), add_special_tokens=False)["input_ids"], pad, counts)
    return VisionInputs(ids, pixels, grids, pad, tuple(to_png(im) for im in images))


def collapse_pads(ids: list[int], pad: int) -> list[int]:
    """The inverse of expand_ids: each run of `pad` tokens as one (the form vLLM's Qwen2-VL
    processor expands itself; given expanded runs it would expand each pad again)."""
    return [t for i, t in enumerate(ids) if t != pad or i == 0 or ids[i - 1] != pad]


def resized(processor, image):
    """`image` (PIL) resized as `processor` resizes it (Qwen2-VL's smart resize to multiples of
    patch x merge pixels within its pixel limits, with its resampling filter) by PIL. An engine
    that processes images with another implementation (vLLM: transformers' torchvision processor,
    whose resize differs from PIL's by up to 0.015 in normalised pixel values) then receives a
    picture it need not resize, and its pixels equal the trainer's (to 2e-7)."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize  # no torchvision

    limits = getattr(processor, "size", None)
    lo = getattr(processor, "min_pixels", None) or limits.shortest_edge
    hi = getattr(processor, "max_pixels", None) or limits.longest_edge
    h, w = smart_resize(image.height, image.width, factor=processor.patch_size * processor.merge_size,
                        min_pixels=lo, max_pixels=hi)
    image = image.convert("RGB")
    return image if (w, h) == image.size else image.resize((w, h), resample=Image.Resampling(processor.resample))


def process(processor, images: list) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(pixel_values (patches, D) float32, image_grid_thw (n, 3) int64, placeholder tokens per image)."""
    check_images(processor, images)
    px = processor(images=[im.convert("RGB") for im in images], return_tensors="pt")
    grids = px["image_grid_thw"].long()
    merge = processor.merge_size ** 2
    return px["pixel_values"].float(), grids, [int(g.prod()) // merge for g in grids]


def check_images(processor, images: list) -> None:
    """ValueError naming the first image that is not a PIL image or is far past the processor's size."""
    from PIL import Image

    limit = getattr(processor, "max_pixels", None) or processor.size.longest_edge
    for i, im in enumerate(images):
        if not isinstance(im, Image.Image):
            raise ValueError(f"image {i} is a {type(im).__name__}, not a PIL image")
        if im.width * im.height > 64 * limit:  # far past what the resize is for: a wrong input, not a big board
            raise ValueError(f"image {i} is {im.width}x{im.height}, over 64 x the processor's max_pixels "
                             f"({limit}); resize it first")


def expand_ids(ids: list[int], pad: int, counts: list[int]) -> list[int]:
    """Token ids with the k-th single `pad` (an <|image_pad|>) repeated counts[k] times."""
    out, k = [], 0
    for t in ids:
        if t == pad:
            if k == len(counts):
                raise ValueError(f"the text holds more image placeholders than the {len(counts)} image(s) given")
            out += [pad] * counts[k]
            k += 1
        else:
            out.append(t)
    if k != len(counts):
        raise ValueError(f"{len(counts)} image(s) given for {k} image placeholder(s) in the text")
    return out


# --------------------------------------------------------------- images of a batch of rows
class VisionRows:
    """The images of a batch of token rows, ready for a Qwen2-VL forward on any slice of rows:
    per row its pixel values and grids (in placeholder order)."""

    def __init__(self, pixels: list[torch.Tensor], grids: list[torch.Tensor], image_token_id: int):
        self.pixels, self.grids, self.image_token_id = pixels, grids, image_token_id

    @classmethod
    def of(cls, inputs: list[VisionInputs]) -> "VisionRows":
        """The rows of these VisionInputs (one per row, e.g. Episode.vision_inputs())."""
        return cls([v.pixel_values for v in inputs], [v.image_grid_thw for v in inputs], inputs[0].image_token_id)

    @classmethod
    def from_pngs(cls, processor, rows: list[list[bytes]], image_token_id: int) -> "VisionRows":
        """Decode and process each row's PNGs (the replay path: the buffer keeps bytes, not pixels)."""
        pixels, grids = [], []
        for pngs in rows:
            if pngs:
                px, g, _ = process(processor, [from_png(p) for p in pngs])
            else:
                px, g = torch.zeros(0, 0), torch.zeros(0, 3, dtype=torch.long)
            pixels.append(px)
            grids.append(g)
        return cls(pixels, grids, image_token_id)

    def kwargs(self, rows: slice, tokens: torch.Tensor) -> dict:
        """pixel_values, image_grid_thw and mm_token_type_ids for rows[rows] whose (cut) token
        rows are `tokens`, on tokens' device."""
        px = [p for p in self.pixels[rows] if p.numel()]
        gr = [g for g in self.grids[rows] if g.numel()]
        if not px:
            return {}
        dev = tokens.device
        return {"pixel_values": torch.cat(px).to(dev), "image_grid_thw": torch.cat(gr).to(dev),
                "mm_token_type_ids": (tokens == self.image_token_id).int()}


def stand_in_row(tokenizer, processor) -> tuple[torch.Tensor, "VisionRows"]:
    """A (1, n) token row holding one small black image, and its VisionRows: what a rank with no
    rows left runs so that, under FSDP, its vision tower takes part in every collective."""
    from PIL import Image

    side = int((getattr(processor, "min_pixels", None) or processor.size.shortest_edge) ** 0.5) + 1
    v = expand(tokenizer, processor, ["", " ."], [Image.new("RGB", (side, side))])
    return torch.tensor([v.input_ids]), VisionRows.of([v])


# ------------------------------------------------------------------------------ tiny model
TINY_FAMILIES = ("qwen2-vl", "qwen2.5-vl")


def build_tiny_vl(path: Path, texts: list[str], specials: list[str], chat_template: str, hidden: int = 128,
                  layers: int = 2, vocab: int = 600, seed: int = 0, family: str = "qwen2-vl") -> Path:
    """Create (once) a tiny Qwen2-VL or Qwen2.5-VL (`family`; text hidden `hidden`, head dim 64,
    M-RoPE sections 8/12/12; 14-pixel patches merged 2x2 by a small vision tower: Qwen2-VL one
    block, Qwen2.5-VL two, windowed then full attention, as its larger towers alternate), its
    tokenizer trained on `texts` with the chat and vision special tokens, and its image processor
    config, in `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    if family not in TINY_FAMILIES:
        raise ValueError(f"family must be one of {TINY_FAMILIES}, got {family!r}")

    if (path / "config.json").exists():
        return path
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    specials = list(specials) + VISION_SPECIALS
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>",
                                   additional_special_tokens=specials[2:])
    fast.chat_template = chat_template
    ids = {t: fast.convert_tokens_to_ids(t) for t in VISION_SPECIALS}
    if family == "qwen2-vl":
        config_cls, model_cls = Qwen2VLConfig, Qwen2VLForConditionalGeneration
        vision = dict(depth=1, embed_dim=64, hidden_size=hidden, num_heads=2, mlp_ratio=2, patch_size=14,
                      spatial_merge_size=2, in_channels=3, temporal_patch_size=2)
    else:
        config_cls, model_cls = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        vision = dict(depth=2, hidden_size=64, out_hidden_size=hidden, intermediate_size=128, num_heads=2,
                      patch_size=14, spatial_merge_size=2, in_channels=3, temporal_patch_size=2, window_size=56,
                      fullatt_block_indexes=[1])
    cfg = config_cls(
        text_config=dict(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                         rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]}, max_position_embeddings=4096,
                         tie_word_embeddings=True, pad_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id,
                         bos_token_id=fast.eos_token_id),
        vision_config=vision, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True, pad_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id,
        bos_token_id=fast.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(cfg)
    model.save_pretrained(tmp, safe_serialization=True)
    fast.save_pretrained(tmp)
    Qwen2VLImageProcessorPil(min_pixels=IMAGE_MIN_PIXELS, max_pixels=IMAGE_MAX_PIXELS).save_pretrained(tmp)
    try:
        os.replace(tmp, path)
    except OSError:  # another process built it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return path

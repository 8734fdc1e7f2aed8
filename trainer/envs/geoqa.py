"""GeoQA: single-turn geometry questions about a figure, for a vision-language policy.

The reply puts its final answer in \\boxed{} and is scored by the math verifier
(trainer/envs/math.score): a choice letter or a value.

Problems come from
- the procedural set (`data` empty): a figure drawn with PIL (a right triangle with its legs
  labelled, a rectangle with its sides, a triangle with two angles, a circle with its radius) and
  a question whose answer is computed from the numbers drawn, so nothing is downloaded; the
  numbers are in the picture only, never in the text. Validation draws from seeds training never
  uses (the same distribution, as math-cpu's);
- a dataset in the GeoQA-R1V form (`data`): a parquet/jsonl/json file or a `datasets` folder
  with an image column (`image_key`: a decoded image, {"bytes", "path"}, raw bytes, or a path
  relative to the file), a question column and an answer column (an "<answer>X</answer>" tag, a
  \\boxed{}, or the bare answer). Every row's image is opened when the set is loaded: a row
  without one, or one that cannot be read, is an error naming the row.
"""
from __future__ import annotations

import functools
import io
import random
from pathlib import Path

from .base import EVAL_SEED_BASE, register
from .math import BoxedQuestion, last_boxed
from .prompts import IMAGE

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


# ------------------------------------------------------------------------ procedural figures
def _label(d, xy, text):
    from PIL import ImageFont

    d.text(xy, text, fill=(0, 0, 0), font=ImageFont.load_default(), anchor="mm")


def figure(seed: int, size: int = 112):
    """(PIL image size x size, question, answer) of procedural problem `seed`."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    img = Image.new("RGB", (size, size), (255, 255, 255))
    d = ImageDraw.Draw(img)
    s, kind = size / 112, rng.randrange(4)
    line = dict(fill=(0, 0, 0), width=max(1, round(s)))
    if kind == 0:  # right triangle, legs from a scaled Pythagorean triple
        a, b, c = rng.choice([(3, 4, 5), (6, 8, 10), (5, 12, 13), (8, 15, 17), (9, 12, 15)])
        A, B, C = (16 * s, 92 * s), (96 * s, 92 * s), (16 * s, 20 * s)
        d.polygon([A, B, C], outline=(0, 0, 0))
        d.line([A, B], **line), d.line([A, C], **line), d.line([B, C], **line)
        _label(d, (56 * s, 102 * s), str(b)), _label(d, (8 * s, 56 * s), str(a))
        return img, "In the right triangle, the two legs are labelled. How long is the hypotenuse?", str(c)
    if kind == 1:  # rectangle
        w, h = rng.randrange(2, 13), rng.randrange(2, 13)
        d.rectangle([18 * s, 24 * s, 94 * s, 84 * s], outline=(0, 0, 0), width=max(1, round(s)))
        _label(d, (56 * s, 94 * s), str(w)), _label(d, (9 * s, 54 * s), str(h))
        return img, "The sides of the rectangle are labelled. What is its area?", str(w * h)
    if kind == 2:  # triangle with two angles given
        x, y = rng.randrange(20, 90, 5), rng.randrange(20, 90, 5)
        A, B, C = (12 * s, 92 * s), (100 * s, 92 * s), (60 * s, 18 * s)
        d.line([A, B], **line), d.line([B, C], **line), d.line([C, A], **line)
        _label(d, (26 * s, 84 * s), f"{x}°"), _label(d, (86 * s, 84 * s), f"{y}°")
        return img, "Two angles of the triangle are labelled. What is the third angle, in degrees?", str(180 - x - y)
    r = rng.randrange(2, 20)  # circle
    d.ellipse([16 * s, 16 * s, 96 * s, 96 * s], outline=(0, 0, 0), width=max(1, round(s)))
    d.line([(56 * s, 56 * s), (96 * s, 56 * s)], **line)
    _label(d, (76 * s, 48 * s), str(r))
    return img, "The radius of the circle is labelled. What is its diameter?", str(2 * r)


# ------------------------------------------------------------------------------- datasets
def _open_image(value, base: Path, row: int, path: str):
    from PIL import Image

    if value is None or (isinstance(value, dict) and not (value.get("bytes") or value.get("path"))):
        raise ValueError(f"env.data: row {row} of {path} has no image")
    try:
        if isinstance(value, Image.Image):
            return value.convert("RGB")
        if isinstance(value, dict):
            value = value.get("bytes") or value.get("path")
        if isinstance(value, (bytes, bytearray)):
            return Image.open(io.BytesIO(value)).convert("RGB")
        p = Path(str(value)).expanduser()
        return Image.open(p if p.is_absolute() else base / p).convert("RGB")
    except (OSError, ValueError) as e:
        raise ValueError(f"env.data: the image of row {row} of {path} cannot be read: {e}") from None


def gold(answer: str) -> str:
    """The answer inside "<answer>X</answer>" or the last \\boxed{}, else the text itself."""
    import re

    m = re.search(r"<answer>(.*?)</answer>", answer, re.DOTALL)
    if m:
        return m.group(1).strip()
    box = last_boxed(answer)
    return box if box is not None else answer.strip()


@functools.lru_cache(maxsize=4)
def load_rows(path: str, question_key: str, answer_key: str, image_key: str) -> tuple:
    """((image, question, answer), ...) from a local GeoQA-R1V-style file or `datasets` folder."""
    import datasets

    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"env.data: {path} does not exist (a parquet/jsonl/json file or a datasets folder)")
    if p.is_dir():
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds["train"] if "train" in ds else ds[next(iter(ds))]
        base = p
    else:
        kind = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}.get(p.suffix)
        if kind is None:
            raise ValueError(f"env.data: {path} has an unknown format; use .parquet, .jsonl or .json")
        ds = datasets.load_dataset(kind, data_files=str(p), split="train")
        base = p.parent
    for key, name in ((question_key, "env.question_key"), (answer_key, "env.answer_key"),
                      (image_key, "env.image_key")):
        if key not in ds.column_names:
            raise ValueError(f"{name}={key!r} is not a column of {path}; columns: {ds.column_names}")
    if len(ds) == 0:
        raise ValueError(f"env.data: {path} has no rows")
    return tuple((_open_image(row[image_key], base, i, path), str(row[question_key]), gold(str(row[answer_key])))
                 for i, row in enumerate(ds))


@register
class GeoQA(BoxedQuestion):
    name = "geoqa"
    vision = True
    instruction = INSTRUCTION

    OPTIONS = {"format_penalty": "format_penalty", "data": "data", "eval_data": "eval_data",
               "question_key": "question_key", "answer_key": "answer_key", "image_key": "image_key",
               "image_pixels": "image_size"}

    def __init__(self, max_turns: int = 1, format_penalty: float = -0.15, data: str = "", eval_data: str = "",
                 question_key: str = "problem", answer_key: str = "answer", image_key: str = "image",
                 image_size: int = 112):
        super().__init__(1, format_penalty)
        if not 56 <= image_size <= 2048:
            raise ValueError(f"image_size must lie in [56, 2048] pixels, got {image_size}")
        self.image_size = image_size
        self.train_rows, self.held_out_rows = (), ()
        if data:
            rows = load_rows(data, question_key, answer_key, image_key)
            if eval_data:
                self.train_rows, self.held_out_rows = rows, load_rows(eval_data, question_key, answer_key, image_key)
            elif len(rows) < 2:
                raise ValueError(f"env.data: {data} has {len(rows)} row; give env.eval_data or more rows")
            else:
                cut = max(1, len(rows) // 10)
                self.train_rows, self.held_out_rows = rows[:-cut], rows[-cut:]
        self.picture, self.question, self.answer = None, "", ""
        self.correct = False

    def _reset(self, seed: int) -> None:
        if not self.train_rows:
            self.picture, self.question, self.answer = figure(seed, self.image_size)
        else:
            rows, base = (self.held_out_rows, EVAL_SEED_BASE) if seed >= EVAL_SEED_BASE else (self.train_rows, 0)
            self.picture, self.question, self.answer = rows[(seed - base) % len(rows)]
        self.correct = False

    def images(self) -> list:
        return [self.picture]

    def opening(self, state: str, max_words: int) -> list[dict]:
        return [{"role": "user", "content": f"{IMAGE}{self.question}\n{INSTRUCTION}"}]

    def random_reply(self, rng: random.Random) -> str:
        """A boxed number in the procedural answers' range (the format warm start and chance)."""
        return f"The answer is \\boxed{{{rng.randrange(1, 150)}}}."

"""Images as a replay buffer keeps them: PNG bytes packed into fixed-width uint8 rows.

A vision-language trajectory's images are heavy as model inputs (a 112 x 112 board is 301 KB of
float32 pixel values) and light as PNG (a few hundred bytes for a flat-coloured board). PNG is
lossless, so decoding gives the pixels the policy saw and the processor gives the same model
inputs again. `pack_pngs` lays each row's images out in a fixed width, the shape a buffer field
needs; an image set that does not fit is an error, never cut.
"""
from __future__ import annotations

import torch


def to_png(image) -> bytes:
    """Lossless bytes of an RGB image: decoding them gives the same pixels, so the same model inputs."""
    import io

    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def from_png(data: bytes):
    import io

    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def pack_pngs(rows: list[list[bytes]], width: int, option: str = "rollout.image_bytes") -> torch.Tensor:
    """(R, width) uint8: per row [image count (4 bytes), then per image its length (4 bytes) and
    PNG bytes], zero-filled: a fixed-width field the replay buffer can hold on the device.
    ValueError naming `option` (the setting of `width`) if a row's images need more."""
    out = torch.zeros((len(rows), width), dtype=torch.uint8)
    for r, pngs in enumerate(rows):
        blob = len(pngs).to_bytes(4, "little") + b"".join(len(p).to_bytes(4, "little") + p for p in pngs)
        if len(blob) > width:
            raise ValueError(f"a trajectory's {len(pngs)} image(s) take {len(blob)} bytes as PNG, over the "
                             f"{width} bytes per row allowed ({option}); raise it")
        out[r, :len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    return out


def unpack_pngs(packed: torch.Tensor) -> list[list[bytes]]:
    """The inverse of pack_pngs (rows of any device)."""
    rows = []
    for row in packed.cpu().numpy():
        data = row.tobytes()
        n, at, pngs = int.from_bytes(data[:4], "little"), 4, []
        for _ in range(n):
            size = int.from_bytes(data[at:at + 4], "little")
            pngs.append(data[at + 4:at + 4 + size])
            at += 4 + size
        rows.append(pngs)
    return rows

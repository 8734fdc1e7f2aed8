"""PNG rows for a replay buffer: exact round trips, the fixed width, and an over-full row named."""
import pytest
import torch

from freshper.images import from_png, pack_pngs, to_png, unpack_pngs


def picture(seed, size=(40, 28)):
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (size[1], size[0], 3), generator=g, dtype=torch.uint8).numpy())


def test_pngs_round_trip_exactly_in_fixed_width_rows():
    rows = [[to_png(picture(i)) for i in range(3)], [], [to_png(picture(9, (7, 5)))]]
    assert from_png(rows[0][1]).tobytes() == picture(1).tobytes(), "lossless"
    packed = pack_pngs(rows, 16384)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 16384)
    assert unpack_pngs(packed) == rows
    need = 4 + sum(4 + len(p) for p in rows[0])
    assert unpack_pngs(pack_pngs(rows[:1], need)) == rows[:1], "exactly enough"
    with pytest.raises(ValueError, match=f"take {need} bytes as PNG, over the {need - 1} bytes per row allowed "
                                         r"\(replay_image_bytes\)"):
        pack_pngs(rows[:1], need - 1, option="replay_image_bytes")

"""Vision-language building blocks on CPU: a tiny Qwen2-VL built offline, boards drawn as
pictures, prompts expanded with image placeholders, and the proof that images, placeholders and
M-RoPE positions reach the training forward exactly as they reached generation."""
import random

import pytest
import torch

from freshper.trainer.engines.base import Sampling
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.envs.frozenlake import FrozenLake
from freshper.trainer.envs.picture_games import draw_board
from freshper.trainer.model.load import CHAT_TEMPLATE, SPECIALS
from freshper.trainer.model.vision import VISION_SPECIALS, build_tiny_vl, expand, image_processor

FULL = Sampling(1.0, 1.0, 0)  # unprocessed sampling: the engine's log-probs are the model's


def _tiny(tmp_path_factory, family):
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    env = FrozenLake()
    rng = random.Random(0)
    texts = []
    for s in range(40):
        env.reset(s)
        texts += [env.render(), env.random_reply(rng), "Choose your action. The board:"]
    path = build_tiny_vl(tmp_path_factory.mktemp("vl") / family, texts, SPECIALS, CHAT_TEMPLATE, family=family)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path), image_processor(path)


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    return _tiny(tmp_path_factory, "qwen2-vl")


@pytest.fixture(scope="module", params=["qwen2-vl", "qwen2.5-vl"])
def any_vl(request, tmp_path_factory):
    return _tiny(tmp_path_factory, request.param)


def boards(n):
    env = FrozenLake()
    out = []
    for s in range(n):
        env.reset(100 + s)
        out.append(env.render().splitlines())
    return out


def test_a_board_is_drawn_cell_by_cell():
    rows = ["P_O", "__G"]
    img = draw_board(rows, cell=10)
    assert img.size == (30, 20)
    assert img.getpixel((5, 5)) == (220, 40, 40) and img.getpixel((25, 5)) == (20, 40, 120)
    assert img.getpixel((25, 15)) == (40, 170, 60)
    with pytest.raises(ValueError, match="unknown symbol 'Z' at row 0, column 1"):
        draw_board(["PZ"])


def test_prompts_get_one_placeholder_per_merged_patch(vl):
    _, tok, proc = vl
    img = draw_board(boards(1)[0])  # 64 x 64 pixels
    v = expand(tok, proc, ["<|im_start|>user\n", "Choose your action.<|im_end|>\n"], [img])
    assert v.image_grid_thw.tolist() == [[1, 4, 4]] and v.pixel_values.shape == (16, 1176)
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    assert v.input_ids.count(pad) == 4, "16 patches merged 2 x 2"
    i = v.input_ids.index(pad)
    assert v.input_ids[i - 1] == tok.convert_tokens_to_ids("<|vision_start|>")
    assert v.input_ids[i + 4] == tok.convert_tokens_to_ids("<|vision_end|>")


def test_images_that_cannot_be_used_are_named(vl):
    from PIL import Image

    _, tok, proc = vl
    with pytest.raises(ValueError, match="image 0 is a str, not a PIL image"):
        expand(tok, proc, ["a", "b"], ["board.png"])
    with pytest.raises(ValueError, match="over 64 x the processor's max_pixels"):
        expand(tok, proc, ["a", "b"], [Image.new("RGB", (4000, 4000))])
    with pytest.raises(ValueError, match="one more part than images"):
        expand(tok, proc, ["a"], [Image.new("RGB", (32, 32))])


def test_generation_and_the_training_forward_agree_on_image_prompts(any_vl):
    """Two prompts of different lengths (left-padded in generation, right-padded in training),
    each with its own board: the engine's log-probs of the tokens it sampled equal the training
    forward's (PolicyNet, as the update runs it) to float32 rounding; for Qwen2-VL and Qwen2.5-VL."""
    from freshper.trainer.model.sharding import PolicyNet

    model, tok, proc = any_vl
    ins = [expand(tok, proc, ["<|im_start|>user\n" + "Look. " * k, "Choose your action.<|im_end|>\n"
                              "<|im_start|>assistant\n"], [draw_board(b)]) for k, b in zip((0, 3), boards(2))]
    torch.manual_seed(1)
    gen = HFEngine(model, tok).generate([v.input_ids for v in ins], 8, FULL, images=ins)
    rows = [v.input_ids + g for v, g in zip(ins, gen.token_ids)]
    L = max(map(len, rows))
    tokens = torch.full((2, L), tok.pad_token_id)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = torch.tensor(r)
    lengths = torch.tensor([len(r) for r in rows])
    vision = {"pixel_values": torch.cat([v.pixel_values for v in ins]),
              "image_grid_thw": torch.cat([v.image_grid_thw for v in ins]),
              "mm_token_type_ids": ins[0].mm_token_type_ids(tokens)}
    with torch.no_grad():
        hidden = PolicyNet(model)(tokens, lengths, lambda h, w: (h, w), **vision)
    h, w = hidden
    # the engine never samples the vision special tokens (a reply's placeholder would claim image
    # features): its distribution is the model's with those columns removed
    banned = tok.convert_tokens_to_ids(VISION_SPECIALS)
    for i, (v, g, lp) in enumerate(zip(ins, gen.token_ids, gen.logprobs)):
        n = len(v.input_ids)
        logits = (h[i, n - 1:n - 1 + len(g)] @ w.T).float()
        logits[:, banned] = -torch.inf
        got = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g)[:, None])[:, 0]
        assert len(g) > 0 and not set(g) & set(banned)
        torch.testing.assert_close(got, torch.tensor(lp), atol=1e-5, rtol=0)


# ------------------------------------------------------------------ episodes that show images
def _vl_episode(vl, n_images=1):
    from freshper.trainer.envs.prompts import IMAGE
    from freshper.trainer.model.chat import Episode

    _, tok, proc = vl
    pics = [draw_board(b, 28) for b in boards(n_images)]
    text = "Look: " + " then ".join([IMAGE] * n_images)
    return Episode(tok, [{"role": "user", "content": text}], pics, proc), pics


def test_an_episode_expands_each_image_and_keeps_it_as_png(vl):
    from freshper.images import from_png
    from freshper.trainer.model.vision import process

    _, tok, proc = vl
    ep, pics = _vl_episode(vl, 2)
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    assert ep.ids.count(pad) == 2 * 16, "112 x 112 pixels: 8 x 8 patches merged 2 x 2 = 16 tokens per image"
    assert [from_png(p).tobytes() for p in ep.pngs] == [p.tobytes() for p in pics], "PNG is lossless"
    v = ep.vision_inputs()
    px, grids, _ = process(proc, pics)
    assert torch.equal(v.pixel_values, px) and torch.equal(v.image_grid_thw, grids)


def test_an_episode_refuses_images_that_do_not_match_its_placeholders(vl):
    from freshper.trainer.envs.prompts import IMAGE
    from freshper.trainer.model.chat import Episode

    _, tok, proc = vl
    pic = draw_board(boards(1)[0], 28)
    with pytest.raises(ValueError, match=r"2 image\(s\) given for 1 image placeholder"):
        Episode(tok, [{"role": "user", "content": f"{IMAGE}"}], [pic, pic], proc)
    with pytest.raises(ValueError, match="more image placeholders than the 0 image"):
        Episode(tok, [{"role": "user", "content": f"{IMAGE}"}], [], proc)
    with pytest.raises(ValueError, match="without an image processor"):
        Episode(tok, [{"role": "user", "content": f"{IMAGE}"}], [pic])


def test_a_turn_that_does_not_fit_keeps_no_image(vl):
    from freshper.trainer.envs.prompts import IMAGE

    ep, _ = _vl_episode(vl, 1)
    tok = vl[1]
    ep.add_reply(tok("<answer>Up</answer>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id], [])
    n, pngs = len(ep), list(ep.pngs)
    assert not ep.add_user(f"next {IMAGE}", limit=len(ep) + 5, images=[draw_board(boards(2)[1], 28)])
    assert len(ep) == n and ep.pngs == pngs and len(ep.pixels) == 1
    assert ep.add_user(f"next {IMAGE}", images=[draw_board(boards(2)[1], 28)])
    assert len(ep.pngs) == 2 and ep.vision_inputs().image_grid_thw.shape == (2, 3)


def test_replayed_images_give_the_same_model_inputs(vl):
    """What the buffer brings back (PNG bytes -> pixels) equals what the rollout processed."""
    from freshper.images import pack_pngs, unpack_pngs
    from freshper.trainer.model.vision import VisionRows

    _, tok, proc = vl
    eps = [_vl_episode(vl, k)[0] for k in (1, 2)]
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    back = VisionRows.from_pngs(proc, unpack_pngs(pack_pngs([e.pngs for e in eps], 8192)), pad)
    for e, px, g in zip(eps, back.pixels, back.grids):
        v = e.vision_inputs()
        assert torch.equal(v.pixel_values, px) and torch.equal(v.image_grid_thw, g)


def test_collapse_pads_undoes_expand_ids():
    """vLLM is given one pad per image and expands it itself: collapse_pads must give back the
    unexpanded ids exactly, images side by side included (each has its own start/end tokens)."""
    from freshper.trainer.model.vision import collapse_pads, expand_ids

    pad, start, end = 9, 7, 8
    ids = [1, start, pad, end, 2, 3, start, pad, end, start, pad, end, 4]
    expanded = expand_ids(ids, pad, [4, 1, 16])
    assert len(expanded) == len(ids) + 3 + 0 + 15
    assert collapse_pads(expanded, pad) == ids
    assert collapse_pads(expand_ids(ids, pad, [2, 2, 2]), pad) == ids
    assert collapse_pads([pad, pad, 1, pad], pad) == [pad, 1, pad]

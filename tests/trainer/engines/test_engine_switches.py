"""The HF engine's cache and attention changes can each be switched off from the config (a way out
for a model that defeats the full-attention guard); before, make_engine passed only share_prefix."""
import pytest
import torch

from freshper.trainer import config
from freshper.trainer.engines import make_engine
from freshper.trainer.model.load import load_policy


@pytest.fixture(scope="module")
def tiny():
    cfg = config.load("tiny", None, {"train.sft_steps": 0})
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    return model, tok


@pytest.mark.parametrize("off", [[], ["turn_cache"], ["kv_room"], ["gqa_sdpa"], ["turn_cache", "kv_room", "gqa_sdpa"]])
def test_each_switch_reaches_the_engine(tiny, off):
    model, tok = tiny
    cfg = config.load("tiny", None, {f"rollout.{k}": False for k in off})
    engine = make_engine("hf", model, tok, cfg, torch.device("cpu"))
    assert (engine.turns is not None) == ("turn_cache" not in off)
    assert engine.room == ("kv_room" not in off)
    assert engine.gqa == ("gqa_sdpa" not in off)

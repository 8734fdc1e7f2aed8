"""The HF engine's per-episode cache across turns (trainer/engines/turn_cache.py) against the whole
re-prefill of every turn: multi-turn FrozenLake rollouts, greedy, give the same replies, and
engine log-probs within 4x float32's own error (the re-prefill in float32 against float64)."""
import pytest
import torch

from freshper.trainer import config
from freshper.trainer.engines.base import Sampling
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.engines.turn_cache import TurnCache
from freshper.trainer.model.load import env_kwargs, load_policy
from freshper.trainer.train.rollout import rollout

GREEDY = Sampling(0.0, 1.0, 0)


@pytest.fixture(scope="module")
def policy():
    cfg = config.load("tiny", None, {"train.sft_steps": 0, "model.tiny_layers": 2, "env.max_turns": 4,
                                     "rollout.max_len": 900})
    torch.manual_seed(0)
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    return cfg, model, tok


def _play(cfg, model, tok, turn_cache: bool, dtype=torch.float32):
    """Six episodes in three groups of two; prompts of different lengths, so rows' caches differ."""
    engine = HFEngine(model.to(dtype), tok, turn_cache=turn_cache)
    ep = rollout(engine, tok, "frozenlake", env_kwargs(cfg), [11, 12, 13], 2, 10, cfg.rollout.max_len, GREEDY)
    model.float()
    assert engine.turns is None or len(engine.turns) == 0, "every episode's cache is released at its end"
    return ep


def _agree(cfg, model, tok) -> tuple[bool, str]:
    cached, whole, whole64 = (_play(cfg, model, tok, True), _play(cfg, model, tok, False),
                              _play(cfg, model, tok, False, torch.float64))
    assert int(whole.turns.min()) >= 3, "the test needs episodes of several turns"
    if not torch.equal(cached.tokens, whole.tokens):
        return False, "the replies differ"
    m = whole.mask
    err = (cached.engine_logp[m].double() - whole.engine_logp[m].double()).abs().max().item()
    base = (whole.engine_logp[m].double() - whole64.engine_logp[m].double()).abs().max().item()
    return err <= 4 * base + 1e-9, f"cached vs whole {err:.3g}, float32's own error {base:.3g}"


def test_later_turns_on_the_kept_cache_equal_the_whole_prefill(policy):
    ok, why = _agree(*policy)
    assert ok, why


def test_a_cache_offset_by_one_position_fails_the_check(policy, monkeypatch):
    """Every row's cached keys/values one position later than their tokens: the check above
    must see it (here the replies differ, or the log-probs leave float32's error)."""
    batch = TurnCache.batch

    def shifted(self, *a, **k):
        ids, attn, layers = batch(self, *a, **k)
        return ids, attn, [(K.roll(1, dims=2), V.roll(1, dims=2)) for K, V in layers]

    monkeypatch.setattr(TurnCache, "batch", shifted)
    ok, why = _agree(*policy)
    assert not ok, why


def test_later_turns_prefill_only_their_new_tokens(policy, monkeypatch):
    """The forward of a later turn's prefill sees only the reply's last token and the user's message:
    far fewer positions than the conversation so far."""
    cfg, model, tok = policy
    widths = []
    forward = type(model).forward

    def counting(self, *a, **k):
        ids = k.get("input_ids")
        cache = k.get("cache", k.get("past_key_values"))  # the keyword's name differs across transformers releases
        if ids is not None and cache is not None and ids.shape[1] > 1:
            widths.append((ids.shape[1], cache.get_seq_length()))
        return forward(self, *a, **k)

    monkeypatch.setattr(type(model), "forward", counting)
    _play(cfg, model, tok, True)
    later = [(w, c) for w, c in widths if c > 0]
    assert len(later) >= 2, widths
    assert all(w < c / 3 for w, c in later[1:]), later


def test_a_prompt_that_does_not_continue_the_cache_starts_over():
    t = TurnCache()
    k = torch.zeros(2, 3, 4)
    t.kept["a"] = ([1, 2, 3], [(k, k)])
    assert t.cached_lengths([[1, 2, 3, 4], [1, 2, 3]], ["a", "b"]) == [3, 0]
    assert t.cached_lengths([[1, 9, 3, 4]], ["a"]) == [0] and "a" not in t.kept  # dropped, not reused
    t.kept["a"] = ([1, 2, 3], [(k, k)])
    assert t.cached_lengths([[1, 2, 3]], ["a"]) == [0]  # nothing new to prefill: not a continuation
    t.release(["a", "unknown"])
    assert len(t) == 0

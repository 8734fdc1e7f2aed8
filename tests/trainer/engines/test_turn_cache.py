"""The HF engine's per-episode cache across turns (trainer/engines/turn_cache.py) against the whole
re-prefill of every turn: multi-turn FrozenLake rollouts, greedy, give the same replies, and
engine log-probs within 4x float32's own error (the re-prefill in float32 against float64)."""
import pytest
import torch

from freshper.trainer.engines.turn_cache import TurnCache

from .engine_agreement import agree, play, tiny_frozenlake


@pytest.fixture(scope="module")
def policy():
    return tiny_frozenlake()


def _agree(cfg, model, tok):
    return agree(cfg, model, tok, {"turn_cache": True}, {"turn_cache": False})


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
    play(cfg, model, tok, {"turn_cache": True})
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

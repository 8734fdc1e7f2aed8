"""The cache that decodes into room (trainer/engines/kv_room.py): as a state machine against
transformers' own DynamicLayer, and in the engine, where multi-turn greedy rollouts with it give
the replies and (within float32's error) the log-probs of transformers' cache."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.cache_utils import DynamicLayer

from freshper.trainer.engines.base import Sampling
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.engines.kv_room import RoomLayer, room_cache

from .engine_agreement import agree, tiny_frozenlake

op = st.one_of(st.tuples(st.just("append"), st.integers(1, 40)),
               st.tuples(st.just("select"), st.lists(st.integers(0, 2), min_size=3, max_size=3)),
               st.tuples(st.just("crop"), st.integers(1, 5)))


@settings(max_examples=60, deadline=None)
@given(room=st.integers(0, 20), ops=st.lists(op, min_size=1, max_size=12), seed=st.integers(0, 2**16))
def test_room_layer_holds_what_dynamic_layer_holds(room, ops, seed):
    """Any sequence of appends, batch selections (what generate and the prompt cache do) and crops
    leaves the same keys and values in both; room never shows through."""
    g = torch.Generator().manual_seed(seed)
    ours, ref = RoomLayer(room), DynamicLayer()
    for kind, arg in ops:
        if kind == "append":
            k, v = torch.randn(3, 2, arg, 4, generator=g), torch.randn(3, 2, arg, 4, generator=g)
            got, want = ours.update(k, v), ref.update(k, v)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        elif kind == "select":
            ours.batch_select_indices(torch.tensor(arg))
            ref.batch_select_indices(torch.tensor(arg))
        elif ref.get_seq_length() > arg:
            ours.crop(-arg)
            ref.crop(-arg)
        assert ours.get_seq_length() == ref.get_seq_length()
        if ref.get_seq_length():
            assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values)
            assert ours.capacity() >= ours.get_seq_length()


def test_the_first_append_takes_its_room_and_later_ones_fit_into_it():
    layer = RoomLayer(room=5)
    layer.update(torch.zeros(1, 1, 10, 2), torch.zeros(1, 1, 10, 2))
    buf = layer._k
    assert layer.capacity() == 15
    for _ in range(5):
        layer.update(torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2))
    assert layer._k is buf, "appends within the room write in place"
    layer.update(torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2))
    assert layer.capacity() == 16 + 32 and layer.get_seq_length() == 16


def test_bad_room_and_mismatched_data_are_refused():
    with pytest.raises(ValueError, match="room"):
        RoomLayer(-1)
    with pytest.raises(ValueError, match="n_layers"):
        room_cache(3, 4, [(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))])


@pytest.fixture(scope="module")
def policy():
    return tiny_frozenlake()


def room_agrees(cfg, model, tok, share_prefix=True):
    return agree(cfg, model, tok, {"kv_room": True, "share_prefix": share_prefix},
                 {"kv_room": False, "share_prefix": share_prefix})


@pytest.mark.parametrize("share_prefix", [True, False])
def test_rollouts_on_the_room_cache_equal_those_on_transformers_cache(policy, share_prefix):
    ok, why = room_agrees(*policy, share_prefix=share_prefix)
    assert ok, why


def test_a_step_written_one_position_early_fails_the_check(policy, monkeypatch):
    """Each decode step's keys and values land one position early, over the previous token's, and
    the step's own position stays empty (zeros)."""
    update = RoomLayer.update

    def early(self, k, v, *a, **kw):
        if k.shape[-2] != 1 or not self._n:
            return update(self, k, v, *a, **kw)
        update(self, k, v, *a, **kw)
        for buf, new in ((self._k, k), (self._v, v)):
            buf[:, :, self._n - 2] = new[:, :, 0]
            buf[:, :, self._n - 1] = 0
        return self.keys, self.values

    monkeypatch.setattr(RoomLayer, "update", early)
    ok, why = room_agrees(*policy)
    assert not ok, why


def test_a_reply_never_reallocates(policy, monkeypatch):
    """The engine sizes the room for the whole reply: one buffer per layer per generate call."""
    cfg, model, tok = policy
    grows = []
    grow = RoomLayer._grow

    def counting(self, *a):
        grows.append(id(self))
        return grow(self, *a)

    monkeypatch.setattr(RoomLayer, "_grow", counting)
    engine = HFEngine(model, tok)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [5, 6, 7, 8]]
    engine.generate(prompts, 24, Sampling(1.0, 1.0, 0))
    assert len(grows) == 2 * cfg.model.tiny_layers and len(set(grows)) == cfg.model.tiny_layers

"""Grouped-query attention inside sdpa (trainer/engines/gqa_sdpa.py): the function against
transformers' sdpa path (which expands the key/value heads) in float64, and in the engine on a
grouped-query model, where multi-turn greedy rollouts with it give the replies and, within float32's
error, the log-probs of transformers' attention."""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from freshper.trainer.engines import gqa_sdpa as gqa

from .engine_agreement import agree, tiny_frozenlake


class _Module:  # what the attention functions read off an attention module
    def __init__(self, groups):
        self.num_key_value_groups, self.is_causal = groups, True


def _inputs(q_len, k_len, heads=6, kv=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(3, heads, q_len, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(3, kv, k_len, 8, generator=g, dtype=torch.float64) for _ in range(2))
    keep = torch.ones(3, k_len, dtype=torch.bool)
    keep[1, :2] = keep[2, :4] = False  # left padding
    causal = torch.arange(k_len)[None, :] <= torch.arange(k_len - q_len, k_len)[:, None]
    return q, k, v, (keep[:, None, None, :] & causal[None, None])


@pytest.mark.parametrize("q_len", [1, 5])
def test_attention_equals_transformers_expanded_heads(q_len):
    q, k, v, mask = _inputs(q_len, 9)
    ours, _ = gqa.sdpa_gqa_forward(_Module(3), q, k, v, mask)
    ref, _ = sdpa_attention_forward(_Module(3), q, k, v, mask)
    assert ours.shape == (3, q_len, 6, 8)
    assert (ours - ref).abs().max() < 1e-12


def test_a_wrong_head_to_group_map_fails_the_comparison():
    """Query head h reads key/value head h // 3; tiling the heads (h % 2) is detected."""
    q, k, v, mask = _inputs(1, 9)
    tiled, _ = sdpa_attention_forward(_Module(1), q, k.repeat(1, 3, 1, 1), v.repeat(1, 3, 1, 1), mask)
    ref, _ = sdpa_attention_forward(_Module(3), q, k, v, mask)
    assert (tiled - ref).abs().max() > 1e-3


@pytest.fixture(scope="module")
def grouped():
    """The tiny FrozenLake tokenizer with a random Qwen2 of 4 query heads over 2 key/value heads."""
    cfg, _, tok = tiny_frozenlake()
    mcfg = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                       tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                       attn_implementation="sdpa")
    torch.manual_seed(1)
    return cfg, Qwen2ForCausalLM(mcfg).eval(), tok


def grouped_agrees(cfg, model, tok):
    return agree(cfg, model, tok, {"gqa": True}, {"gqa": False})


def test_rollouts_with_grouped_attention_equal_expanded_heads(grouped, monkeypatch):
    calls = []
    forward = gqa.sdpa_gqa_forward

    def spy(*a, **k):
        calls.append(1)
        return forward(*a, **k)

    monkeypatch.setitem(gqa.AttentionInterface._global_mapping, gqa.NAME, spy)
    ok, why = grouped_agrees(*grouped)
    assert ok, why
    assert calls, "the engine attended through the grouped function"
    assert grouped[1].config._attn_implementation == "sdpa", "the model's own attention is restored"


def test_tiled_heads_in_the_engine_fail_the_check(grouped, monkeypatch):
    def tiled(module, q, k, v, *a, **kw):
        r = q.shape[1] // k.shape[1]
        return gqa.sdpa_gqa_forward(module, q, k.repeat(1, r, 1, 1), v.repeat(1, r, 1, 1), *a, **kw)

    monkeypatch.setitem(gqa.AttentionInterface._global_mapping, gqa.NAME, tiled)
    ok, why = grouped_agrees(*grouped)
    assert not ok, why


def test_applies_only_to_grouped_sdpa_text_models_on_cpu(grouped):
    _, model, _ = grouped
    assert gqa.applies(model)
    same = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, attn_implementation="sdpa"))
    eager = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, attn_implementation="eager"))
    assert not gqa.applies(same) and not gqa.applies(eager)
    with pytest.raises(RuntimeError):
        with gqa.gqa_sdpa(model):
            assert model.config._attn_implementation == gqa.NAME
            raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"

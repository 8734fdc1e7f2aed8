"""The HF engine's caches on rows that differ, which the FrozenLake agreement tests' tiny model
(one query head per key/value head, every reply 10 tokens, no EOS) never makes: grouped heads
(4 query, 2 key/value), replies of different lengths, ended by EOS, by the stop token and by
the length limit, episodes that run out of room at different turns (rows dropping out), and new
episodes joining continuing ones in a batch. Each set-up is held to the reference path (no turn
cache, no room cache, expanded heads): equal greedy replies, log-probs within 4x float32's own
error. The turn cache keeping row 0's reply length for every row (a defect these files once
missed) fails them."""
import itertools

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from freshper.trainer import config
from freshper.trainer.config import env_kwargs
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.engines.turn_cache import TurnCache
from freshper.trainer.envs import make_env
from freshper.trainer.model.load import load_policy
from freshper.trainer.train.rollout import rollout

from .engine_agreement import GREEDY

SEEDS, NEW, MAX_LEN = list(range(20, 28)), 10, 652  # chosen (measured) so rows end at turns 4 and 5
REF = {"turn_cache": False, "kv_room": False, "gqa": False}


@pytest.fixture(scope="module")
def policy():
    """A Qwen2 with grouped heads and an untied head whose EOS row is scaled 2.6x, so greedy replies
    end early at context-dependent places; the tiny FrozenLake tokenizer."""
    cfg = config.load("tiny", None, {"train.sft_steps": 0, "env.max_turns": 5, "rollout.max_len": MAX_LEN})
    _, tok, _ = load_policy(cfg, torch.device("cpu"))
    mc = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
                     pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
                     rope_theta=10000.0, max_position_embeddings=4096)
    torch.manual_seed(3)
    model = Qwen2ForCausalLM(mc)
    model.config._attn_implementation = "sdpa"
    model.eval()
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] *= 2.6
    return cfg, model, tok


def play(cfg, model, tok, engine: dict, dtype=torch.float32):
    gen = HFEngine(model.to(dtype), tok, **engine)
    try:
        return rollout(gen, tok, "frozenlake", env_kwargs(cfg), SEEDS, 1, NEW, MAX_LEN, GREEDY)
    finally:
        model.float()


def replies(ep, tok):
    """Per episode, (length, ended by EOS) of each reply."""
    out = []
    for i in range(len(ep)):
        m, t = ep.mask[i].tolist(), ep.tokens[i].tolist()
        runs = [list(g) for k, g in itertools.groupby(range(len(m)), key=lambda j: m[j]) if k]
        out.append([(len(r), t[r[-1]] == tok.eos_token_id) for r in runs])
    return out


def agree(cfg, model, tok, ours: dict) -> tuple[bool, str]:
    try:
        mine = play(cfg, model, tok, ours)
    except RuntimeError as e:  # a cache of the wrong length: a shape error inside attention
        return False, f"{ours} raised {e}"
    want, want64 = play(cfg, model, tok, REF), play(cfg, model, tok, REF, torch.float64)
    if not torch.equal(mine.tokens, want.tokens):
        return False, f"{ours}: the replies differ"
    m = want.mask
    err = (mine.engine_logp[m].double() - want.engine_logp[m].double()).abs().max().item()
    base = (want.engine_logp[m].double() - want64.engine_logp[m].double()).abs().max().item()
    return err <= 4 * base + 1e-9, f"{ours}: {err:.3g} against float32's own error {base:.3g}"


def test_the_rows_differ_as_the_test_needs(policy):
    cfg, model, tok = policy
    ep = play(cfg, model, tok, REF)
    r = replies(ep, tok)
    lengths = {n for row in r for n, _ in row}
    assert len(lengths) >= 4 and NEW in lengths, lengths  # several lengths, some cut at the limit
    assert any(eos for row in r for _, eos in row), "some replies end with EOS"
    assert len(set(ep.turns.tolist())) >= 2 and ep.context_ended.any(), "rows drop out at different turns"
    assert model.config.num_attention_heads > model.config.num_key_value_heads


@pytest.mark.parametrize("ours", [{"turn_cache": True, "kv_room": False, "gqa": False},
                                  {"turn_cache": False, "kv_room": True, "gqa": False},
                                  {"turn_cache": False, "kv_room": False, "gqa": True},
                                  {"turn_cache": True, "kv_room": True, "gqa": True}])
def test_each_set_up_agrees_with_the_reference(policy, ours):
    ok, why = agree(*policy, ours)
    assert ok, why


def _row_zero_length(self, cache, attn, prompts, replies_, keys):
    """The defect: every row's kept cache cut at row 0's reply length."""
    W = attn.shape[1]
    layers = [(layer.keys, layer.values) for layer in cache.layers]
    n = max(len(replies_[0]) - 1, 0)
    for i, (p, reply, key) in enumerate(zip(prompts, replies_, keys)):
        idx = torch.cat([attn[i].nonzero()[:, 0], W + torch.arange(n)]).to(layers[0][0].device)
        self.kept[key] = (p + reply[:n], [(k[i].index_select(1, idx), v[i].index_select(1, idx)) for k, v in layers])


def test_row_zeros_reply_length_for_every_row_fails(policy, monkeypatch):
    monkeypatch.setattr(TurnCache, "keep", _row_zero_length)
    ok, why = agree(*policy, {"turn_cache": True, "kv_room": True, "gqa": True})
    assert not ok, why


def _join(engine, tok, cfg):
    """Turn 1 of episodes b and a (a in row 1: its reply's length differs from row 0's); then a's
    turn 2 beside a new episode c; per call the replies and log-probs."""
    env = make_env("frozenlake", **env_kwargs(cfg))
    def ids(messages):
        return tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                   add_special_tokens=False)["input_ids"]

    prompt = {k: ids(env.opening(env.reset(s), NEW)) for k, s in (("a", 20), ("b", 21), ("c", 22))}
    first = engine.generate([prompt["b"], prompt["a"]], NEW, GREEDY, keys=["b", "a"])
    user = ids([{"role": "user", "content": "Go on."}])
    second = engine.generate([prompt["a"] + first.token_ids[1] + user, prompt["c"]], NEW, GREEDY, keys=["a", "c"])
    engine.release(["a", "b", "c"])
    return [first, second]


@pytest.mark.parametrize("defect", [False, True])
def test_new_episodes_join_continuing_ones(policy, monkeypatch, defect):
    cfg, model, tok = policy
    want = _join(HFEngine(model, tok, **REF), tok, cfg)
    want64 = _join(HFEngine(model.double(), tok, **REF), tok, cfg)
    model.float()
    if defect:
        monkeypatch.setattr(TurnCache, "keep", _row_zero_length)
    try:
        got = _join(HFEngine(model, tok), tok, cfg)
    except RuntimeError:
        assert defect
        return
    same = all(g.token_ids == w.token_ids for g, w in zip(got, want))
    err = max(abs(x - y) for g, w in zip(got, want) for gr, wr in zip(g.logprobs, w.logprobs) for x, y in zip(gr, wr))
    base = max(abs(x - y) for g, w in zip(want, want64) for gr, wr in zip(g.logprobs, w.logprobs)
               for x, y in zip(gr, wr))
    assert len(want[0].token_ids[0]) != len(want[0].token_ids[1]), "a's and b's first replies differ in length"
    assert (same and err <= 4 * base + 1e-9) != defect, (same, err, base)

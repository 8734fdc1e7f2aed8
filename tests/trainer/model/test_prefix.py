"""The shared-prompt forward (trainer/model/prefix.py) computes what the padded forward computes.

Tolerances come from float32's own error: the padded float32 forward against the same model in
float64 is the honest baseline, and the shared float32 forward may be off from float64 by at most
a few times that. Checked once to fail: a suffix one position early, a shorter prefix's padding
left unmasked, every row on the first group's cache, and the prefix cut off from the gradient
(detached) each fail test_shared_forward_matches_the_padded_forward.
"""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from freshper.trainer.model.prefix import prefix_groups, reply_starts, share_order, shared_prefix_hidden

PAD = 0


def test_reply_starts_is_the_first_response_token_and_at_least_one():
    mask = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 0, 1, 0]], dtype=torch.bool)
    lengths = torch.tensor([4, 3, 2, 5])
    assert reply_starts(mask, lengths).tolist() == [2, 3, 1, 3]


def test_prefix_groups_share_by_content_not_by_position():
    tokens = torch.tensor([[5, 6, 7, 9], [5, 6, 8, 0], [5, 6, 7, 1], [4, 6, 7, 1]])
    first, group = prefix_groups(tokens, torch.tensor([3, 2, 3, 3]))
    assert first.tolist() == [0, 1, 3] and group.tolist() == [0, 1, 0, 2]


def test_share_order_puts_a_prompts_rows_together_longest_first():
    tokens = torch.tensor([[5, 6, 7, 9], [4, 6, 8, 0], [5, 6, 7, 1], [3, 3, 3, 1], [4, 6, 8, 2]])
    starts = torch.tensor([2, 2, 2, 2, 2])
    lengths = torch.tensor([3, 4, 4, 2, 3])
    order = share_order(tokens, starts, lengths)
    # prompt (5, 6): rows 2 (4 tokens), 0 (3); prompt (4, 6): rows 1 (4), 4 (3); prompt (3, 3): row 3
    assert order.tolist() == [2, 0, 1, 4, 3]
    again = share_order(tokens[order], starts[order], lengths[order])
    assert again.tolist() == list(range(5)), "rows already in order must keep their places"


@pytest.fixture
def float64_norms(monkeypatch):
    """RMSNorm in the input's dtype. Hugging Face's computes in float32 whatever the input (it is
    written for bf16 models), which leaves float32 rounding in a float64 model's backward: the
    shared forward sums a group's gradients before the norm's backward, the padded one after, and
    the two then differ by ~1e-7 relative even in "float64" (measured)."""
    from transformers.models.qwen2 import modeling_qwen2

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))
    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", forward)


def _model(dtype):
    cfg = Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=32, max_position_embeddings=128, pad_token_id=PAD,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(dtype)


def _rows():
    """Two prompts of lengths 7 and 4, three and two replies of varied lengths, one row alone,
    right-padded to 16: (tokens (6, 16), lengths (6,), starts (6,))."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 97, (7,), generator=g), torch.randint(1, 97, (4,), generator=g),
               torch.randint(1, 97, (5,), generator=g)]
    spec = [(0, 5), (0, 9), (0, 2), (1, 12), (1, 6), (2, 3)]
    tokens = torch.full((len(spec), 16), PAD, dtype=torch.long)
    lengths, starts = [], []
    for r, (p, reply) in enumerate(spec):
        row = torch.cat([prompts[p], torch.randint(1, 97, (reply,), generator=g)])
        tokens[r, :len(row)] = row
        lengths.append(len(row))
        starts.append(len(prompts[p]))
    return tokens, torch.tensor(lengths), torch.tensor(starts)


def _padded(decoder, tokens, lengths):
    attn = (torch.arange(tokens.shape[1])[None] < lengths[:, None]).long()
    return decoder(input_ids=tokens, attention_mask=attn).last_hidden_state


def _hidden_and_grads(model, fn, tokens, lengths, weights):
    """Hidden states at valid positions, and every parameter's gradient of a fixed random
    linear function of them."""
    model.zero_grad(set_to_none=True)
    h = fn(model.model, tokens, lengths)
    valid = torch.arange(tokens.shape[1])[None] < lengths[:, None]
    (h[valid] * weights.to(h.dtype)).sum().backward()
    return h[valid].detach().double(), [p.grad.double() for p in model.model.parameters()]


def test_shared_forward_matches_the_padded_forward(float64_norms):
    tokens, lengths, starts = _rows()
    weights = torch.randn(int(lengths.sum()), 64, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    shared = lambda d, t, n: shared_prefix_hidden(d, t, n, starts)  # noqa: E731
    ref_h, ref_g = _hidden_and_grads(_model(torch.float64), _padded, tokens, lengths, weights)
    # in float64 the two forwards agree to rounding
    h64, g64 = _hidden_and_grads(_model(torch.float64), shared, tokens, lengths, weights)
    torch.testing.assert_close(h64, ref_h, atol=1e-10, rtol=1e-10)
    for g, r in zip(g64, ref_g):
        assert (g - r).abs().max() <= 1e-10 * r.abs().max()
    # in float32, shared is as close to float64 as padded float32 is (the honest baseline)
    m32 = _model(torch.float32)
    base_h, base_g = _hidden_and_grads(m32, _padded, tokens, lengths, weights)
    h32, g32 = _hidden_and_grads(m32, shared, tokens, lengths, weights)
    base_err = (base_h - ref_h).abs().max()
    assert (h32 - ref_h).abs().max() <= 4 * base_err + 1e-7
    for g, b, r in zip(g32, base_g, ref_g):
        assert (g - r).abs().max() <= 4 * (b - r).abs().max() + 1e-7 * r.abs().max()


def test_rows_without_a_reply_and_one_shared_prompt():
    """Every row the same prompt, two of them with no reply tokens (all prefix)."""
    tokens, lengths, _ = _rows()
    tokens[:, :7] = tokens[0, :7]
    lengths = torch.tensor([7, 16, 9, 7, 12, 10])
    starts = torch.full((6,), 7)
    model = _model(torch.float64)
    first, group = prefix_groups(tokens, starts)
    assert first.tolist() == [0] and group.tolist() == [0] * 6
    valid = torch.arange(16)[None] < lengths[:, None]
    torch.testing.assert_close(shared_prefix_hidden(model.model, tokens, lengths, starts)[valid],
                               _padded(model.model, tokens, lengths)[valid], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("n_rows", [1, 4])
def test_all_prefix_rows(n_rows):
    """No row has a reply (a row of a prompt alone): the suffix forward is skipped."""
    tokens, lengths, starts = _rows()
    tokens, starts = tokens[:n_rows], starts[:n_rows]
    model = _model(torch.float64)
    valid = torch.arange(16)[None] < starts[:, None]
    torch.testing.assert_close(shared_prefix_hidden(model.model, tokens, starts, starts)[valid],
                               _padded(model.model, tokens, starts)[valid], atol=1e-10, rtol=1e-10)


def test_policy_update_on_shared_prompts_matches_whole_rows():
    """Policy.logprobs and Policy.update with `model.share_prefix` on and off, from the same
    weights on the same multi-turn episodes (FrozenLake, 2 replies per map, rows interleaved so
    that the shared side reorders them into micro-batches of 2 that share a prompt): log-probs,
    each row's KL, the first pass's own log-probs, loss and gradients agree, in the caller's row
    order, within 4x float32's own error (whole rows in float32 against float64). Checked once to
    fail: the row KLs or the log-probs left in the reordered order."""
    from freshper.trainer import config
    from freshper.trainer.config import env_kwargs
    from freshper.trainer.engines.base import Sampling
    from freshper.trainer.engines.hf import HFEngine
    from freshper.trainer.model.load import load_policy
    from freshper.trainer.model.policy import Policy, row_lengths
    from freshper.trainer.train.rollout import rollout

    base = {"train.sft_steps": 0, "algo.lr": 1e-3, "algo.warmup_steps": 0, "algo.micro_batch": 2}
    cfg = config.load("tiny", None, base)
    torch.manual_seed(0)
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    ep = rollout(HFEngine(model, tok), tok, "frozenlake", env_kwargs(cfg), [3, 4, 5, 6], 2,
                 cfg.rollout.max_new_tokens, cfg.rollout.max_len, Sampling(1.0, 1.0, 0))
    state = model.state_dict()
    mix = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])  # no two neighbours share a prompt
    tokens, mask = ep.tokens[mix], ep.mask[mix]
    lengths = row_lengths(mask)
    starts = reply_starts(mask, lengths)
    first, _ = prefix_groups(tokens, starts)
    assert len(first) < len(ep), "the episodes must share prompts"
    order = share_order(tokens, starts, lengths)
    assert all(len(prefix_groups(tokens[order[i:i + 2]], starts[order[i:i + 2]])[0]) == 1 for i in (0, 2, 4, 6)), \
        "the shared side's micro-batches must each share one prompt"
    adv = torch.tensor([1.0, -1.0] * (len(ep) // 2))[:, None] * mask.float()
    shift = torch.linspace(0.05, 0.4, len(ep))[:, None]  # old log-probs off by another amount in each row
    out = {}
    for name, share, dtype in (("shared", True, torch.float32), ("whole", False, torch.float32),
                               ("whole64", False, torch.float64)):
        c = config.load("tiny", None, {**base, "model.share_prefix": share})
        m, _, _ = load_policy(c, torch.device("cpu"))
        m.load_state_dict(state)
        policy = Policy(m.to(dtype), c, torch.device("cpu"))
        assert (policy._order(tokens, policy._starts(mask, lengths, None), lengths) is not None) == share
        fresh, _, _ = load_policy(c, torch.device("cpu"))
        fresh.load_state_dict(state)
        own = Policy(fresh.to(dtype), c, torch.device("cpu")).update(tokens, mask, None, adv)["logp"].double()
        lp = policy.logprobs(tokens, mask).double()
        st = policy.update(tokens, mask, lp.float() - shift * mask.float(), adv)
        grads = torch.cat([p.grad.double().flatten() for p in m.parameters()])
        out[name] = (lp, own, st["row_kl"].double(), torch.tensor([st["loss"], st["grad_norm"]], dtype=torch.float64),
                     grads)
    for i, what in enumerate(("log-probs", "the first pass's log-probs", "row KLs", "loss and grad norm",
                              "gradients")):
        err = (out["shared"][i] - out["whole"][i]).abs().max()
        base_err = (out["whole"][i] - out["whole64"][i]).abs().max()
        assert err <= 4 * base_err + 1e-9, f"{what}: shared vs whole {err:.3g}, float32's own error {base_err:.3g}"


def test_hf_engine_prefills_each_distinct_prompt_once():
    """HFEngine with share_prefix against without, on a batch that repeats three prompts of
    different lengths (left padding differs between them): the same greedy replies, and
    log-probs within 4x the float32 engine's own error against the same engine in float64.
    Checked once to fail: prompt positions numbered 0.. from the padded start (not by the
    attention mask) and every row on the first prompt's cache."""
    from freshper.trainer import config
    from freshper.trainer.config import env_kwargs
    from freshper.trainer.engines.base import Sampling
    from freshper.trainer.engines.hf import HFEngine
    from freshper.trainer.envs import make_env
    from freshper.trainer.model.chat import Episode
    from freshper.trainer.model.load import load_policy

    cfg = config.load("tiny", None, {"train.sft_steps": 0})
    torch.manual_seed(0)
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    env = make_env("frozenlake", **env_kwargs(cfg))
    distinct = [Episode(tok, env.opening(env.reset(s), 8)).ids for s in range(3)]
    distinct[1] = distinct[1][:-5]  # three lengths: the rows' left padding differs
    prompts = [distinct[i] for i in (0, 1, 0, 2, 1, 0)]
    greedy = Sampling(0.0, 1.0, 0)
    runs = {}
    for name, share, dtype in (("shared", True, torch.float32), ("whole", False, torch.float32),
                               ("whole64", False, torch.float64)):
        engine = HFEngine(model.to(dtype), tok, share_prefix=share)
        if share:
            assert engine._prompt_cache(*_left_padded(prompts, tok.pad_token_id), "cpu") is not None
        runs[name] = engine.generate(prompts, 12, greedy)
    model.float()
    assert runs["shared"].token_ids == runs["whole"].token_ids
    flat = {k: torch.tensor([x for row in g.logprobs for x in row], dtype=torch.float64) for k, g in runs.items()}
    err = (flat["shared"] - flat["whole"]).abs().max()
    base_err = (flat["whole"] - flat["whole64"]).abs().max()
    assert err <= 4 * base_err + 1e-9, f"shared vs whole {err:.3g}, float32's own error {base_err:.3g}"


def _left_padded(prompts, pad):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        attn[i, width - len(p):] = 1
    return ids, attn


def test_learned_absolute_positions_stay_inside_their_table():
    """GPT-2 has a table of max_position_embeddings learned positions. Row 1's prefix is long and
    its suffix short; row 0's the reverse: the padded suffix block would give row 1 positions up to
    P + S - 1 = 19, past a table of 12, although every row has 12 tokens. Clamped, the shared
    forward equals the padded one (float64); unclamped it indexes out of the table."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    model = GPT2Model(GPT2Config(vocab_size=50, n_positions=12, n_embd=16, n_layer=2, n_head=2)).double().eval()
    tokens = torch.randint(0, 50, (2, 12))
    lengths, starts = torch.tensor([12, 12]), torch.tensor([2, 10])
    with torch.no_grad():
        shared = shared_prefix_hidden(model, tokens, lengths, starts)
        whole = model(input_ids=tokens).last_hidden_state
    torch.testing.assert_close(shared, whole, rtol=1e-10, atol=1e-10)


def test_sliding_window_models_run_whole():
    """A sliding window counts positions of the padded block: such models take neither the
    shared-prompt forward nor the engine's turn cache."""
    from transformers import Gemma2Config, LlamaConfig, MistralConfig

    from freshper.trainer.model.load import full_attention

    assert full_attention(Qwen2Config()) and full_attention(LlamaConfig())
    assert not full_attention(MistralConfig(sliding_window=4096))
    assert not full_attention(Gemma2Config())
    assert full_attention(MistralConfig(sliding_window=None))

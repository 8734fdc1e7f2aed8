"""The chunked LM-head policy loss against eager logits + log_softmax + the reference loss."""
import pytest
import torch

from freshper.kernels import AGGREGATIONS, fused_linear_policy_loss, policy_loss_reference, token_logprobs


def make(B, T, H, V, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g, dtype=dtype)
    weight = torch.randn(V, H, generator=g, dtype=dtype) / H ** 0.5
    targets = torch.randint(0, V, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[0] = False
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4 - 1
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    w = torch.rand(B, generator=g, dtype=torch.float64)
    ref = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.1
    return hidden, weight, targets, mask, old, adv, w, ref


def eager(hidden, weight, targets, mask, old, adv, w, **kw):
    logp = torch.log_softmax((hidden @ weight.T).double(), -1).gather(-1, targets[..., None])[..., 0]
    return policy_loss_reference(logp, old, adv, mask, w, **kw)


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("chunk,vchunk", [(1, 7), (5, 16), (64, 1000)])
def test_matches_eager_float64(agg, chunk, vchunk):
    hidden, weight, targets, mask, old, adv, w, ref = make(3, 9, 16, 50, seed=chunk)
    kw = dict(agg=agg, ref_logp=ref, kl_coef=0.05)
    h1, w1 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    loss = fused_linear_policy_loss(h1, w1, targets, old, adv, mask, w, chunk_size=chunk, vocab_chunk=vchunk, **kw)
    g1 = torch.autograd.grad(loss, (h1, w1))
    h2, w2 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    want = eager(h2, w2, targets, mask, old, adv, w, **kw)
    g2 = torch.autograd.grad(want, (h2, w2))
    # token_logprobs works in float32: 1e-5 relative is its precision, not the reference's
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert g1[0][0].abs().sum() == 0  # the masked row gets no gradient


def test_bf16_against_float32_eager():
    hidden, weight, targets, mask, old, adv, w, _ = make(2, 12, 32, 300, seed=4, dtype=torch.float32)
    hb, wb = hidden.bfloat16().requires_grad_(True), weight.bfloat16().requires_grad_(True)
    loss = fused_linear_policy_loss(hb, wb, targets, old, adv, mask, w, chunk_size=8, vocab_chunk=64)
    g1 = torch.autograd.grad(loss, (hb, wb))
    assert g1[0].dtype == torch.bfloat16 and g1[1].dtype == torch.bfloat16
    h2, w2 = hidden.requires_grad_(True), weight.requires_grad_(True)
    want = eager(h2, w2, targets, mask, old, adv, w)
    g2 = torch.autograd.grad(want, (h2, w2))
    torch.testing.assert_close(loss.double(), want.double(), rtol=2e-2, atol=2e-2)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a.float(), b.float(), rtol=5e-2, atol=2e-2)


def test_token_logprobs_online_logsumexp():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(10, 8, generator=g) * 10  # large logits: the running max must rescale
    w = torch.randn(333, 8, generator=g)
    y = torch.randint(0, 333, (10,), generator=g)
    logp, lse = token_logprobs(h, w, y, chunk_size=3, vocab_chunk=50)
    logits = (h @ w.T).double()
    torch.testing.assert_close(lse.double(), torch.logsumexp(logits, -1), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(logp.double(), torch.log_softmax(logits, -1).gather(-1, y[:, None])[:, 0],
                               rtol=1e-5, atol=1e-4)


def test_stats_and_bad_input():
    hidden, weight, targets, mask, old, adv, w, _ = make(2, 5, 8, 20, seed=1)
    loss, stats = fused_linear_policy_loss(hidden, weight, targets, old, adv, mask, w, return_stats=True)
    assert stats["tokens"] == mask.sum()
    with pytest.raises(ValueError, match="lm_weight"):
        fused_linear_policy_loss(hidden, weight[:, :4], targets, old, adv, mask, w)
    bad = targets.clone()
    bad[mask] = 20
    with pytest.raises(ValueError, match="targets"):
        fused_linear_policy_loss(hidden, weight, bad, old, adv, mask, w)

"""The chunked LM-head policy loss against eager logits + log_softmax + the reference loss.

Low-precision runs are judged against a float64 reference of the same (bf16-rounded) inputs,
with a tolerance derived from eager bf16 autograd's own error on that case: the fused op may be
at most EAGER_FACTOR times as far from float64 as eager is. Wrong variants these tests were
checked to reject (and `test_criterion_rejects_wrong_gradients` keeps rejecting): gradients
zeroed, halved or negated; the one-hot term of d logp / d logits added outside the bf16 cast
(the defect this file was written against: relative error ~4 on confident tokens); the target
logit taken from a separate float32 dot product (log-probs above 0); a vocabulary chunk skipped.
"""
import pytest
import torch

from freshper.kernels import AGGREGATIONS, fused_linear_policy_loss, policy_loss_reference, token_logprobs

from ..device import DEVICE, on

# Headroom over eager bf16's error for a different reduction order (tiles, cuBLAS split-K);
# a halved gradient is off by 0.5 relative, ~100x eager's error on these cases.
EAGER_FACTOR = 1.5


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


def confident(T, H, V, seed, p_target=0.9999):
    """bf16 inputs whose mean p(target) is `p_target`: moderate logits, a large gap at each
    (distinct) target, as for the confident tokens that dominate LLM RL."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, H, generator=g)
    w = torch.randn(V, H, generator=g) / H ** 0.5
    y = torch.randperm(V, generator=g)[:T]
    direction = w[y] / (w[y] ** 2).sum(-1, keepdim=True)
    wb = w.bfloat16()
    lo, hi = 0.0, 80.0
    for _ in range(50):  # bisect the gap so that the bf16 inputs hit p_target in float64
        c = (lo + hi) / 2
        hb = (h + c * direction).bfloat16()
        p = torch.softmax(hb.double() @ wb.double().T, -1).gather(-1, y[:, None]).mean()
        lo, hi = (c, hi) if p < p_target else (lo, c)
    old = -torch.rand(1, T, generator=g, dtype=torch.float64) * 0.01
    adv = torch.randn(1, T, generator=g, dtype=torch.float64)
    return hb[None], wb, y[None], torch.ones(1, T, dtype=torch.bool), old, adv


def eager(hidden, weight, targets, mask, old, adv, w=None, **kw):
    """Eager logits in the inputs' dtype -> float32 log_softmax (float64 for float64 inputs)."""
    dt = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    logp = torch.log_softmax((hidden @ weight.T).to(dt), -1).gather(-1, targets[..., None])[..., 0]
    return policy_loss_reference(logp, old, adv, mask, w, **kw)


def grads(fn, hidden, weight, dtype):
    h = hidden.detach().to(dtype).requires_grad_(True)
    w = weight.detach().to(dtype).requires_grad_(True)
    return torch.autograd.grad(fn(h, w), (h, w))


def rel_l2(a, b):
    return float((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm())


def within_eager(got, ref, eager_grads) -> bool:
    """Each gradient at most EAGER_FACTOR x eager bf16's relative L2 error from float64."""
    return all(rel_l2(a, r) <= EAGER_FACTOR * rel_l2(e, r) for a, r, e in zip(got, ref, eager_grads))


def bf16_case(kind, seed):
    if kind == "confident":
        h, w, y, mask, old, adv = confident(48, 128, 600, seed)
        return on(h, w, y, mask, old, adv)
    hidden, weight, targets, mask, old, adv, _, _ = make(2, 24, 128, 600, seed, dtype=torch.float32)
    mask[0] = True
    return on(hidden.bfloat16(), weight.bfloat16(), targets, mask, old, adv)


def three_ways(h, w, y, mask, old, adv, **tiles):
    """(fused bf16, eager bf16, float64) gradients w.r.t. (hidden, weight) on the same inputs."""
    rest = (y, mask, old, adv)
    fused = grads(lambda a, b: fused_linear_policy_loss(a, b, y, old, adv, mask, **tiles), h, w, torch.bfloat16)
    eag = grads(lambda a, b: eager(a, b, *rest), h, w, torch.bfloat16)
    ref = grads(lambda a, b: eager(a, b, *rest), h, w, torch.float64)
    return fused, eag, ref


@pytest.mark.parametrize("kind", ["confident", "unconfident"])
@pytest.mark.parametrize("seed", [0, 1])
def test_bf16_gradients_no_worse_than_eager(kind, seed):
    fused, eag, ref = three_ways(*bf16_case(kind, seed), chunk_size=16, vocab_chunk=128)
    assert fused[0].dtype == torch.bfloat16 and fused[1].dtype == torch.bfloat16
    errs = [(rel_l2(a, r), rel_l2(e, r)) for a, r, e in zip(fused, ref, eag)]
    assert within_eager(fused, ref, eag), errs


def test_criterion_rejects_wrong_gradients():
    """The bf16 criterion has power: zeroed, halved and negated gradients all fail it."""
    fused, eag, ref = three_ways(*bf16_case("confident", 0), chunk_size=16, vocab_chunk=128)
    assert within_eager(fused, ref, eag)
    for wrong in (lambda t: t * 0, lambda t: t * 0.5, lambda t: -t):
        assert not within_eager([wrong(fused[0]), fused[1]], ref, eag)
        assert not within_eager([fused[0], wrong(fused[1])], ref, eag)


@pytest.mark.parametrize("kind", ["confident", "unconfident"])
def test_bf16_logprobs_never_positive_and_as_exact_as_eager(kind):
    h, w, y, mask, _, _ = bf16_case(kind, 2)
    hs, ys = h.reshape(-1, h.shape[-1]), y.reshape(-1)
    lp, lse = token_logprobs(hs, w, ys, chunk_size=8, vocab_chunk=64)
    want = torch.log_softmax(hs.double() @ w.double().T, -1).gather(-1, ys[:, None])[:, 0]
    eager_lp = torch.log_softmax((hs @ w.T).float(), -1).gather(-1, ys[:, None])[:, 0]
    assert (lp <= 0).all()
    eager_err = float((eager_lp.double() - want).abs().max())
    assert float((lp.double() - want).abs().max()) <= EAGER_FACTOR * eager_err + 1e-7


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("chunk,vchunk", [(1, 7), (5, 16), (64, 1000), (None, None)])
def test_matches_eager_float64(agg, chunk, vchunk):
    hidden, weight, targets, mask, old, adv, w, ref = on(*make(3, 9, 16, 50, seed=chunk or 0))
    kw = dict(agg=agg, ref_logp=ref, kl_coef=0.05)
    fused = grads(lambda a, b: fused_linear_policy_loss(a, b, targets, old, adv, mask, w, chunk_size=chunk,
                                                        vocab_chunk=vchunk, **kw), hidden, weight, torch.float64)
    want = grads(lambda a, b: eager(a, b, targets, mask, old, adv, w, **kw), hidden, weight, torch.float64)
    # log-probs are float32 inside the op: 1e-5 relative is its precision, not the reference's
    for a, b in zip(fused, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert fused[0][0].abs().sum() == 0  # the masked row gets no gradient


def test_loss_value_float64():
    hidden, weight, targets, mask, old, adv, w, ref = on(*make(3, 9, 16, 50, seed=3))
    loss = fused_linear_policy_loss(hidden, weight, targets, old, adv, mask, w, chunk_size=4, vocab_chunk=9)
    want = eager(hidden, weight, targets, mask, old, adv, w)
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)


def test_frozen_head_allocates_no_weight_gradient():
    """A frozen (or LoRA) head: backward must not build a (V, H) gradient nor run its matmul."""
    hidden, weight, targets, mask, old, adv, w, _ = make(2, 8, 16, 4000, seed=5, dtype=torch.float32)
    h = hidden.clone().requires_grad_(True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = fused_linear_policy_loss(h, weight, targets, old, adv, mask, w, chunk_size=4, vocab_chunk=512)
        (gh,) = torch.autograd.grad(loss, (h,))
    full = weight.numel() * weight.element_size()
    biggest = max((e.cpu_memory_usage for e in prof.events()), default=0)
    assert biggest < full, f"an allocation of {biggest} bytes >= the (V, H) weight ({full} bytes)"
    want = grads(lambda a, b: eager(a, b, targets, mask, old, adv, w), hidden, weight, torch.float64)[0]
    torch.testing.assert_close(gh.double(), want, rtol=1e-4, atol=1e-6)


def test_frozen_hidden_still_gives_weight_gradient():
    hidden, weight, targets, mask, old, adv, w, _ = make(2, 6, 8, 40, seed=6)
    wt = weight.clone().requires_grad_(True)
    (gw,) = torch.autograd.grad(fused_linear_policy_loss(hidden, wt, targets, old, adv, mask, w), (wt,))
    want = grads(lambda a, b: eager(a, b, targets, mask, old, adv, w), hidden, weight, torch.float64)[1]
    torch.testing.assert_close(gw, want, rtol=1e-4, atol=1e-6)


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
    with pytest.raises(ValueError, match="dtype"):
        fused_linear_policy_loss(hidden, weight.float(), targets, old, adv, mask, w)
    with pytest.raises(ValueError, match="vocab_chunk"):
        fused_linear_policy_loss(hidden, weight, targets, old, adv, mask, w, vocab_chunk=0)
    bad = targets.clone()
    bad[mask] = 20
    with pytest.raises(ValueError, match="targets"):
        fused_linear_policy_loss(hidden, weight, bad, old, adv, mask, w)


@pytest.mark.skipif(DEVICE != "cuda", reason="cuBLAS bf16 and the compiled loss kernel need a GPU")
def test_cuda_bf16_through_the_triton_loss():
    """On a GPU the loss inside runs the compiled Triton kernel; the gradients still hold."""
    h, w, y, mask, old, adv = bf16_case("confident", 3)
    assert h.is_cuda
    fused, eag, ref = three_ways(h, w, y, mask, old, adv)
    assert within_eager(fused, ref, eag)


def test_excluded_tokens_leave_the_softmax():
    """`exclude` (an engine's suppressed tokens): log-probs and both gradients equal a float64
    log_softmax with those columns at -inf; the excluded columns get no weight gradient. Checked
    to fail when the exclusion is dropped in the forward only, the backward only, or both."""
    hidden, weight, targets, mask, old, adv, w, _ = make(2, 12, 64, 300, 5)
    banned = torch.tensor([3, 64, 65, 299])  # inside one tile, across a tile edge, the last id
    targets = torch.where(torch.isin(targets, banned), targets + 1, targets) % 299
    targets = torch.where(torch.isin(targets, banned), torch.zeros_like(targets), targets)

    def ref(h, wt):
        z = (h @ wt.T).double()
        z[..., banned] = -torch.inf
        logp = torch.log_softmax(z, -1).gather(-1, targets[..., None])[..., 0]
        return policy_loss_reference(logp, old, adv, mask, w)

    want = grads(ref, hidden, weight, torch.float64)
    got = grads(lambda h, wt: fused_linear_policy_loss(h, wt, targets, old, adv, mask, w, exclude=banned,
                                                       chunk_size=8, vocab_chunk=64), hidden, weight, torch.float64)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)  # float32 log-probs inside, as above
    assert float(got[1][banned].abs().max()) == 0.0
    plain = grads(lambda h, wt: fused_linear_policy_loss(h, wt, targets, old, adv, mask, w, chunk_size=8,
                                                         vocab_chunk=64), hidden, weight, torch.float64)
    assert rel_l2(plain[0], want[0]) > 1e-3, "the check can tell the exclusion is dropped"
    hs, ys = hidden.reshape(-1, 64), targets.reshape(-1)
    lp, _ = token_logprobs(hs, weight, ys, exclude=banned, chunk_size=8, vocab_chunk=64)
    z = hs @ weight.T
    z[:, banned] = -torch.inf
    torch.testing.assert_close(lp.double(), torch.log_softmax(z, -1).gather(-1, ys[:, None])[:, 0], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="must not be in exclude"):
        fused_linear_policy_loss(hidden, weight, torch.full_like(targets, 64), old, adv, mask, exclude=banned)


@pytest.mark.parametrize("loss,level", [("cispo", "token"), ("clip", "sequence"), ("cispo", "sequence")])
@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_cispo_and_sequence_ratios_through_the_lm_head(loss, level, agg):
    """The fused op computes whole rows' log-probs before the loss, so CISPO and GSPO's sequence
    ratio go through it exactly as through eager logits."""
    hidden, weight, targets, mask, old, adv, w, ref = on(*make(3, 9, 16, 50, seed=7))
    old = old.clone()
    kw = dict(agg=agg, loss=loss, ratio_level=level)
    fused = grads(lambda a, b: fused_linear_policy_loss(a, b, targets, old, adv, mask, w, chunk_size=4,
                                                        vocab_chunk=16, **kw), hidden, weight, torch.float64)
    want = grads(lambda a, b: eager(a, b, targets, mask, old, adv, w, **kw), hidden, weight, torch.float64)
    plain = grads(lambda a, b: eager(a, b, targets, mask, old, adv, w, agg=agg), hidden, weight, torch.float64)
    for a, b in zip(fused, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(want[0], plain[0], rtol=1e-3, atol=1e-6), "the variant changes the gradient"

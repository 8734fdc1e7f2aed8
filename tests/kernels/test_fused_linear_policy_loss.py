"""The chunked LM-head policy loss against eager logits + log_softmax + the reference loss.

Low-precision runs are judged against a float64 reference of the same (bf16-rounded) inputs,
with a tolerance derived from eager bf16 autograd's own error on that case: the fused op may be
at most EAGER_FACTOR times as far from float64 as eager is. Wrong variants these tests were
checked to reject (and `test_criterion_rejects_wrong_gradients` keeps rejecting): gradients
zeroed, halved or negated; the one-hot term of d logp / d logits added outside the bf16 cast
(the defect this file was written against: relative error ~4 on confident tokens); the target
logit taken from a separate float32 dot product (log-probs above 0); a vocabulary chunk skipped.
"""
import importlib

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
    fused, eag, ref = three_ways(*bf16_case(kind, seed), chunk_size=16)
    assert fused[0].dtype == torch.bfloat16 and fused[1].dtype == torch.bfloat16
    errs = [(rel_l2(a, r), rel_l2(e, r)) for a, r, e in zip(fused, ref, eag)]
    assert within_eager(fused, ref, eag), errs


def test_criterion_rejects_wrong_gradients():
    """The bf16 criterion has power: zeroed, halved and negated gradients all fail it."""
    fused, eag, ref = three_ways(*bf16_case("confident", 0), chunk_size=16)
    assert within_eager(fused, ref, eag)
    for wrong in (lambda t: t * 0, lambda t: t * 0.5, lambda t: -t):
        assert not within_eager([wrong(fused[0]), fused[1]], ref, eag)
        assert not within_eager([fused[0], wrong(fused[1])], ref, eag)


@pytest.mark.parametrize("kind", ["confident", "unconfident"])
def test_bf16_logprobs_never_positive_and_as_exact_as_eager(kind):
    h, w, y, mask, _, _ = bf16_case(kind, 2)
    hs, ys = h.reshape(-1, h.shape[-1]), y.reshape(-1)
    lp, lse = token_logprobs(hs, w, ys, chunk_size=8)
    want = torch.log_softmax(hs.double() @ w.double().T, -1).gather(-1, ys[:, None])[:, 0]
    eager_lp = torch.log_softmax((hs @ w.T).float(), -1).gather(-1, ys[:, None])[:, 0]
    assert (lp <= 0).all()
    eager_err = float((eager_lp.double() - want).abs().max())
    assert float((lp.double() - want).abs().max()) <= EAGER_FACTOR * eager_err + 1e-7


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("chunk", [1, 5, 64, None])
def test_matches_eager_float64(agg, chunk):
    hidden, weight, targets, mask, old, adv, w, ref = on(*make(3, 9, 16, 50, seed=chunk or 0))
    kw = dict(agg=agg, ref_logp=ref, kl_coef=0.05)
    fused = grads(lambda a, b: fused_linear_policy_loss(a, b, targets, old, adv, mask, w, chunk_size=chunk, **kw),
                  hidden, weight, torch.float64)
    want = grads(lambda a, b: eager(a, b, targets, mask, old, adv, w, **kw), hidden, weight, torch.float64)
    # log-probs are float32 inside the op: 1e-5 relative is its precision, not the reference's
    for a, b in zip(fused, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert fused[0][0].abs().sum() == 0  # the masked row gets no gradient


def test_loss_value_float64():
    hidden, weight, targets, mask, old, adv, w, ref = on(*make(3, 9, 16, 50, seed=3))
    loss = fused_linear_policy_loss(hidden, weight, targets, old, adv, mask, w, chunk_size=4)
    want = eager(hidden, weight, targets, mask, old, adv, w)
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)


def test_frozen_head_allocates_no_weight_gradient():
    """A frozen (or LoRA) head: backward must not build a (V, H) gradient nor run its matmul."""
    hidden, weight, targets, mask, old, adv, w, _ = make(2, 8, 16, 4000, seed=5, dtype=torch.float32)
    h = hidden.clone().requires_grad_(True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = fused_linear_policy_loss(h, weight, targets, old, adv, mask, w, chunk_size=4)
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
    logp, lse = token_logprobs(h, w, y, chunk_size=3)
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
    with pytest.raises(ValueError, match="chunk_size"):
        fused_linear_policy_loss(hidden, weight, targets, old, adv, mask, w, chunk_size=0)
    with pytest.raises(ValueError, match="n_active"):
        fused_linear_policy_loss(hidden, weight, targets, old, adv, mask, w, n_active=int(mask.sum()) + 1)
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
                                                       chunk_size=8), hidden, weight, torch.float64)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)  # float32 log-probs inside, as above
    assert float(got[1][banned].abs().max()) == 0.0
    plain = grads(lambda h, wt: fused_linear_policy_loss(h, wt, targets, old, adv, mask, w, chunk_size=8),
                  hidden, weight, torch.float64)
    assert rel_l2(plain[0], want[0]) > 1e-3, "the check can tell the exclusion is dropped"
    hs, ys = hidden.reshape(-1, 64), targets.reshape(-1)
    lp, _ = token_logprobs(hs, weight, ys, exclude=banned, chunk_size=8)
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
    fused = grads(lambda a, b: fused_linear_policy_loss(a, b, targets, old, adv, mask, w, chunk_size=4, **kw),
                  hidden, weight, torch.float64)
    want = grads(lambda a, b: eager(a, b, targets, mask, old, adv, w, **kw), hidden, weight, torch.float64)
    plain = grads(lambda a, b: eager(a, b, targets, mask, old, adv, w, agg=agg), hidden, weight, torch.float64)
    for a, b in zip(fused, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(want[0], plain[0], rtol=1e-3, atol=1e-6), "the variant changes the gradient"


# ------------------------------------------------------------------ the GPU design, proved on CPU
def _gemm_flops(fn, *inputs):
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        loss = fn()
        torch.autograd.grad(loss, inputs)
    return fc.get_total_flops()


@pytest.mark.parametrize("level,gemms", [("token", 3), ("sequence", 4)])
def test_three_head_gemms(level, gemms):
    """Forward + backward cost exactly 3 x 2 n H V FLOPs (n active tokens) at token level, as
    eager's three over all tokens; GSPO's coupled rows take a fourth. Recomputing the logits in
    the backward (the old design) counted 4.00 at token level."""
    hidden, weight, targets, mask, old, adv, w, _ = make(3, 20, 32, 300, seed=2, dtype=torch.float32)
    h, wt = hidden.requires_grad_(True), weight.requires_grad_(True)
    n = int(mask.sum())
    flops = _gemm_flops(lambda: fused_linear_policy_loss(h, wt, targets, old, adv, mask, w, chunk_size=16,
                                                         ratio_level=level), h, wt)
    assert flops == gemms * 2 * n * 32 * 300


def test_sync_counter_sees_the_fused_loss_syncs():
    """The counter has power here: the default call (mask sum, target check) is seen."""
    from freshper.profiling.host_syncs import HostSyncs

    hidden, weight, targets, mask, old, adv, w, _ = make(2, 16, 16, 64, seed=4, dtype=torch.float32)
    h = hidden.requires_grad_(True)
    with HostSyncs() as syncs:
        loss = fused_linear_policy_loss(h, weight, targets, old, adv, mask, w, chunk_size=8)
        loss.backward()
    assert len(syncs.events) >= 3, syncs.report()


@pytest.mark.parametrize("path", ["reference", "triton"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_no_host_sync(path, level, monkeypatch):
    """With n_active from the caller and check=False, forward and backward make no host sync, on
    the torch reference and on the Triton row kernel's path (the one CUDA runs)."""
    mod = importlib.import_module("freshper.kernels.fused_linear_policy_loss")
    from freshper.kernels.logit_rows import rows_triton
    from freshper.profiling.host_syncs import HostSyncs

    if path == "triton":
        monkeypatch.setattr(mod, "rows", rows_triton)
    hidden, weight, targets, mask, old, adv, w, ref = on(*make(2, 16, 16, 64, seed=4, dtype=torch.float32))
    h, wt = hidden.requires_grad_(True), weight.requires_grad_(True)
    n = int(mask.sum())
    want = grads(lambda a, b: eager(a, b, targets, mask, old, adv, w, ref_logp=ref, kl_coef=0.1,
                                    ratio_level=level), hidden, weight, torch.float64)
    with HostSyncs() as syncs:
        loss = fused_linear_policy_loss(h, wt, targets, old, adv, mask, w, chunk_size=8, n_active=n, check=False,
                                        ref_logp=ref, kl_coef=0.1, ratio_level=level)
        loss.backward()
    assert not syncs.events, syncs.report()
    for a, b in zip((h.grad, wt.grad), want):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-6)


def test_no_grad_forward_runs_one_gemm():
    """Under no_grad (a skipped micro-batch, log-prob recomputation) only the logits GEMM runs."""
    from torch.utils.flop_counter import FlopCounterMode

    hidden, weight, targets, mask, old, adv, w, _ = make(2, 10, 16, 50, seed=1, dtype=torch.float32)
    h = hidden.requires_grad_(True)
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        loss, st = fused_linear_policy_loss(h, weight, targets, old, adv, mask, w, return_stats=True)
    assert fc.get_total_flops() == 2 * int(mask.sum()) * 16 * 50
    assert not loss.requires_grad
    torch.testing.assert_close(loss.double(), eager(hidden, weight, targets, mask, old, adv, w).double(), rtol=1e-5,
                               atol=1e-6)


def _mutated_rows(kind):
    """The row pass with one defect: the gradient's sign, the one-hot at the target + 1, or the
    second chunk's gradient never written (a missing chunk)."""
    from freshper.kernels.logit_rows import rows_reference

    calls = {"n": 0}

    def run(z, y, **kw):
        calls["n"] += 1
        if kind == "offbyone":
            return rows_reference(z, (y + 1) % z.shape[1], **kw)
        out = rows_reference(z, y, **kw)
        if kind == "sign":
            z.neg_()
        if kind == "missing" and calls["n"] == 2:
            z.zero_()
        return out

    return run


@pytest.mark.parametrize("kind", ["sign", "offbyone", "missing"])
def test_criterion_rejects_a_wrong_row_pass(kind, monkeypatch):
    """The bf16 criterion fails for a flipped gradient, an off-by-one target and a missing chunk."""
    mod = importlib.import_module("freshper.kernels.fused_linear_policy_loss")

    case = bf16_case("confident", 0)
    fused, eag, ref = three_ways(*case, chunk_size=16)
    assert within_eager(fused, ref, eag)
    monkeypatch.setattr(mod, "rows", _mutated_rows(kind))
    bad, _, _ = three_ways(*case, chunk_size=16)
    assert not within_eager(bad, ref, eag)


def test_float32_accumulation_across_chunks():
    """grad_weight over many chunks: in bf16 (one rounding per chunk) and in float32 (rounded once,
    as eager), each judged against eager bf16's own error; the float32 accumulator is at most
    EAGER_FACTOR x eager, the bf16 one within sqrt(chunks) x that (one more rounding per chunk)."""
    h, w, y, mask, old, adv = bf16_case("unconfident", 1)
    chunks = -(-int(mask.sum()) // 4)
    fused16, eag, ref = three_ways(h, w, y, mask, old, adv, chunk_size=4)
    fused32, _, _ = three_ways(h, w, y, mask, old, adv, chunk_size=4, accum_dtype=torch.float32)
    assert fused32[1].dtype == torch.bfloat16
    assert rel_l2(fused32[1], ref[1]) <= EAGER_FACTOR * rel_l2(eag[1], ref[1])
    assert rel_l2(fused16[1], ref[1]) <= EAGER_FACTOR * chunks ** 0.5 * rel_l2(eag[1], ref[1])


def test_truncated_is_without_a_cap_is_the_plain_ratio():
    """tis_logp without tis_cap: the IS factor untruncated, as policy_loss takes it (the row pass's
    reference once raised on the missing cap)."""
    hidden, weight, targets, mask, old, adv, w, ref = on(*make(2, 7, 16, 40, seed=8))
    tis = old - 0.3 * torch.rand(old.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = grads(lambda a, b: fused_linear_policy_loss(a, b, targets, old, adv, mask, w, tis_logp=tis),
                hidden, weight, torch.float64)
    want = grads(lambda a, b: eager(a, b, targets, mask, old, adv, w, tis_logp=tis), hidden, weight, torch.float64)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", ["confident", "unconfident"])
def test_float32_logits_from_bf16_operands(kind):
    """logits_dtype=float32 on bf16 hidden and head: log-probs as near float64 (of the same
    bf16-rounded operands) as an eager float32 GEMM's, where rounding the logits to bf16 (the
    default, and the mutant this rejects) is far outside that; the loss's gradients still within
    eager bf16's error, and its log-probs the same as token_logprobs'."""
    h, w, y, mask, old, adv = bf16_case(kind, 3)
    hs, ys = h.reshape(-1, h.shape[-1]), y.reshape(-1)
    want = torch.log_softmax(hs.double() @ w.double().T, -1).gather(-1, ys[:, None])[:, 0]
    f32 = torch.log_softmax(hs.float() @ w.float().T, -1).gather(-1, ys[:, None])[:, 0]
    bound = EAGER_FACTOR * float((f32.double() - want).abs().max()) + 1e-7
    lp, _ = token_logprobs(hs, w, ys, chunk_size=8, logits_dtype=torch.float32)
    lp16, _ = token_logprobs(hs, w, ys, chunk_size=8)
    assert float((lp.double() - want).abs().max()) <= bound
    assert float((lp16.double() - want).abs().max()) > 10 * bound
    fused, eag, ref = three_ways(h, w, y, mask, old, adv, chunk_size=16, logits_dtype=torch.float32)
    assert fused[0].dtype == torch.bfloat16 and within_eager(fused, ref, eag)
    _, st = fused_linear_policy_loss(h, w, y, old, adv, mask, chunk_size=16, logits_dtype=torch.float32,
                                     return_stats=True)
    sel = mask.reshape(-1).bool()
    torch.testing.assert_close(st["logp"].reshape(-1)[sel], lp[sel], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="logits_dtype must be None or torch.float32"):
        fused_linear_policy_loss(h, w, y, old, adv, mask, logits_dtype=torch.float64)


def test_fp16_gradients_survive_with_a_loss_scale():
    """fp16 operands and small advantages: unscaled, the gradient d loss / d logits (~1e-9) is
    below fp16's smallest subnormal (6e-8) and rounds to 0. With grad_scale S (the caller
    backpropagates S x loss) it is formed at S x its size, and the gradients divided by S are
    within EAGER_FACTOR x eager fp16's (with the same scaling) error against float64. Without
    the scale the same criterion fails: that is the underflow this option exists for."""
    hidden, weight, targets, mask, old, adv, _, _ = make(2, 24, 128, 600, 5, dtype=torch.float32)
    mask[0] = True
    h, w, y, mask, old, adv = on(hidden.half(), weight.half(), targets, mask, old, adv * 1e-4)
    S = 2.0 ** 16
    rest = (y, old, adv, mask)
    fused = lambda a, b: fused_linear_policy_loss(a, b, *rest, chunk_size=16, grad_scale=S) * S  # noqa: E731
    scaled = [g.double() / S for g in grads(fused, h, w, torch.float16)]
    plain = grads(lambda a, b: fused_linear_policy_loss(a, b, *rest, chunk_size=16), h, w, torch.float16)
    eag = [g.double() / S for g in grads(lambda a, b: eager(a, b, y, mask, old, adv) * S, h, w, torch.float16)]
    ref = grads(lambda a, b: eager(a, b, y, mask, old, adv), h, w, torch.float64)
    assert within_eager(scaled, ref, eag), [(rel_l2(a, r), rel_l2(e, r)) for a, r, e in zip(scaled, ref, eag)]
    assert not within_eager(plain, ref, eag)
    assert float((plain[1] == 0).float().mean()) > 0.9  # the unscaled head gradient underflowed
    with pytest.raises(ValueError, match="grad_scale must be a finite number > 0"):
        fused_linear_policy_loss(h, w, *rest, grad_scale=0.0)


def test_out_dtype_probed_per_op_and_device(monkeypatch):
    """cuBLAS's out_dtype is probed once per op, device type and dtype on tiny tensors: torch's CPU
    build lacks it (NotImplementedError), its meta device has both ops; one op failing leaves the
    other in use, and the probe's answer is cached rather than re-learned from a real call's error."""
    mod = importlib.import_module("freshper.kernels.fused_linear_policy_loss")
    monkeypatch.setattr(mod, "_OUT_DTYPE", {})
    assert not mod.has_out_dtype("mm", "cpu") and not mod.has_out_dtype("addmm", "cpu")
    real, calls = torch.addmm, []

    def addmm(*args, **kwargs):
        calls.append(kwargs.get("out_dtype"))
        if "out_dtype" in kwargs:
            raise TypeError("addmm() got an unexpected keyword argument 'out_dtype'")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "addmm", addmm)
    assert mod.has_out_dtype("mm", "meta") and mod.has_out_dtype("mm", "meta", torch.float16)
    assert not mod.has_out_dtype("addmm", "meta")
    assert mod.has_out_dtype("mm", "meta") and not mod.has_out_dtype("addmm", "meta")
    assert calls == [torch.float32]  # probed once
    with pytest.raises(ValueError, match="op must be"):
        mod.has_out_dtype("bmm", "meta")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["mm", "addmm"])
def test_the_probe_reads_a_call_that_rounds_as_unsupported(op, dtype, monkeypatch):
    """A torch whose mm or addmm takes out_dtype=float32 but rounds the sum to the operands' dtype
    (a silent low-precision accumulation) reads as lacking out_dtype; one that keeps the float32
    sum, as having it. Faked on the CPU, whose build has neither op. Fails with the probe's value
    check removed (checked once: the rounding fake then reads as supported)."""
    mod = importlib.import_module("freshper.kernels.fused_linear_policy_loss")

    def fake(rounds):
        def gemm(*args, out_dtype=None, out=None):
            *c, a, b = args
            r = a.double() @ b.double() + (c[0].double() if c else 0.0)
            return out.copy_(r.to(a.dtype) if rounds else r)
        return gemm

    for rounds in (True, False):
        monkeypatch.setattr(mod, "_OUT_DTYPE", {})
        monkeypatch.setattr(torch, op, fake(rounds))
        assert mod.has_out_dtype(op, "cpu", dtype) is not rounds, (op, dtype, rounds)


# Each combination of mm's and addmm's out_dtype, and the float32-logits path it must choose.
CAPABILITIES = [((True, True), "out_dtype"), ((True, False), "out_dtype-mm"), ((False, False), "upcast"),
                ((False, True), "upcast")]


@pytest.mark.parametrize("caps,path", CAPABILITIES)
def test_the_float32_logits_path_follows_what_torch_supports(caps, path, monkeypatch):
    """The probe faked for each combination (torch 2.10+ on CUDA; 2.8-2.9, addmm without a float32
    accumulator; before 2.8 and the CPU): the path's name, whether it is slower than eager, and
    what the loss then runs on the meta device. GEMM 1 writes float32 itself (mm's dtype_out
    overload) or runs on a float32 copy of the weight made once a call; GEMM 3 sums into float32
    (addmm's dtype_out) only on the "out_dtype" path. Fails with GEMM 3 chosen by mm's answer alone
    (it would ask 2.8-2.9's addmm for out_dtype) and with GEMM 1 ignoring the probe (checked once)."""
    mod = importlib.import_module("freshper.kernels.fused_linear_policy_loss")
    have = dict(zip(("mm", "addmm"), caps))
    monkeypatch.setattr(mod, "has_out_dtype", lambda op, device, dtype=torch.bfloat16: have[op])
    assert mod.logits32_path("meta") == path == mod.logits32_path("cuda", torch.float16)
    assert mod.slower_than_eager(path, "cuda") is (path == "upcast")
    assert not mod.slower_than_eager(path, "cpu")
    ops, _, (V, H) = _chunk_passes(monkeypatch, torch.float32, overloads=True)
    gemm1 = [o for o in ops if o[0].startswith("mm.") and o[1][-1] == V]
    own = path != "upcast"
    assert [o[0] for o in gemm1] == ["mm.dtype_out" if own else "mm.out"] * 4, gemm1
    assert {o[2] for o in gemm1} == {torch.float32}
    weight_up = [o for o in ops if o[0].startswith("_to_copy") and o[1] == (V, H) and o[2] == torch.float32]
    assert len(weight_up) == (0 if own else 1), weight_up
    gemm3 = [(o[0], o[2]) for o in ops if o[0].startswith("addmm") and o[1] == (V, H)]
    want = ("addmm.dtype_out", torch.float32) if path == "out_dtype" else ("addmm.out", torch.bfloat16)
    assert gemm3 == [want] * 4, gemm3
    with pytest.raises(ValueError, match="path must be one of"):
        mod.slower_than_eager("fast", "cuda")


# ------------------------------------------------------ float32 logits: no cast pass, float32 sums
def _chunk_passes(monkeypatch, logits_dtype, share=True, cast=False, overloads=False):
    """Run forward + backward on the meta device (whose mm and addmm take out_dtype, as cuBLAS's
    do) with the row pass stubbed, and return the (op, shape, dtype) of every tensor the fused
    op's own code makes: the GEMMs and the glue the CUDA path runs, without its kernel. `overloads`:
    each op named with its overload ("mm.dtype_out", "mm.out")."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from freshper.kernels.logit_rows import grad_buffer

    mod = importlib.import_module("freshper.kernels.fused_linear_policy_loss")
    seen_out = []

    def rows_stub(z, y, *, mode="loss", out=None, **kw):
        seen_out.append(None if out is None else out.dtype)
        if cast:  # the wrong variant: a cast pass over the chunk
            z.to(torch.bfloat16)
        n = z.shape[0]
        return (torch.empty(n, device=z.device), torch.empty(n, device=z.device),
                torch.empty(n, 4, device=z.device) if mode == "loss" else None)

    monkeypatch.setattr(mod, "rows", rows_stub)
    monkeypatch.setattr(mod, "grad_buffer", lambda z, dt: grad_buffer(z, dt, share=share), raising=False)

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                name = func.overloadpacket.__name__ + (f".{func._overloadname}" if overloads else "")
                self.ops.append((name, tuple(out.shape), out.dtype))
            return out

    B, T, H, V, chunk = 2, 40, 24, 300, 16
    h = torch.empty(B, T, H, dtype=torch.bfloat16, device="meta", requires_grad=True)
    w = torch.empty(V, H, dtype=torch.bfloat16, device="meta", requires_grad=True)
    y = torch.empty(B, T, dtype=torch.int64, device="meta")
    mask, old, adv = (torch.empty(B, T, device="meta", dtype=dt) for dt in (torch.bool, torch.float32, torch.float32))
    with Ops() as rec:
        loss = mod.fused_linear_policy_loss(h, w, y, old, adv, mask, n_active=50, check=False, chunk_size=chunk,
                                            logits_dtype=logits_dtype)
        loss.backward()
    return rec.ops, seen_out, (V, H)


@pytest.mark.parametrize("logits_dtype", [None, torch.float32])
def test_float32_logits_make_no_cast_pass(logits_dtype, monkeypatch):
    """The float32-logits path as CUDA runs it: no chunk-sized cast (`_to_copy`, `copy_`) and no
    chunk-sized allocation per chunk; the row pass is handed a bf16 destination (z's own memory)
    and GEMM 3 sums the weight gradient into float32 (out_dtype), rounded once at the end. Fails
    on 47a7be5, whose `z.to(bf16)` after each chunk's row pass is the cast counted here, and
    when float32 logits keep a bf16 accumulator."""
    ops, outs, (V, H) = _chunk_passes(monkeypatch, logits_dtype)
    chunky = [o for o in ops if len(o[1]) == 2 and V in o[1] and min(o[1]) > 1 and o[1] != (V, H)]
    casts = [o for o in chunky if o[0] in ("_to_copy", "copy_", "to")]
    assert not casts, casts
    allocs = [o for o in chunky if o[0] in ("empty", "empty_like", "new_empty", "zeros", "empty_strided")]
    assert len(allocs) == 1, allocs  # the one logits buffer, reused by every chunk
    assert outs == [torch.bfloat16] * len(outs) and len(outs) == 4  # 50 tokens, chunks of 16
    gemm3 = [o[2] for o in ops if o[0] == "addmm" and o[1] == (V, H)]  # not out_dtype's 2x2 probe
    assert gemm3 == [torch.float32 if logits_dtype else torch.bfloat16] * 4, gemm3


def test_the_cast_counter_sees_a_cast(monkeypatch):
    """The counter has power: a separate gradient buffer shows as a second chunk-sized
    allocation, and a row pass that casts its chunk (47a7be5's `z.to(bf16)`) as a `_to_copy`."""
    ops, _, (V, _) = _chunk_passes(monkeypatch, torch.float32, share=False)
    assert sum(1 for o in ops if o[0] == "empty" and len(o[1]) == 2 and o[1][1] == V) == 2
    ops, _, _ = _chunk_passes(monkeypatch, torch.float32, cast=True)
    assert ("_to_copy", (16, V), torch.bfloat16) in ops


def test_float32_logits_sum_the_weight_gradient_in_float32_where_that_is_free(monkeypatch):
    """The default accumulator: float32 for float32 logits where GEMM 3 writes float32 itself
    (the meta test above: CUDA's path), the weight's dtype where it cannot (the CPU: an upcast
    and a float32 GEMM a chunk). On the CPU an explicit accum_dtype=float32 over 9 chunks is at
    most EAGER_FACTOR x eager bf16's error from float64."""
    mod = importlib.import_module("freshper.kernels.fused_linear_policy_loss")
    assert mod.default_accum(torch.float32, torch.bfloat16, "meta") == torch.float32
    assert mod.default_accum(torch.bfloat16, torch.bfloat16, "meta") == torch.bfloat16
    assert mod.default_accum(torch.float32, torch.bfloat16, "cpu") == torch.bfloat16
    h, w, y, mask, old, adv = bf16_case("unconfident", 1)
    f32, eag, ref = three_ways(h, w, y, mask, old, adv, chunk_size=4, logits_dtype=torch.float32,
                               accum_dtype=torch.float32)
    assert rel_l2(f32[1], ref[1]) <= EAGER_FACTOR * rel_l2(eag[1], ref[1])


def test_chunks_are_sized_in_tokens():
    """At least 1,024 tokens a chunk at V = 151,936 on CUDA, whatever the logits' dtype (the byte
    budget of 47a7be5 gave 832 in bf16 and 384 in float32), more at a smaller vocabulary, a
    multiple of 64, never more than the tokens there are."""
    from freshper.kernels.fused_linear_policy_loss import default_chunk

    assert default_chunk(4096, 151_936, "cuda") == 1024
    assert default_chunk(8192, 49_152, "cuda") == 2688
    assert default_chunk(300, 151_936, "cuda") == 300
    assert default_chunk(4096, 151_936, "cpu") == 64
    with pytest.raises(ValueError, match="vocab must be a positive int"):
        default_chunk(10, 0)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_grad_scale_divides_out_at_both_ratio_levels(level):
    """grad_scale S: the caller backpropagates S x loss and gets S x the gradients (formed at
    that scale, so that fp16 keeps their small parts), at token level and along GSPO's two-pass
    sequence-level path. Checked to fail (65,536x too small) when the sequence-level path drops
    grad_scale."""
    hidden, weight, targets, mask, old, adv, w, _ = on(*make(3, 9, 16, 50, seed=11))
    S = 2.0 ** 16
    kw = dict(ratio_level=level, chunk_size=4)
    scaled = grads(lambda a, b: fused_linear_policy_loss(a, b, targets, old, adv, mask, w, grad_scale=S, **kw) * S,
                   hidden, weight, torch.float64)
    plain = grads(lambda a, b: fused_linear_policy_loss(a, b, targets, old, adv, mask, w, **kw),
                  hidden, weight, torch.float64)
    for a, b in zip(scaled, plain):
        torch.testing.assert_close(a / S, b, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_the_packed_gradient_through_the_loss(level, monkeypatch):
    """The whole loss with float32 logits, bf16 operands, the Triton row pass (interpreted) and
    its gradient written into the logits' own memory, as on CUDA, at token level and along
    GSPO's two-pass path: within eager bf16's error."""
    from freshper.kernels.logit_rows import grad_buffer, rows_triton

    mod = importlib.import_module("freshper.kernels.fused_linear_policy_loss")
    monkeypatch.setattr(mod, "rows", rows_triton)
    monkeypatch.setattr(mod, "grad_buffer", lambda z, dt: grad_buffer(z, dt, share=True))
    h, w, y, mask, old, adv = bf16_case("confident", 0)
    kw = dict(ratio_level=level)
    rest = (y, mask, old, adv)
    fused = grads(lambda a, b: fused_linear_policy_loss(a, b, y, old, adv, mask, chunk_size=16,
                                                        logits_dtype=torch.float32, **kw), h, w, torch.bfloat16)
    eag = grads(lambda a, b: eager(a, b, *rest, **kw), h, w, torch.bfloat16)
    ref = grads(lambda a, b: eager(a, b, *rest, **kw), h, w, torch.float64)
    assert within_eager(fused, ref, eag), [(rel_l2(a, r), rel_l2(e, r)) for a, r, e in zip(fused, ref, eag)]

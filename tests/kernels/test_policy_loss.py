"""The policy-loss kernel (interpreted on CPU) against the float64 autograd reference."""
import itertools

import pytest
import torch

from freshper.kernels import AGGREGATIONS, policy_loss, policy_loss_reference, policy_loss_triton

from ..device import on

# (dtype of logp and friends, atol, rtol) against float64 on the same (rounded) inputs. The
# kernel computes in float32 and rounds the gradient to logp's dtype once: fp32 is good to
# ~1e-6 relative, bf16 to its half-ulp 2^-9 (two ulps allowed: 2^-7). Gradient entries are
# ~1e-2 here, so an absolute tolerance near that would pass a halved or zeroed gradient;
# these were checked to fail: gradient halved, negated, zeroed; clip branch inverted.
DTYPES = [(torch.float32, 1e-6, 1e-5), (torch.bfloat16, 1e-6, 2 ** -7)]


def make_inputs(B, T, seed, dtype=torch.float32, adv_per_seq=False, spread=0.3, empty_rows=(), short_rows=()):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g) * 3
    old = logp + torch.randn(B, T, generator=g) * spread
    adv = torch.randn(B, generator=g) if adv_per_seq else torch.randn(B, T, generator=g)
    adv[adv.abs() < 0.2] = 0.0  # exact zeros on purpose
    mask = torch.rand(B, T, generator=g) > 0.25
    for r in empty_rows:
        mask[r] = False
    for r in short_rows:
        mask[r] = False
        mask[r, 0] = True
    ref = logp + torch.randn(B, T, generator=g) * 0.1
    tis = old + torch.randn(B, T, generator=g) * 0.2
    w = torch.rand(B, generator=g) + 0.05
    cast = lambda t: t.to(dtype)  # noqa: E731
    return cast(logp), cast(old), adv, mask, w, cast(ref), cast(tis)


def compare(logp, old, adv, mask, w, atol, rtol, **kw):
    leaf = on(logp.clone()).requires_grad_(True)
    dkw = {k: on(v) for k, v in kw.items()}
    loss, stats = policy_loss_triton(leaf, *on(old, adv, mask), on(w), return_stats=True, **dkw)
    (grad,) = torch.autograd.grad(loss, leaf)
    loss, grad, stats = loss.cpu(), grad.cpu(), {k: v.cpu() for k, v in stats.items()}
    ref64 = logp.double().requires_grad_(True)
    kw64 = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    want, want_stats = policy_loss_reference(ref64, old.double(), adv.double(), mask,
                                             None if w is None else w.double(), return_stats=True, **kw64)
    (want_grad,) = torch.autograd.grad(want, ref64)
    torch.testing.assert_close(loss.double(), want, atol=atol, rtol=rtol)
    torch.testing.assert_close(grad.double(), want_grad, atol=atol, rtol=rtol)
    assert grad.dtype == logp.dtype
    for k in want_stats:
        torch.testing.assert_close(stats[k].double(), want_stats[k].double(), atol=atol, rtol=rtol)


SHAPES = [(1, 1), (2, 5), (4, 37), (3, 300)]


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_plain_loss(B, T, agg, dtype, atol, rtol):
    logp, old, adv, mask, w, ref, tis = make_inputs(B, T, seed=B * 1000 + T, dtype=dtype)
    compare(logp, old, adv, mask, None, atol, rtol, agg=agg)


OPTIONS = list(itertools.product([False, True], [False, True], [False, True], [False, True]))


@pytest.mark.parametrize("weights,kl,tis,per_seq", OPTIONS)
@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_options(weights, kl, tis, per_seq, agg):
    logp, old, adv, mask, w, ref, tis_lp = make_inputs(5, 23, seed=7, adv_per_seq=per_seq, empty_rows=(2,),
                                                       short_rows=(4,))
    kw = dict(agg=agg, clip_low=0.2, clip_high=0.28)
    if kl:
        kw.update(ref_logp=ref, kl_coef=0.05)
    if tis:
        kw.update(tis_logp=tis_lp, tis_cap=1.5)
    compare(logp, old, adv, mask, w if weights else None, 1e-6, 1e-5, **kw)


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_extreme_ratios_and_bf16_options(agg):
    """Ratios from e^-12 to e^12: the clip must bind, gradients vanish where it does."""
    logp, old, adv, mask, w, ref, tis = make_inputs(4, 64, seed=3, spread=6.0)
    compare(logp, old, adv, mask, w, 1e-6, 1e-5, agg=agg, ref_logp=ref, kl_coef=0.1, tis_logp=tis, tis_cap=2.0)
    b = [t.bfloat16() for t in (logp, old, ref, tis)]
    compare(b[0], b[1], adv, mask, w, 1e-2, 1e-2, agg=agg, ref_logp=b[2], kl_coef=0.1, tis_logp=b[3], tis_cap=2.0)


def test_long_sequences_loop_over_blocks():
    logp, old, adv, mask, w, ref, tis = make_inputs(2, 2100, seed=11)
    compare(logp, old, adv, mask, w, 1e-6, 1e-5, agg="seq-mean-token-sum", ref_logp=ref, kl_coef=0.01)


def test_all_masked_batch_is_zero_with_zero_gradient():
    logp, old, adv, mask, w, _, _ = make_inputs(3, 9, seed=0, empty_rows=(0, 1, 2))
    for agg in AGGREGATIONS:
        compare(logp, old, adv, mask, w, 0, 0, agg=agg)
        leaf = on(logp.clone()).requires_grad_(True)
        loss = policy_loss_triton(leaf, *on(old, adv, mask, w), agg=agg)
        assert loss.item() == 0.0


def test_non_contiguous_and_float_mask():
    logp, old, adv, mask, w, _, _ = make_inputs(4, 30, seed=5)
    wide = torch.zeros(4, 60)
    wide[:, ::2] = logp
    compare(wide[:, ::2], old, adv, mask.float(), w, 1e-6, 1e-5, agg="token-mean")
    compare(logp.T.contiguous().T, old, adv, mask, w, 1e-6, 1e-5)


def test_dispatch_on_cpu_is_the_reference():
    logp, old, adv, mask, w, ref, _ = make_inputs(3, 8, seed=1)
    a = policy_loss(logp, old, adv, mask, w, ref_logp=ref, kl_coef=0.1)
    b = policy_loss_reference(logp, old, adv, mask, w, ref_logp=ref, kl_coef=0.1)
    assert torch.equal(a, b)


def test_zero_advantage_has_zero_policy_gradient():
    logp, old, _, mask, w, _, _ = make_inputs(2, 6, seed=2)
    leaf = on(logp.clone()).requires_grad_(True)
    loss = policy_loss_triton(leaf, *on(old, torch.zeros(2, 6), mask, w))
    (g,) = torch.autograd.grad(loss, leaf)
    assert loss.item() == 0.0 and torch.count_nonzero(g) == 0


@pytest.mark.parametrize("kw,name", [
    (dict(agg="mean"), "agg"), (dict(clip_low=1.0), "clip_low"), (dict(clip_high=-0.1), "clip_high"),
    (dict(kl_coef=0.1), "ref_logp"), (dict(tis_cap=2.0), "tis_cap"), (dict(kl_coef=-1.0), "kl_coef"),
])
def test_rejects_bad_arguments(kw, name):
    logp, old, adv, mask, w, _, _ = make_inputs(2, 4, seed=0)
    for fn in (policy_loss_triton, policy_loss_reference):
        with pytest.raises(ValueError, match=name):
            fn(*on(logp, old, adv, mask, w), **kw)


def test_rejects_bad_shapes():
    logp, old, adv, mask, w, _, _ = make_inputs(2, 4, seed=0)
    with pytest.raises(ValueError, match="old_logp"):
        policy_loss(logp, old[:, :3], adv, mask, w)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, old, adv[:, :2], mask, w)
    with pytest.raises(ValueError, match="weights"):
        policy_loss(logp, old, adv, mask, w[:1])


# ---------------------------------------------------------------- CISPO and sequence-level ratios
@pytest.mark.parametrize("weights,kl,tis,per_seq", OPTIONS[::3])
@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_cispo_kernel_against_the_float64_reference(weights, kl, tis, per_seq, agg):
    logp, old, adv, mask, w, ref, tis_lp = make_inputs(3, 37, seed=11, adv_per_seq=per_seq, spread=0.5)
    kw = {"agg": agg, "loss": "cispo", "clip_high": 0.28}
    if kl:
        kw.update(ref_logp=ref, kl_coef=0.1)
    if tis:
        kw.update(tis_logp=tis_lp, tis_cap=2.0)
    compare(logp, old, adv, mask, w if weights else None, 1e-6, 1e-5, **kw)


def _agg(tok, mask, agg):
    m = mask.double()
    n = m.sum(-1)
    if agg == "token-mean":
        return (tok * m).sum() / n.sum()
    if agg == "seq-mean-token-mean":
        return ((tok * m).sum(-1)[n > 0] / n[n > 0]).mean()
    return (tok * m).sum(-1)[n > 0].mean()


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_cispo_is_the_capped_detached_ratio_times_the_log_prob(agg):
    """Written out from MiniMax-M1's CISPO: loss -sg(min(r, 1 + eps)) A logp, so the gradient of a
    token is -min(r, 1 + eps) A times its aggregation weight, never 0 for a clipped token."""
    logp, old, adv, mask, *_ = make_inputs(4, 9, seed=5, spread=0.6)
    lp = logp.double().requires_grad_(True)
    got = policy_loss_reference(lp, old.double(), adv.double(), mask, agg=agg, loss="cispo", clip_high=0.2)
    (grad,) = torch.autograd.grad(got, lp)
    r = torch.exp(logp.double() - old.double())
    c = r.clamp(max=1.2)
    want = _agg(-c * adv.double() * logp.double(), mask, agg)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    lp2 = logp.double().requires_grad_(True)
    (want_grad,) = torch.autograd.grad(_agg(-c * adv.double() * lp2, mask, agg), lp2)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)
    assert ((r > 1.2) & mask & (adv != 0) & (grad != 0)).any(), "a clipped token keeps its gradient"


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_sequence_level_ratio_is_gspos(agg):
    """Written out from GSPO: each row's ratio exp(mean of its log-ratios), clipped as PPO's, for
    all its tokens; its gradient reaches every token of the row, not only the token's own."""
    logp, old, adv, mask, *_ = make_inputs(4, 9, seed=6, adv_per_seq=True, spread=0.3, empty_rows=(2,))
    lp = logp.double().requires_grad_(True)
    got = policy_loss_reference(lp, old.double(), adv.double(), mask, agg=agg, ratio_level="sequence")
    m = mask.double()
    lp2 = logp.double().requires_grad_(True)
    seq = ((lp2 - old.double()) * m).sum(-1) / m.sum(-1).clamp_min(1)
    R = torch.exp(seq)[:, None]
    a = adv.double()[:, None]
    want = _agg(-torch.minimum(R * a, R.clamp(0.8, 1.2) * a).expand_as(lp2), mask, agg)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    (g1,) = torch.autograd.grad(got, lp)
    (g2,) = torch.autograd.grad(want, lp2)
    torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-12)
    token = policy_loss_reference(logp.double(), old.double(), adv.double(), mask, agg=agg)
    assert not torch.allclose(got, token), "the sequence ratio is not the token ratio on these rows"


def test_sequence_level_ratios_run_in_the_reference_on_every_device():
    logp, old, adv, mask, *_ = make_inputs(2, 5, seed=1)
    with pytest.raises(ValueError, match="ratio_level='sequence' runs in the reference"):
        policy_loss_triton(on(logp), *on(old, adv, mask), ratio_level="sequence")
    got = policy_loss(logp, old, adv, mask, ratio_level="sequence")
    torch.testing.assert_close(got, policy_loss_reference(logp, old, adv, mask, ratio_level="sequence"))
    with pytest.raises(ValueError, match="loss must be one of"):
        policy_loss(logp, old, adv, mask, loss="ppo")
    with pytest.raises(ValueError, match="ratio_level must be one of"):
        policy_loss(logp, old, adv, mask, ratio_level="episode")

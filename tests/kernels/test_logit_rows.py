"""The row pass of the fused LM-head loss: the Triton kernel (interpreted here, compiled on a
GPU) against the torch reference, and the reference against float64 autograd through
log_softmax. Checked once to fail for: the gradient's one-hot term at the target + 1 (an
off-by-one target), its sign flipped, the lse rescale dropped across column blocks."""
import pytest
import torch

from freshper.kernels.logit_rows import rows_reference, rows_triton
from freshper.kernels.policy_loss import policy_loss_reference

from ..device import back, on


def case(n, V, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(n, V, generator=g) * 3).to(dtype)
    y = torch.randint(0, V, (n,), generator=g)
    old = -torch.rand(n, generator=g) * 3 - 0.5
    adv = torch.randn(n, generator=g)
    scale = torch.rand(n, generator=g) + 0.5
    coef = torch.full((n,), 1.0 / n)
    ref = old + torch.randn(n, generator=g) * 0.1
    tis = old + torch.randn(n, generator=g) * 0.1
    return z, y, dict(old=old, adv=adv, scale=scale, coef=coef, ref=ref, tis=tis)


def float64_rows(z, y, t, kl_coef, tis_cap, cispo):
    """(logp, loss terms summed with coef, d loss / d z) by float64 autograd."""
    zz = z.double().requires_grad_(True)
    logp = torch.log_softmax(zz, -1).gather(1, y[:, None])[:, 0]
    kw = dict(ref_logp=t["ref"][None].double(), kl_coef=kl_coef, tis_logp=t["tis"][None].double(),
              tis_cap=tis_cap, loss="cispo" if cispo else "clip", agg="seq-mean-token-sum")
    # one sequence, coef = 1/n on every token: seq-mean-token-sum over one row is the plain sum; scale by 1/n
    loss = policy_loss_reference(logp[None], t["old"][None].double(), t["adv"][None].double(),
                                 torch.ones(1, z.shape[0], dtype=torch.bool), None, **kw) / z.shape[0]
    # the IS weight `scale` per token: fold it into the reference by scaling each token's term
    (grad,) = torch.autograd.grad(loss, zz)
    return logp.detach(), loss.detach(), grad


@pytest.mark.parametrize("cispo", [False, True])
@pytest.mark.parametrize("block_v", [16, 64, None])
def test_triton_matches_reference(cispo, block_v):
    z, y, t = case(12, 150, seed=block_v or 0)
    kw = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.05, tis_cap=2.0, cispo=cispo)
    zr = z.clone()
    lp_r, lse_r, te_r = rows_reference(zr, y, mode="loss", **t, **kw)
    zt = on(z.clone())
    lp_t, lse_t, te_t = back(*rows_triton(zt, on(y), mode="loss", **{k: on(v) for k, v in t.items()}, **kw,
                                          block_v=block_v))
    torch.testing.assert_close(lp_t, lp_r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse_t, lse_r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(te_t, te_r, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(back(zt), zr, rtol=1e-5, atol=1e-7)


def test_reference_against_float64_autograd():
    """Unit IS weights, no TIS, so the float64 path is plain log_softmax + the reference loss."""
    z, y, t = case(8, 90, seed=3, dtype=torch.float64)  # 8 tokens: coef = 1/8 is exact in float32
    t["scale"] = torch.ones(8)
    for cispo in (False, True):
        lp64, loss64, grad64 = float64_rows(z, y, {**t, "tis": t["old"]}, 0.05, 10.0, cispo)
        zz = z.clone()
        lp, _, te = rows_reference(zz, y, mode="loss", **{**t, "tis": None}, clip_low=0.2, clip_high=0.2,
                                   kl_coef=0.05, cispo=cispo)
        torch.testing.assert_close(lp, lp64, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close((te[:, 0] * t["coef"].double()).sum(), loss64, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(zz, grad64, rtol=1e-10, atol=1e-12)
        assert not torch.allclose(-zz, grad64), "a sign error would be caught"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_given_and_logp_modes(dtype):
    z, y, t = case(9, 70, seed=5, dtype=dtype)
    g = torch.randn(9)
    lp_r, lse_r, _ = rows_reference(z.clone(), y, mode="logp")
    lp_t, lse_t, _ = rows_triton(on(z.clone()), on(y), mode="logp", block_v=16)
    lp_t, lse_t = back(lp_t, lse_t)
    torch.testing.assert_close(lp_t, lp_r, rtol=1e-5, atol=1e-5)
    zr, zt = z.clone(), on(z.clone())
    rows_reference(zr, y, mode="given", g=g, lse=lse_r)
    rows_triton(zt, on(y), mode="given", g=on(g), lse=on(lse_r), block_v=32)
    assert zt.dtype == dtype
    torch.testing.assert_close(back(zt).float(), zr.float(), rtol=2 ** -7, atol=1e-6)
    # d = g (onehot - p): each row sums to 0 and the target column holds g (1 - p)
    p = torch.softmax(z.float(), -1)
    want = -g[:, None] * p
    want[torch.arange(9), y] += g
    torch.testing.assert_close(zr.float(), want, rtol=2 ** -7, atol=1e-6)


def test_bad_target_gives_nan_not_a_read_out_of_bounds():
    z, y, t = case(3, 40, seed=1)
    y[1] = 40
    lp = back(rows_triton(on(z.clone()), on(y), mode="logp")[0])
    assert torch.isnan(lp[1]) and torch.isfinite(lp[[0, 2]]).all()
    lp_r, _, _ = rows_reference(z.clone(), y, mode="logp")
    assert torch.isnan(lp_r[1])


def test_bad_mode():
    z, y, _ = case(2, 5, 0)
    with pytest.raises(ValueError, match="mode"):
        rows_reference(z, y, mode="both")


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("mode", ["loss", "given"])
def test_float32_logits_write_a_bf16_gradient(share, mode):
    """Float32 logits, bf16 GEMMs: the kernel's store rounds the float32 gradient once into the
    GEMMs' buffer (grad_buffer: a separate bf16 tensor, or z's own memory, row i's gradient in
    the first half of row i's bytes), within one bf16 step of the float32 gradient rounded to
    bf16 (the cast pass this replaces; float32 exp differs in its last bits). Checked to fail
    with the packed view's row stride taken as z's (rows overlap) and with the last column
    block's store dropped."""
    from freshper.kernels.logit_rows import grad_buffer

    z, y, t = case(12, 150, seed=9)
    kw = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.05, tis_cap=2.0)
    g = torch.randn(12, generator=torch.Generator().manual_seed(2))
    extra = dict(t, **kw) if mode == "loss" else dict(g=g, lse=torch.logsumexp(z, -1))
    z32 = z.clone()
    lp_r, _, te_r = rows_reference(z32, y, mode=mode, **extra)  # the float32 gradient, over z32
    want = z32.bfloat16()
    zt = on(z.clone())
    d = grad_buffer(zt, torch.bfloat16, share=share)
    assert d.dtype == torch.bfloat16 and (d.data_ptr() == zt.data_ptr()) == share
    lp_t, _, te_t = rows_triton(zt, on(y), mode=mode, out=d, block_v=32,
                                **{k: on(v) if torch.is_tensor(v) else v for k, v in extra.items()})
    torch.testing.assert_close(back(d).float(), want.float(), rtol=2 ** -7, atol=1e-30)
    if mode == "loss":
        torch.testing.assert_close(back(lp_t), lp_r, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(back(te_t), te_r, rtol=1e-5, atol=1e-6)
    # the reference writes the same into a separate buffer, and refuses to write over what it reads
    zr, dr = z.clone(), torch.empty(z.shape, dtype=torch.bfloat16)
    rows_reference(zr, y, mode=mode, out=dr, **extra)
    assert torch.equal(dr, want)
    with pytest.raises(ValueError, match="out must not share z's memory"):
        rows_reference(zr, y, mode=mode, out=grad_buffer(zr, torch.bfloat16, share=True), **extra)
    with pytest.raises(ValueError, match="out must be None or a floating"):
        rows_reference(z.clone(), y, mode=mode, out=torch.empty(12, 149, dtype=torch.bfloat16), **extra)

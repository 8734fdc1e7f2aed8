"""The fused Triton sampler (interpreted on CPU) against the float64 torch reference.

The kernel works in float64 throughout, so draws must return the reference's slot except where a
target lies within float64 rounding (1e-12 of the total) of a slot boundary, and probabilities
and weights must agree in log space. Wrong variants these tests were checked to reject: the
float32 block scan this file was written against; a stratum shifted by one (j + 1 + U_j); the
residual not rescaled to its block's max; the sub-block residual taken from the inclusive
instead of the exclusive prefix; beta ignored in the weights.
"""
import math

import pytest
import torch
from scipy.stats import chisquare

from freshper.kernels.sampler import sample_reference, sample_triton

from ..device import DEVICE, back, on
from ..freshper.helpers import filled


def random_keys(n, seed, empty_frac=0.3, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, generator=g, dtype=torch.float64) * spread
    k[torch.rand(n, generator=g) < empty_frac] = -math.inf
    if not torch.isfinite(k).any():
        k[n // 2] = 0.0
    return k


def assert_same_draws(keys, uniforms, beta, got, rtol=1e-12, min_same=1.0):
    """Slots identical to the float64 reference (at least `min_same` of draws; every other one
    within `rtol` of the total from a boundary), probabilities and weights equal in log space."""
    idx, probs, w = sample_reference(keys, uniforms, beta)
    gi, gp, gw = got
    assert gp.dtype == torch.float64 and gw.dtype == torch.float64
    assert torch.isfinite(keys[gi]).all(), "an empty slot was returned"
    diff = (gi != idx).nonzero().squeeze(1)
    assert 1 - diff.numel() / gi.numel() >= min_same, f"{diff.numel()} of {gi.numel()} draws differ"
    if diff.numel():
        e = torch.where(torch.isfinite(keys), torch.exp(keys - keys.max()), torch.zeros_like(keys))
        prefix = torch.cumsum(e, 0)
        total = prefix[-1]
        b = uniforms.numel()
        target = (diff.double() + uniforms[diff]) / b * total
        boundary = prefix[torch.minimum(gi[diff], idx[diff])]
        assert ((target - boundary).abs() <= rtol * total).all(), (gi[diff], idx[diff])
    same = gi == idx
    torch.testing.assert_close(gp[same].log(), probs[same].log(), rtol=0, atol=1e-9)
    torch.testing.assert_close(gw[same].log(), w[same].log(), rtol=0, atol=1e-9)


CASES = [  # (n, block, draws, empty_frac, spread)
    (1, None, 7, 0.0, 1.0),
    (5, None, 64, 0.4, 1.0),
    (100, None, 256, 0.3, 3.0),
    (1000, 128, 100, 0.5, 3.0),
    (5000, 1024, 64, 0.2, 10.0),
    (20000, 2048, 256, 0.9, 2.0),
]


@pytest.mark.parametrize("n,block,draws,empty,spread", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_reference(n, block, draws, empty, spread, seed):
    keys = random_keys(n, seed, empty, spread)
    u = torch.rand(draws, generator=torch.Generator().manual_seed(seed + 100), dtype=torch.float64)
    for beta in (0.0, 0.4, 1.0):
        assert_same_draws(keys, u, beta, back(*sample_triton(on(keys), on(u), beta, block=block)))


def test_float32_keys_and_huge_offsets():
    """All-old buffers have keys ~ -1e4 relative to zero: only differences may matter."""
    keys = random_keys(300, 3) - 1e4
    u = torch.rand(64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert_same_draws(keys, u, 0.4, back(*sample_triton(on(keys), on(u), 0.4, block=64)))
    k32 = random_keys(300, 4).float()
    assert_same_draws(k32.double(), u, 0.4, back(*sample_triton(on(k32), on(u), 0.4, block=64)))


def test_targets_at_the_end_never_return_empty_slots():
    """Uniforms of 1 - 2^-53 put the last target at the total, where a float scan can end
    past every slot of positive mass; trailing empty slots must not be returned."""
    keys = torch.full((2048,), -math.inf, dtype=torch.float64)
    keys[[3, 700, 1500]] = torch.tensor([0.0, -60.0, 5.0], dtype=torch.float64)
    u = torch.full((16,), 1 - 2 ** -53, dtype=torch.float64)
    for block in (64, 512, 2048):
        idx, _, _ = back(*sample_triton(on(keys), on(u), 0.4, block=block))
        assert set(idx.tolist()) <= {3, 700, 1500}
        assert idx[-1].item() == 1500


def test_blocks_far_below_the_max_are_skipped_not_returned():
    """A block 800 nats below the max underflows to zero mass even in float64; it must then get
    no draws (its exact probability, e^-800, is below float64's reach too)."""
    keys = torch.full((256,), -math.inf, dtype=torch.float64)
    keys[:64] = -800.0
    keys[200] = 0.0
    idx, probs, w = back(*sample_triton(on(keys), on(torch.rand(32, dtype=torch.float64)), 0.5, block=64))
    assert (idx == 200).all()
    torch.testing.assert_close(w.log(), torch.full((32,), -0.5 * 800, dtype=torch.float64))


def test_a_million_slots_match_the_float64_reference():
    """At 1e6 slots the float32 scan sent ~3% of draws to a neighbour; the goal is >= 99.9% of
    draws on the reference's slot (with float64 throughout, all of them should be)."""
    keys = random_keys(10**6, 11, empty_frac=0.05, spread=2.0)
    u = torch.rand(256, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert_same_draws(keys, u, 0.4, back(*sample_triton(on(keys), on(u), 0.4)), min_same=0.999)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="keys"):
        sample_triton(on(torch.zeros(0)), on(torch.rand(3)), 0.4)
    with pytest.raises(ValueError, match="uniforms"):
        sample_reference(torch.zeros(3), torch.rand(2, 2), 0.4)
    with pytest.raises(ValueError, match="beta"):
        sample_reference(torch.zeros(3), torch.rand(2), 1.5)
    dead = torch.full((100,), -math.inf, dtype=torch.float64)
    for fn in (sample_triton, sample_reference):
        with pytest.raises(ValueError, match="no live slot"):
            fn(on(dead), on(torch.rand(4, dtype=torch.float64)), 0.4)
    for block in (100, 8, 4096.0):
        with pytest.raises(ValueError, match="block"):
            sample_triton(on(torch.zeros(300, dtype=torch.float64)), on(torch.rand(4, dtype=torch.float64)), 0.4,
                          block=block)


@pytest.mark.parametrize("mode", ["per", "freshper"])
def test_buffer_statistics_through_the_kernel(mode):
    buf = filled(mode, sampler="triton", capacity=64, n=64, device=DEVICE)
    buf.update_priorities(torch.tensor([1, 5, 9]), torch.tensor([10.0, 0.0, 3.0]), step=buf.step + 4)
    buf.add(torch.rand(8, dtype=torch.float64), step=buf.step + 1, tok=torch.zeros(8, 5, dtype=torch.long),
            ret=torch.zeros(8))
    probs = buf.probabilities().cpu()
    draws, batch = 100_000, 5000
    counts = torch.zeros(64, dtype=torch.float64)
    for _ in range(draws // batch):
        counts += torch.bincount(buf.sample(batch).indices.cpu(), minlength=64).double()
    live = probs > 0
    assert chisquare(counts[live].numpy(), probs[live].numpy() * draws).pvalue > 1e-3
    assert counts[~live].sum() == 0


@pytest.mark.skipif(DEVICE != "cpu", reason="the same uniforms need generators on the same device")
def test_buffer_kernel_and_tree_draw_the_same_slots():
    tree = filled("freshper", sampler="tree", seed=5)
    kern = filled("freshper", sampler="triton", seed=5)  # CPU generator: the same uniforms as the tree
    for _ in range(5):
        a, b = tree.sample(128), kern.sample(128)
        assert (a.indices == b.indices).float().mean() > 0.99
        same = a.indices == b.indices
        torch.testing.assert_close(b.weights[same].log(), a.weights[same].log(), rtol=0, atol=1e-9)


@pytest.mark.parametrize("n,block", [(300, 64), (5000, None), (17, None)])
@pytest.mark.parametrize("fn", [sample_reference, sample_triton], ids=["reference", "triton"])
def test_no_live_slot_sets_the_error_word_and_stays_inside(fn, n, block):
    """Every key -inf and no host check (a sync-free buffer's sample): each draw returns a slot
    inside the array with probability and weight 0, and the error word gets ERR_NO_LIVE; the
    word's other bits stay. Today's wrong variant: indices -1 (the scan's fallback block -1,
    then bmax[-1], subs[-64:] and keys[-4096:] read before the arrays)."""
    from freshper.kernels.sampler import ERR_NO_LIVE

    dead = on(torch.full((n,), -math.inf, dtype=torch.float64))
    err = on(torch.tensor([4], dtype=torch.int32))
    kw = {} if fn is sample_reference else {"block": block}
    idx, probs, w = back(*fn(dead, on(torch.rand(9, dtype=torch.float64)), 0.4, check_live=False, err=err, **kw))
    assert ((idx >= 0) & (idx < n)).all(), idx
    assert (probs == 0).all() and (w == 0).all()
    assert int(err) == 4 | ERR_NO_LIVE
    live = on(random_keys(n, 3))  # a live slot: the word is left alone
    err.zero_()
    got = fn(live, on(torch.rand(9, dtype=torch.float64)), 0.4, check_live=False, err=err, **kw)
    assert int(err) == 0
    assert torch.isfinite(back(live)[back(got[0])]).all()

"""Whole-group replay: a group drawn by its members' priorities, every member returned."""
import math

import pytest
import torch
from scipy.stats import chisquare

from freshper import ReplayBuffer


def grouped(sampler="tree", groups=12, size=4, seed=0, capacity=64):
    g = torch.Generator().manual_seed(seed)
    buf = ReplayBuffer(capacity, mode="freshper", tau=10.0, sampler=sampler, seed=seed, beta=0.6)
    for it in range(groups // 3):
        ids = torch.arange(it * 3, it * 3 + 3).repeat_interleave(size)
        p = torch.rand(3 * size, generator=g, dtype=torch.float64) * 2
        buf.add(p, step=it * 4, group=ids, tok=torch.randint(0, 9, (3 * size, 3), generator=g))
    return buf


def group_probs(buf):
    p = buf.probabilities()
    g = buf._fields["group"]
    live = buf._live
    n = int(g[live].max()) + 1
    return torch.zeros(n, dtype=torch.float64).index_add_(0, g[live], p[live])


@pytest.mark.parametrize("sampler", ["tree", "scan"])
def test_groups_drawn_by_member_mass_and_returned_whole(sampler):
    buf = grouped(sampler)
    pg = group_probs(buf)
    counts = torch.zeros_like(pg)
    for _ in range(200):
        b = buf.sample_groups(8)
        assert len(b) == 8 * 4
        gid = b.group.view(8, 4)
        assert (gid == gid[:, :1]).all(), "rows come group after group"
        for row in range(8):  # each group's members, all of them, once
            members = (buf._fields["group"] == gid[row, 0]) & buf._live
            assert sorted(b.indices.view(8, 4)[row].tolist()) == members.nonzero().squeeze(1).tolist()
        counts += torch.bincount(gid[:, 0], minlength=pg.numel()).double()
        torch.testing.assert_close(b.probs, pg[b.group], rtol=1e-12, atol=0)
    assert chisquare(counts.numpy(), (pg * counts.sum()).numpy()).pvalue > 1e-3


def test_group_weights_and_partly_evicted_groups():
    buf = grouped(capacity=46)  # 48 rows into 46 slots: the first group loses two members
    assert ((buf._fields["group"] == 0) & buf._live).sum() == 2
    pg = group_probs(buf)
    live_groups = pg > 0
    b = buf.sample_groups(16)
    want = (pg[b.group] / pg[live_groups].min()) ** -0.6
    torch.testing.assert_close(b.weights, want, rtol=1e-12, atol=0)
    assert b.weights.max() <= 1.0
    assert (b.age == buf.step - b.birth).all()


def test_groups_far_below_the_rest_keep_exact_weights():
    """The old groups' mass is e^-840 of the new ones': 0 in float64, yet it sets the weights'
    normaliser, (P(g) / min P)^-beta = e^-420, which float64 holds."""
    buf = ReplayBuffer(16, mode="freshper", tau=1.0, beta=0.5)
    buf.add(torch.ones(4, dtype=torch.float64), step=0, group=torch.tensor([0, 0, 1, 1]))
    buf.add(torch.ones(4, dtype=torch.float64), step=1400, group=torch.tensor([2, 2, 3, 3]))
    b = buf.sample_groups(4)
    assert set(b.group.tolist()) <= {2, 3}
    torch.testing.assert_close(b.weights.log(), torch.full((8,), -0.5 * 0.6 * 1400, dtype=torch.float64))


def test_bad_arguments():
    buf = grouped()
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match="n_groups"):
            buf.sample_groups(bad)
    for by in ("missing", "tok"):
        with pytest.raises(ValueError, match="by must name"):
            buf.sample_groups(2, by=by)
    assert math.isfinite(buf.sample_groups(1).weights.sum().item())

"""SumMinTree against cumsum + searchsorted."""
import numpy as np
import pytest

from freshper.sumtree import SumMinTree


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000])
def test_find_matches_searchsorted(n):
    rng = np.random.default_rng(n)
    v = rng.random(n) * (rng.random(n) < 0.7)
    if v.sum() == 0:
        v[0] = 1.0
    keys = np.where(v > 0, np.log(np.maximum(v, 1e-300)), np.inf)
    t = SumMinTree(n)
    t.set(np.arange(n), v, keys)
    prefix = np.cumsum(v)
    assert t.total == pytest.approx(prefix[-1], rel=1e-12)
    assert t.min == keys.min()
    targets = rng.random(500) * t.total
    got = t.find(targets)
    want = np.searchsorted(prefix, targets, side="right")
    near = np.abs(prefix[np.minimum(want, n - 1)] - targets) < 1e-12 * t.total
    assert (got[~near] == want[~near]).all()
    assert (v[got] > 0).all()


def test_targets_past_total_end_on_last_positive_leaf():
    t = SumMinTree(8)
    v = np.array([0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0])
    t.set(np.arange(8), v, np.zeros(8))
    assert t.find(np.array([t.total, t.total * 2, 1e300])).tolist() == [3, 3, 3]
    assert t.find(np.array([0.0])).tolist() == [1]


def test_incremental_equals_rebuild_bitwise():
    rng = np.random.default_rng(0)
    n = 100
    a, b = SumMinTree(n), SumMinTree(n)
    v = rng.random(n)
    for chunk in np.array_split(rng.permutation(n), 7):
        a.set(chunk, v[chunk], -v[chunk])
    b.rebuild(v, -v)
    assert np.array_equal(a.sums, b.sums) and np.array_equal(a.mins, b.mins)


def test_duplicate_set_last_wins():
    t = SumMinTree(4)
    t.set(np.array([1, 1, 2]), np.array([5.0, 3.0, 1.0]), np.array([5.0, 3.0, 1.0]))
    assert t.total == 4.0 and t.min == 1.0

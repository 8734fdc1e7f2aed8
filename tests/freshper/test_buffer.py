"""ReplayBuffer: exact distribution, stratification, IS weights, bad input, duplicates."""
import math

import pytest
import torch
from scipy.stats import chisquare

from freshper import ReplayBuffer, linear_beta
from freshper.buffer import _REBASE_UP

from .helpers import direct_probabilities, filled

MODES = ["uniform", "per", "freshper"]
CPU_SAMPLERS = ["tree", "scan"]


def snapshot(buf):
    sd = buf.state_dict()
    return sd["meta"], {k: v.clone() for k, v in sd["tensors"].items()}, buf._keys.clone()


def assert_unchanged(buf, snap):
    meta, tensors, keys = snap
    meta2, tensors2, keys2 = snapshot(buf)
    for m in (meta, meta2):  # the pending error word: what a rejected sync-free call does set
        m["counters"].pop("err", None)
    assert meta == meta2
    assert tensors.keys() == tensors2.keys()
    for k in tensors:
        assert torch.equal(tensors[k], tensors2[k]), k
    assert torch.equal(keys, keys2)


def frequencies(buf, draws, batch=1000):
    counts = torch.zeros(buf.capacity, dtype=torch.float64)
    for _ in range(draws // batch):
        b = buf.sample(batch)
        counts += torch.bincount(b.indices, minlength=buf.capacity).double()
    return counts


def churn(buf, seed=1):
    """Updates (some re-stamped), then adds past capacity so eviction happens."""
    g = torch.Generator().manual_seed(seed)
    live = buf._live.nonzero().squeeze(1)
    pick = live[torch.randperm(live.numel(), generator=g)[:10]]
    buf.update_priorities(pick, torch.rand(10, generator=g, dtype=torch.float64) * 5, step=buf.step + 3)
    for _ in range(3):
        buf.add(torch.rand(8, generator=g, dtype=torch.float64), step=buf.step + 5,
                tok=torch.zeros(8, 5, dtype=torch.long), ret=torch.zeros(8))


@pytest.mark.parametrize("mode", MODES)
def test_probabilities_match_direct_formula(mode):
    buf = filled(mode)
    churn(buf)
    t = buf.step + 11
    got = buf.probabilities(step=t)
    want = direct_probabilities(buf, buf._log_base, buf._birth, buf._live, t)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
    assert got[~buf._live].eq(0).all()


@pytest.mark.parametrize("sampler", CPU_SAMPLERS)
@pytest.mark.parametrize("mode", MODES)
def test_sampled_frequencies_match_probabilities(mode, sampler):
    buf = filled(mode, sampler=sampler, capacity=64, n=64)
    churn(buf)
    probs = buf.probabilities()
    draws = 100_000
    counts = frequencies(buf, draws)
    live = probs > 0
    stat = chisquare(counts[live].numpy(), probs[live].numpy() * draws)
    assert stat.pvalue > 1e-3, stat
    assert counts[~live].sum() == 0


@pytest.mark.parametrize("sampler", CPU_SAMPLERS)
def test_one_draw_per_stratum(sampler):
    buf = filled("freshper", sampler=sampler)
    prefix = torch.cumsum(buf.probabilities(), 0)
    for _ in range(20):
        b = buf.sample(37)
        lo = torch.cat([torch.zeros(1, dtype=torch.float64), prefix])[b.indices]
        hi = prefix[b.indices]
        j = torch.arange(37, dtype=torch.float64)
        # The slot's interval [lo, hi) must meet stratum [j/B, (j+1)/B).
        assert (lo <= (j + 1) / 37 + 1e-12).all() and (hi >= j / 37 - 1e-12).all()
        assert (b.indices.diff() >= 0).all()


@pytest.mark.parametrize("sampler", CPU_SAMPLERS)
def test_uniform_mode_is_uniform_with_unit_weights(sampler):
    buf = filled("uniform", sampler=sampler, capacity=50, n=50)
    counts = frequencies(buf, 100_000)
    assert chisquare(counts.numpy()).pvalue > 1e-3
    b = buf.sample(64)
    torch.testing.assert_close(b.weights, torch.ones(64, dtype=b.weights.dtype))


@pytest.mark.parametrize("sampler", CPU_SAMPLERS)
def test_weights_match_formula(sampler):
    buf = filled("freshper", sampler=sampler, beta=0.7)
    probs = buf.probabilities()
    n = len(buf)
    b = buf.sample(200)
    w_all = (n * probs[probs > 0]) ** -0.7
    want = (n * probs[b.indices]) ** -0.7 / w_all.max()
    torch.testing.assert_close(b.weights.double(), want, rtol=1e-9, atol=0)
    torch.testing.assert_close(b.probs.double(), probs[b.indices], rtol=1e-9, atol=0)
    assert (b.weights <= 1).all() and (b.weights > 0).all()


@pytest.mark.parametrize("sampler", CPU_SAMPLERS)
def test_all_old_buffer(sampler):
    """Ages of 1000 tau: the decayed priorities are ~e^-1000, far below float64's range, and
    sampling must still be exact and finite."""
    tau = 10.0
    buf = ReplayBuffer(16, tau=tau, sampler=sampler)
    buf.add(torch.tensor([1.0, 2.0, 4.0, 8.0]), step=0)
    buf.add(torch.tensor([1.0, 2.0, 4.0, 8.0]), step=5)
    t = int(1000 * tau)
    probs = buf.probabilities(step=t)
    assert torch.isfinite(probs).all() and abs(float(probs.sum()) - 1) < 1e-12
    want = direct_probabilities(buf, buf._log_base, buf._birth, buf._live, 5)  # shift-invariant
    torch.testing.assert_close(probs, want)
    b = buf.sample(8, step=t + 1)
    assert torch.isfinite(b.weights).all() and b.age.min() == t + 1 - 5
    assert buf._live[b.indices].all()


def test_tree_rebases_as_keys_grow():
    """Keys grow by alpha/tau per step; the tree's shift must follow without overflow."""
    buf = ReplayBuffer(8, tau=1.0, alpha=1.0, sampler="tree")
    step = 0
    for i in range(30):
        step += int(_REBASE_UP) // 3
        buf.add(torch.tensor([1.0]), step=step)
    assert math.isfinite(buf._tree.total) and buf._tree.total > 0
    b = buf.sample(64)
    assert buf._live[b.indices].all()
    torch.testing.assert_close(b.probs.double(), buf.probabilities()[b.indices])


def test_tree_survives_removing_the_dominant_entry():
    """Updating the only heavy entry to a tiny priority leaves a tree whose total would
    underflow against the old shift; the buffer must rebuild against the new maximum."""
    buf = ReplayBuffer(4, mode="per", alpha=1.0, eps=0.0, sampler="tree")
    buf.add(torch.tensor([1e200, 1e-200, 2e-200], dtype=torch.float64), step=0)
    buf.update_priorities(torch.tensor([0]), torch.tensor([3e-200], dtype=torch.float64))
    probs = buf.probabilities()
    torch.testing.assert_close(probs[:3], torch.tensor([0.5, 1 / 6, 1 / 3], dtype=torch.float64))
    counts = frequencies(buf, 6000)
    assert abs(counts[0] / 6000 - 0.5) < 0.02


@pytest.mark.parametrize("eviction", ["fifo", "stalest"])
def test_eviction(eviction):
    buf = ReplayBuffer(4, mode="per", eviction=eviction, sampler="tree")
    buf.add(torch.tensor([5.0, 1.0, 3.0, 4.0]), step=0, x=torch.tensor([0, 1, 2, 3]))
    slots = buf.add(torch.tensor([9.0, 9.0]), step=1, x=torch.tensor([4, 5]))
    assert len(buf) == 4
    if eviction == "fifo":
        assert slots.tolist() == [0, 1]
    else:  # the two least likely: priorities 1 and 3
        assert sorted(slots.tolist()) == [1, 2]
    assert sorted(buf._fields["x"].tolist()) == sorted(
        {"fifo": [4, 5, 2, 3], "stalest": [0, 4, 5, 3]}[eviction])


def test_fifo_wraps_and_fills_stalest_free_first():
    buf = ReplayBuffer(5, eviction="stalest")
    buf.add(torch.ones(3), step=0)
    assert buf.add(torch.ones(2), step=1).tolist() == [3, 4]
    fifo = ReplayBuffer(5)
    fifo.add(torch.ones(4), step=0)
    assert fifo.add(torch.ones(3), step=1).tolist() == [4, 0, 1]
    assert len(fifo) == 5


def test_duplicate_indices_last_wins():
    buf = filled("per")
    other = filled("per")
    buf.update_priorities(torch.tensor([3, 5, 3, 3]), torch.tensor([1.0, 2.0, 7.0, 0.5]))
    other.update_priorities(torch.tensor([5, 3]), torch.tensor([2.0, 0.5]))
    torch.testing.assert_close(buf.probabilities(), other.probabilities(), rtol=0, atol=0)
    torch.testing.assert_close(buf._tree.sums, other._tree.sums, rtol=0, atol=0)


def test_update_restamps_age():
    buf = ReplayBuffer(4, tau=10.0)
    buf.add(torch.tensor([1.0, 1.0]), step=0)
    buf.update_priorities(torch.tensor([0]), torch.tensor([1.0]), step=10)
    probs = buf.probabilities()
    torch.testing.assert_close(probs[0] / probs[1], torch.tensor(math.exp(0.6 * 10 / 10), dtype=torch.float64))
    assert sorted(set(buf.sample(64).age.tolist())) == [0, 10]
    assert buf.step == 10


def test_beta_schedule():
    buf = filled(beta=linear_beta(0.4, 1.0, steps=100))
    t0 = buf.step
    assert buf.sample(4, step=t0).beta == pytest.approx(0.4 + 0.6 * t0 / 100)
    assert buf.sample(4, step=500).beta == 1.0


BAD_CONSTRUCTOR = [
    (dict(capacity=0), "capacity"), (dict(capacity=2.5), "capacity"), (dict(mode="prio"), "mode"),
    (dict(tau=0.0), "tau"), (dict(tau=-1.0), "tau"), (dict(tau=float("nan")), "tau"), (dict(alpha=-0.1), "alpha"),
    (dict(beta=1.5), "beta"), (dict(beta=-0.1), "beta"), (dict(beta=lambda s: 2.0), "beta"),
    (dict(eps=-1.0), "eps"), (dict(eviction="lru"), "eviction"), (dict(sampler="fast"), "sampler"),
]


@pytest.mark.parametrize("kw,name", BAD_CONSTRUCTOR)
def test_bad_constructor_arguments(kw, name):
    kw = {"capacity": 8, **kw}
    with pytest.raises(ValueError, match=name):
        ReplayBuffer(kw.pop("capacity"), **kw)


def _bad_calls():
    tok = torch.zeros(2, 5, dtype=torch.long)
    ret = torch.zeros(2)
    return [
        ("add", lambda b: b.add(torch.tensor([1.0, -1.0]), step=99, tok=tok, ret=ret), "priority"),
        ("add", lambda b: b.add(torch.tensor([1.0, float("nan")]), step=99, tok=tok, ret=ret), "priority"),
        ("add", lambda b: b.add(torch.tensor([1.0, float("inf")]), step=99, tok=tok, ret=ret), "priority"),
        ("add", lambda b: b.add(torch.tensor([1.0, 1.0]), step=0, tok=tok, ret=ret), "step"),
        ("add", lambda b: b.add(torch.tensor([1.0, 1.0]), step=99, tok=tok[:1], ret=ret), "tok"),
        ("add", lambda b: b.add(torch.tensor([1.0, 1.0]), step=99, tok=tok[:, :3], ret=ret), "tok"),
        ("add", lambda b: b.add(torch.tensor([1.0, 1.0]), step=99, tok=tok, ret=ret.long()), "ret"),
        ("add", lambda b: b.add(torch.tensor([1.0, 1.0]), step=99, tok=tok), "fields"),
        ("add", lambda b: b.add(torch.ones(100), step=99, tok=tok, ret=ret), "capacity"),
        ("add", lambda b: b.add(torch.tensor([1.0, 1.0]), step=1.5, tok=tok, ret=ret), "step"),
        ("sample", lambda b: b.sample(0), "batch_size"),
        ("sample", lambda b: b.sample(4, step=0), "step"),
        ("update", lambda b: b.update_priorities(torch.tensor([0, 64]), torch.ones(2)), "indices"),
        ("update", lambda b: b.update_priorities(torch.tensor([0, -1]), torch.ones(2)), "indices"),
        ("update", lambda b: b.update_priorities(torch.tensor([0, 60]), torch.ones(2)), "empty"),
        ("update", lambda b: b.update_priorities(torch.tensor([0.0, 1.0]), torch.ones(2)), "indices"),
        ("update", lambda b: b.update_priorities(torch.tensor([0, 1]), torch.ones(3)), "priority"),
        ("update", lambda b: b.update_priorities(torch.tensor([0, 1]), torch.tensor([1.0, -2.0])), "priority"),
        ("update", lambda b: b.update_priorities(torch.tensor([0, 1]), torch.ones(2), step=3), "step"),
        ("probabilities", lambda b: b.probabilities(step=1), "step"),
    ]


@pytest.mark.parametrize("i", range(len(_bad_calls())))
def test_bad_input_leaves_buffer_unchanged(i):
    what, call, name = _bad_calls()[i]
    buf = filled("freshper", n=40)  # slots 40.. are empty
    snap = snapshot(buf)
    with pytest.raises((ValueError, TypeError), match=name):
        call(buf)
    assert_unchanged(buf, snap)
    buf.sample(4)  # still usable


def test_sample_from_empty_buffer():
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(4).sample(1)


def test_zero_priority_needs_eps():
    buf = ReplayBuffer(4, eps=0.0)
    with pytest.raises(ValueError, match="eps"):
        buf.add(torch.tensor([0.0, 1.0]), step=0)
    assert len(buf) == 0
    ReplayBuffer(4).add(torch.tensor([0.0, 1.0]), step=0)


def test_fields_declared_up_front():
    buf = ReplayBuffer(4, fields={"tok": ((3,), torch.int32)})
    with pytest.raises(TypeError, match="tok"):
        buf.add(torch.ones(1), step=0, tok=torch.zeros(1, 3, dtype=torch.int64))
    buf.add(torch.ones(1), step=0, tok=torch.ones(1, 3, dtype=torch.int32))
    assert buf.sample(2).tok.shape == (2, 3)
    with pytest.raises(AttributeError, match="tok"):
        buf.sample(1).nope


@pytest.mark.parametrize("sampler", CPU_SAMPLERS)
def test_set_tau_matches_a_buffer_built_with_that_tau(sampler):
    a = filled("freshper", sampler=sampler, tau=20.0)
    b = filled("freshper", sampler=sampler, tau=5.0)
    a.set_tau(5.0)
    torch.testing.assert_close(a.probabilities(), b.probabilities(), rtol=1e-12, atol=0)
    assert torch.equal(a.sample(64).indices, b.sample(64).indices)
    with pytest.raises(ValueError, match="tau"):
        a.set_tau(0.0)
    assert a.tau == 5.0


@pytest.mark.parametrize("sampler", CPU_SAMPLERS)
def test_first_add_at_a_late_step(sampler):
    """A buffer created mid-run (first step 10^6, keys ~ alpha * 10^6 / tau = 1200 nats) must
    shift its tree to the keys, not overflow exp(k)."""
    buf = ReplayBuffer(8, tau=500.0, sampler=sampler)
    buf.add(torch.tensor([1.0, 3.0]), step=1_000_000)
    buf.add(torch.tensor([2.0]), step=1_000_050)
    b = buf.sample(32)
    assert torch.isfinite(b.probs).all() and torch.isfinite(b.weights).all()
    torch.testing.assert_close(b.probs.double(), buf.probabilities()[b.indices])
    assert abs(float(buf.probabilities().sum()) - 1) < 1e-12


@pytest.mark.parametrize("sampler", CPU_SAMPLERS)
def test_max_priority_insertion(sampler):
    """add(None) inserts at the largest raw priority ever written (1 before any), which add and
    update_priorities raise; it survives a save/load round trip."""
    buf = ReplayBuffer(16, mode="per", alpha=1.0, eps=0.0, sampler=sampler)
    buf.add(None, step=0, x=torch.zeros(2, 1))
    assert buf.max_priority == 1.0
    buf.add(torch.tensor([0.5, 3.0]), step=1, x=torch.zeros(2, 1))
    buf.update_priorities(torch.tensor([0]), torch.tensor([7.0]))
    assert buf.max_priority == 7.0
    slots = buf.add(None, step=2, x=torch.zeros(1, 1))
    p = buf.probabilities()
    torch.testing.assert_close(p[slots], torch.tensor([7.0 / (7 + 1 + 0.5 + 3 + 7)], dtype=torch.float64))
    sd = buf.state_dict()
    other = ReplayBuffer(16, mode="per", alpha=1.0, eps=0.0, sampler=sampler)
    other.load_state_dict(sd)
    assert other.max_priority == 7.0
    with pytest.raises(ValueError, match="priority=None"):
        buf.add(None, step=3)
    with pytest.raises(ValueError, match="step"):
        buf.add(torch.ones(1))


@pytest.mark.parametrize("device_sampler", ["tree", "scan"])
def test_evict_older_than_is_a_hard_age_gate(device_sampler):
    """After evict_older_than(t - N) no draw is older than N, the rest keep their relative
    probabilities, and an evicted slot is refilled by later adds."""
    buf = ReplayBuffer(16, mode="per", alpha=1.0, sampler=device_sampler, seed=0)
    for step in range(4):
        buf.add(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), step=step, x=torch.full((3,), float(step)))
    before = buf.probabilities().clone()
    assert buf.evict_older_than(2) == 6 and len(buf) == 6
    p = buf.probabilities()
    kept = p > 0
    assert kept.sum() == 6 and torch.allclose(p[kept], before[kept] / before[kept].sum())
    b = buf.sample(64, step=3)
    assert int(b.age.max()) <= 1 and set(b.x.tolist()) <= {2.0, 3.0}
    assert buf.evict_older_than(2) == 0
    with pytest.raises(ValueError, match="step must be an int"):
        buf.evict_older_than(2.5)
    buf.add(torch.ones(10, dtype=torch.float64), step=4, x=torch.full((10,), 4.0))
    assert len(buf) == 16

"""add(..., birth=): trajectories generated at an earlier step enter already aged, on every path
(CPU tree, scan, triton, sync-free; insertion rules own, max, max-one-step). The distribution is
checked against the paper's formula in float64, P ~ (p * exp(-(step - birth) / tau))^alpha, and
by draws; an off-by-one birth is shown to fail the same checks."""
import math

import pytest
import torch

from freshper import ReplayBuffer

from ..device import DEVICE

PATHS = [("tree", False), ("scan", False), ("scan", True), ("triton", False), ("triton", True)]
IDS = ["tree", "scan", "scan-sync-free", "triton", "triton-sync-free"]
TAU, ALPHA = 3.0, 0.6


def make(path, insert="own", capacity=16):
    sampler, sync_free = path
    d = DEVICE if sampler == "triton" else "cpu"
    return ReplayBuffer(capacity, sampler=sampler, sync_free=sync_free, insert=insert, tau=TAU, alpha=ALPHA, device=d)


def formula(p, birth, step):
    """P(i) ∝ (p_i exp(-(step - birth_i)/tau))^alpha, float64, p already + eps."""
    w = (p.double() * torch.exp(-(step - birth).double() / TAU)) ** ALPHA
    return w / w.sum()


def off_by_one(birth):
    """The wrong variant: one slot's birth a step later (a shift of every birth would cancel)."""
    wrong = birth.clone()
    wrong[5] += 1
    return wrong


def fill(buf):
    """Two adds at step 6, births mixed (an int, then a tensor)."""
    d = buf.device
    p1 = torch.tensor([1.0, 2.0, 0.5, 1.5], dtype=torch.float64)
    p2 = torch.tensor([0.7, 1.2, 2.5, 0.9, 1.1, 3.0], dtype=torch.float64)
    b2 = torch.tensor([6, 0, 5, 2, 6, 1])
    buf.add(p1.to(d), step=6, birth=4, x=torch.arange(4, device=d))
    buf.add(p2.to(d), step=6, birth=b2.to(d), x=torch.arange(4, 10, device=d))
    buf.check()
    p = torch.cat([p1, p2]) + buf.eps
    birth = torch.cat([torch.full((4,), 4), b2])
    return p, birth


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_probabilities_follow_the_formula_with_mixed_births(path):
    buf = make(path)
    p, birth = fill(buf)
    got = buf.probabilities().cpu()[:10]
    torch.testing.assert_close(got, formula(p, birth, 6), rtol=1e-12, atol=0)
    assert torch.equal(buf._birth.cpu()[:10], birth)
    b = buf.sample(64, step=9)
    assert torch.equal(b.age.cpu(), 9 - birth[b.indices.cpu()])
    assert not torch.allclose(got, formula(p, off_by_one(birth), 6), rtol=1e-3, atol=0)


@pytest.mark.parametrize("path", [("tree", False), ("scan", True)], ids=["tree", "scan-sync-free"])
def test_draws_follow_the_formula_with_mixed_births(path):
    """Draw frequencies against the float64 formula: each slot within 5 standard deviations of a
    binomial count (the stratified draw's spread is smaller), a bound an off-by-one birth exceeds
    by far (its slots move by a factor exp(alpha / tau) = 1.22)."""
    buf = make(path)
    p, birth = fill(buf)
    draws, per = 200_000, 4000
    counts = torch.zeros(buf.capacity, dtype=torch.float64)
    for _ in range(draws // per):
        counts += torch.bincount(buf.sample(per).indices.cpu(), minlength=buf.capacity).double()
    assert counts[10:].sum() == 0
    freq = counts[:10] / draws

    def within(want):
        sd = torch.sqrt(want * (1 - want) / draws)
        return bool(((freq - want).abs() <= 5 * sd).all())

    assert within(formula(p, birth, 6)), (freq, formula(p, birth, 6))
    assert not within(formula(p, off_by_one(birth), 6))
    assert not within(formula(p, torch.full_like(birth, 6), 6))  # birth ignored: every slot at the step


@pytest.mark.parametrize("insert", ["max", "max-one-step"])
@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_insert_rules_keep_the_birth(path, insert):
    """At the maximum the key still carries the decay since birth; under max-one-step the own
    priority the slot returns to at the next step carries it too."""
    buf = make(path, insert=insert)
    p, birth = fill(buf)
    at = torch.full_like(p, buf.max_priority + buf.eps)
    torch.testing.assert_close(buf.probabilities().cpu()[:10], formula(at, birth, 6), rtol=1e-12, atol=0)
    if insert == "max-one-step":
        got = buf.probabilities(step=7).cpu()[:10]
        torch.testing.assert_close(got, formula(p, birth, 7), rtol=1e-12, atol=0)


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_default_birth_is_the_step_bitwise(path):
    a, b = make(path), make(path)
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        p = (torch.rand(5, generator=g, dtype=torch.float64) + 0.1).to(a.device)
        a.add(p, step=step, x=torch.zeros(5, device=a.device))
        b.add(p, step=step, birth=step, x=torch.zeros(5, device=a.device))
    assert torch.equal(a._keys, b._keys) and torch.equal(a._birth, b._birth)


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_bad_birth_raises_naming_it_before_any_change(path):
    buf = make(path)
    d = buf.device
    buf.add(torch.ones(2, dtype=torch.float64, device=d), step=3, x=torch.zeros(2, device=d))
    snap = (buf._keys.clone(), buf._birth.clone(), buf._live.clone(), buf._next, buf._added, buf.step)
    rng = r"birth must .*0 <= birth <= step=3"
    cases = [(4, rng), (-1, rng), (2.0, "birth must be an int"), (True, "birth must be an int"),
             (torch.tensor([1]), r"birth must .*\(2,\)"), (torch.tensor([1.0, 2.0]), "birth must be an int")]
    if not buf.sync_free:  # a sync-free buffer checks the values of a tensor on its device at check()
        cases += [(torch.tensor([1, 7]), rng), (torch.tensor([-1, 2]), rng)]
    for bad, msg in cases:
        with pytest.raises(ValueError, match=msg):
            buf.add(torch.ones(2, dtype=torch.float64, device=d), step=3, birth=bad, x=torch.zeros(2, device=d))
    assert torch.equal(buf._keys, snap[0]) and torch.equal(buf._birth, snap[1]) and torch.equal(buf._live, snap[2])
    assert (buf._next, buf._added, buf.step) == snap[3:]
    buf.check()


@pytest.mark.parametrize("sampler", ["scan", "triton"])
def test_device_birth_of_a_sync_free_buffer_is_checked_at_check(sampler):
    """A birth tensor on the buffer's device is checked by the write kernel: bad, it writes
    nothing and check() names it."""
    buf = make((sampler, True))
    d = buf.device
    buf.add(torch.ones(2, dtype=torch.float64, device=d), step=3, birth=torch.tensor([1, 4], device=d),
            x=torch.zeros(2, device=d))
    assert len(buf) == 0
    with pytest.raises(ValueError, match=r"birth must lie in \[0, step\]"):
        buf.check()
    assert math.isinf(float(buf._keys.max()))

"""A batch's weight enters AdamW's first moment alone (freshper/batch_weight.py).

Checked against a float64 reference of the step it is meant to make, from a warmed optimizer
state: m = b1*m + (1 - b1)*w*g, v = b2*v + (1 - b2)*g^2, then AdamW's bias-corrected step and
decoupled weight decay. The float32 step agrees with the reference to 1e-6 relative (measured
3e-7); the batch's part of the step, w times its part at weight 1, to 8e-5 (float32 parameters;
tolerance 1e-3). Weighting the gradient itself (which feeds w^2 g^2 to v), scaling the learning rate,
or doing nothing each fails these tests (checked once).
"""
import inspect
import math

import pytest
import torch

from freshper.batch_weight import weigh_momentum

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01


def adamw(params):
    return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)


def adam_decoupled(params):
    """The same update as AdamW, spelled as torch's Adam with decoupled_weight_decay (torch >= 2.6)."""
    return torch.optim.Adam(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, decoupled_weight_decay=True)


def adam_l2(params):
    """Adam's L2 decay: the step adds WD * theta to the gradient it feeds both moments."""
    return torch.optim.Adam(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)


def adam(params):
    return torch.optim.Adam(params, lr=LR, betas=BETAS, eps=EPS)


def warmed(seed=0, steps=4, make=adamw):
    """Parameters and an AdamW after a few steps on gradients of their own."""
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(7, 5, generator=g)), torch.nn.Parameter(torch.randn(11, generator=g))]
    opt = make(params)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    # the batch's gradient, in directions the earlier ones were small in (where v is small)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 3
    return params, opt


def reference_step(params, opt, w, make=None):
    """The intended step in float64: the gradient enters m times w and v as it is; AdamW's decay
    scales the parameter, Adam's L2 decay adds WD * theta to both moments' input, unweighted."""
    out = []
    b1, b2 = BETAS
    decoupled, l2 = (True, 0.0) if make in (None, adamw, adam_decoupled) else (False, WD if make is adam_l2 else 0.0)
    for p in params:
        st = opt.state[p]
        t = float(st["step"]) + 1
        g, m, v = p.grad.double(), st["exp_avg"].double(), st["exp_avg_sq"].double()
        x = p.detach().double()
        m = b1 * m + (1 - b1) * (w * g + l2 * x)
        v = b2 * v + (1 - b2) * (g + l2 * x) ** 2
        x = x * (1 - LR * WD) if decoupled else x
        out.append(x - LR * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + EPS))
    return out


HAS_DECOUPLED = "decoupled_weight_decay" in inspect.signature(torch.optim.Adam).parameters  # torch >= 2.6


@pytest.mark.parametrize("make", [adamw, pytest.param(adam_decoupled, marks=pytest.mark.skipif(
    not HAS_DECOUPLED, reason="torch's Adam has no decoupled_weight_decay before 2.6")), adam_l2, adam])
@pytest.mark.parametrize("w", [0.0, math.exp(-1), 1.0])
def test_the_weighted_step_is_adamw_with_the_gradient_weighted_in_its_first_moment_only(w, make):
    params, opt = warmed(make=make)
    want = reference_step(params, opt, w, make)
    weigh_momentum(opt, w)
    opt.step()
    for p, x in zip(params, want):
        assert torch.allclose(p.detach().double(), x, rtol=1e-6, atol=1e-9)


def test_the_batchs_part_of_the_step_is_w_times_its_part_at_weight_1():
    """The step minus the step without the batch's gradient in m: linear in w, exactly."""
    steps = {}
    for w in (0.0, math.exp(-1), 1.0):
        params, opt = warmed()
        before = torch.cat([p.detach().flatten() for p in params]).double()
        weigh_momentum(opt, w)
        opt.step()
        steps[w] = torch.cat([p.detach().flatten() for p in params]).double() - before
    part_w, part_1 = steps[math.exp(-1)] - steps[0.0], steps[1.0] - steps[0.0]
    assert float((part_w - math.exp(-1) * part_1).norm() / part_1.norm()) < 1e-3  # float32 parameters: 8e-5


def test_what_it_cannot_weigh_is_refused_before_anything_changes():
    """A first step (no moments yet), maximize (the first moment takes -g), another optimizer: each
    refused, and no moment of any group moved."""
    params, opt = warmed()
    fresh = torch.nn.Parameter(torch.ones(3))
    fresh.grad = torch.ones(3)
    opt.add_param_group({"params": [fresh]})
    m = [opt.state[p]["exp_avg"].clone() for p in params]
    with pytest.raises(ValueError, match="no first moment yet"):
        weigh_momentum(opt, 0.5)
    assert all(torch.equal(opt.state[p]["exp_avg"], x) for p, x in zip(params, m)), "the first group was changed"
    p = torch.nn.Parameter(torch.ones(3))
    for other, match in [(torch.optim.AdamW([p], maximize=True), "maximize"),
                         (torch.optim.SGD([p], lr=0.1), "optimizer SGD")]:
        with pytest.raises(ValueError, match=match):
            weigh_momentum(other, 0.5)


@pytest.mark.parametrize("w", [-0.1, 1.5, float("nan")])
def test_a_weight_outside_0_1_is_refused_before_anything_changes(w):
    params, opt = warmed()
    m = [opt.state[p]["exp_avg"].clone() for p in params]
    with pytest.raises(ValueError, match=r"weight=.*: expected a number in \[0, 1\]"):
        weigh_momentum(opt, w)
    assert all(torch.equal(opt.state[p]["exp_avg"], x) for p, x in zip(params, m))

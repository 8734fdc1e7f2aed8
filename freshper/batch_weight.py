"""A batch's weight in AdamW's update: what a weight on one batch must change to act.

A factor on one batch's loss does not survive the step. The gradient clip rescales the gradient
to `algo.grad_clip` (every update of the SmolLM2 presets is clipped), which removes it. Even after
the clip, multiplying the gradient by w feeds w·g to both of Adam's moments, and the second one,
which divides the step, takes much of the factor back wherever this batch's gradient dominates a
coordinate (docs/asynchronous.md measures the places such a weight can go).

So the weight goes into the first moment alone: AdamW computes m = b1·m + (1 − b1)·g and
v = b2·v + (1 − b2)·g²; this makes its m take (1 − b1)·w·g while v takes g² as it would. Then the
batch's part of the update's direction, in this step and in the momentum that carries it into
later steps, is w times its part at weight 1, and the step's per-coordinate scale, v, is what the
batch at weight 1 would make it. It is done by moving the stored m before the step,
m ← m − (1 − b1)(1 − w)·g / b1, so that torch's own AdamW makes the step.
"""
from __future__ import annotations

import math

import torch


@torch.no_grad()
def weigh_momentum(opt: torch.optim.Optimizer, weight: float) -> None:
    """Call between the gradient clip and `opt.step()` of a torch.optim.AdamW or Adam whose
    parameters hold this batch's gradient: the gradient then enters the first moment times
    `weight`, in [0, 1], and the second moment as it is. Under Adam's L2 decay
    (decoupled_weight_decay=False) the step adds weight_decay·θ to the gradient inside itself, not
    to p.grad, so that term, which is not the batch's, enters both moments unweighted. Every
    parameter with a gradient must have taken a step already (its moments exist); the checks run
    before anything changes."""
    if not (math.isfinite(weight) and 0.0 <= weight <= 1.0):
        raise ValueError(f"weight={weight}: expected a number in [0, 1]")
    if weight == 1.0:
        return
    if not isinstance(opt, (torch.optim.AdamW, torch.optim.Adam)):
        raise ValueError(f"optimizer {type(opt).__name__}: weigh_momentum moves AdamW's or Adam's first moment")
    work = []
    for group in opt.param_groups:
        b1 = float(group["betas"][0])
        if not 0.0 < b1 < 1.0:
            raise ValueError(f"betas[0]={b1}: a weight on the first moment needs 0 < betas[0] < 1")
        if group.get("maximize", False):
            raise ValueError("maximize=True: the first moment takes -g there; weigh_momentum supports minimizing")
        for p in group["params"]:
            if p.grad is None:
                continue
            m = opt.state[p].get("exp_avg")
            if m is None:
                raise ValueError("a parameter has no first moment yet: weigh a batch's gradient only after the "
                                 "optimizer's first step (a first step's direction is the gradient's sign anyway)")
            work.append((m, p.grad, (1.0 - b1) * (1.0 - weight) / b1))
    for m, g, alpha in work:
        m.sub_(g, alpha=alpha)

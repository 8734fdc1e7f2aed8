"""A batch's weight in AdamW's update: what a weight on one batch must change to act.

A factor on one batch's loss does not survive the step. The gradient clip rescales the gradient
to `algo.grad_clip` (every update of the SmolLM2 presets is clipped), which removes it. Even after
the clip, multiplying the gradient by w feeds w·g to both of Adam's moments, and the second one,
which divides the step, takes much of the factor back wherever this batch's gradient is large
against the ones before it (on the tiny model a weight of 0.37 on the clipped gradient moved the
weights 0.69 times as far as no weight).

So the weight goes into the first moment alone: AdamW computes m = b1·m + (1 − b1)·g and
v = b2·v + (1 − b2)·g²; this makes its m take (1 − b1)·w·g while v takes g² as it would. Then the
batch's contribution to this step, and the share of it that the momentum carries into later
steps, is w times what it is at weight 1, and the step's scale, v, is what the batch at weight 1
would have made it. It is done by moving the stored m before the step,
m ← m − (1 − b1)(1 − w)·g / b1, so torch's own AdamW makes the step.
"""
from __future__ import annotations

import torch


@torch.no_grad()
def weigh_momentum(opt: torch.optim.Optimizer, weight: float) -> None:
    """Before `opt.step()` (an AdamW whose parameters hold this batch's clipped gradient): make the
    gradient enter the first moment times `weight`, in [0, 1], and the second moment as it is. A
    parameter AdamW holds no state for yet (its first step, where Adam's step is the gradient's
    sign whatever its scale) gets its gradient scaled instead."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight={weight}: expected a number in [0, 1]")
    if weight == 1.0:
        return
    for group in opt.param_groups:
        b1 = group["betas"][0]
        if not 0.0 < b1 < 1.0:
            raise ValueError(f"AdamW betas[0]={b1}: a weight on the first moment needs 0 < betas[0] < 1")
        for p in group["params"]:
            if p.grad is None:
                continue
            m = opt.state[p].get("exp_avg")
            if m is None:
                p.grad.mul_(weight)
            else:
                m.sub_(p.grad, alpha=(1.0 - b1) * (1.0 - weight) / b1)

"""Dynamic loss scaling for fp16 compute.

fp16 has 5 exponent bits: below 6e-8 a number is 0. A token-mean policy loss divides each token's
gradient by the batch's token count, and the gradient reaching the LM head's logits is that times
a probability, so most of it underflows in fp16 activations. The update backpropagates S x loss
instead, S as large as fits without overflowing fp16's 65,504, and divides S out of the float32
master gradients before the optimizer step. S is found as it goes: halved (and the step skipped)
when a gradient is not finite, doubled after `interval` finite steps in a row, as
torch.amp.GradScaler does. Unlike GradScaler's, S is a host number: the fused LM-head loss needs
it in its forward, where it forms the gradient (freshper.kernels.fused_linear_policy_loss's
`grad_scale`), and the update learns whether the gradients were finite from the one host sync it
already makes (the gradient norm), so scaling adds no sync.
"""
from __future__ import annotations

import torch

SMALLEST = 2.0 ** -24  # below this, a non-finite gradient is not an overflow but the model's own


class LossScale:
    def __init__(self, init: float = 2.0 ** 16, interval: int = 2000, growth: float = 2.0, backoff: float = 0.5):
        """`init` the first scale S; `interval` finite steps in a row before S grows by `growth`;
        `backoff` the factor S shrinks by after a non-finite gradient."""
        if not (init > 0 and growth > 1 and 0 < backoff < 1 and interval >= 1):
            raise ValueError(f"LossScale needs init > 0, growth > 1, 0 < backoff < 1 and interval >= 1, got "
                             f"init={init}, growth={growth}, backoff={backoff}, interval={interval}")
        self.scale, self.interval, self.growth, self.backoff = float(init), int(interval), growth, backoff
        self.good = 0  # finite steps since the last change of S
        self.skipped = 0  # steps skipped for a non-finite gradient, over the run

    @torch.no_grad()
    def unscale_(self, params) -> None:
        """Divide S out of each parameter's gradient (float32 masters), in place, on the device."""
        for p in params:
            if p.grad is not None:
                p.grad.mul_(1.0 / self.scale)

    def update(self, finite: bool) -> bool:
        """After a step's gradients were checked: True to take the optimizer step. A non-finite
        gradient shrinks S and skips the step; raises FloatingPointError where S has shrunk below
        2^-24, where the loss itself is not finite."""
        if finite:
            self.good += 1
            if self.good >= self.interval:
                self.scale *= self.growth
                self.good = 0
            return True
        self.scale *= self.backoff
        self.good = 0
        self.skipped += 1
        if self.scale < SMALLEST:
            raise FloatingPointError(f"fp16 loss scale fell below {SMALLEST:g}: the gradients are not finite at any "
                                     "scale; lower algo.lr or check inputs")
        return False

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good": self.good, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.good, self.skipped = float(state["scale"]), int(state["good"]), int(state["skipped"])

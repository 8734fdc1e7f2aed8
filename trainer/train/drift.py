"""Adaptive tau for the freshper-auto arm: the decay time set from measured policy drift.

Every replay update sees, for each replayed trajectory of age Δ (iterations since it entered
the buffer), its stored behaviour log-probs log mu and the current log-probs log pi of the same
tokens. Δ and mu belong together: mu is the policy at the update that stored the trajectory
(algo.behaviour_logp), which under rollout.lag 1 is one update after the weights that generated
it; the loop logs that generation age apart (replay_gen_age_*), one iteration more. The mean
of log mu - log pi over the trajectory's response tokens estimates the
per-token KL(mu || pi), which grows with age: KL(Δ) ≈ r·Δ. A least-squares line through the
origin gives the drift rate r for the iteration; an exponential moving average smooths it.

The replay loss weights each token by its own ratio rho = pi / mu (clipped), so the variance
that matters is a token's. If log rho is roughly normal with E[rho] = 1, its variance is 2·KL
and the effective-sample-size fraction of importance sampling with rho is
1 / E[rho²] = exp(-2·KL) = exp(-2·r·Δ): a trajectory's tokens are worth that fraction of fresh
ones. Setting

    tau = 1 / (2 r)

makes the freshness factor exp(-Δ/tau) equal to that ESS fraction: a trajectory's priority
halves exactly when its effective sample size does, at Δ = ln 2 / (2r). The result is kept in
[tau_min, tau_max] (configured bounds, logged with the estimate), since r is noisy early on.
(With the product of a whole trajectory's ratios instead, KL and r grow with its length and tau
shrinks by the same factor; at T ≈ 40 response tokens that gave tau ≈ 1 iteration here.)
"""
from __future__ import annotations

import torch


class DriftTau:
    def __init__(self, tau: float, tau_min: float, tau_max: float, ema: float = 0.9):
        if not 0 < tau_min <= tau_max:
            raise ValueError(f"need 0 < tau_min <= tau_max, got tau_min={tau_min}, tau_max={tau_max}")
        if not 0 <= ema < 1:
            raise ValueError(f"drift ema must lie in [0, 1), got {ema}")
        self.tau_min, self.tau_max, self.ema = tau_min, tau_max, ema
        self.rate: float | None = None  # KL per iteration of age, smoothed
        self.tau = min(max(float(tau), tau_min), tau_max)  # in range from the start, not only after a fit
        self._num = self._den = 0.0

    def observe(self, age: torch.Tensor, kl: torch.Tensor) -> None:
        """Accumulate one replay batch: ages (B,) in iterations and trajectory KL estimates (B,)."""
        a, k = age.double(), kl.double()
        self._num += float((a * k).sum())
        self._den += float((a * a).sum())

    def update(self) -> float:
        """Close the iteration: fit r, smooth it, set and return tau."""
        if self._den > 0:
            r_hat = self._num / self._den
            self.rate = r_hat if self.rate is None else self.ema * self.rate + (1 - self.ema) * r_hat
        self._num = self._den = 0.0
        if self.rate is not None:
            self.tau = self.tau_max if self.rate <= 0 else min(max(1.0 / (2.0 * self.rate), self.tau_min), self.tau_max)
        return self.tau

    def state(self) -> dict:
        return {"rate": self.rate, "tau": self.tau}

    def load(self, s: dict) -> None:
        self.rate, self.tau = s["rate"], s["tau"]

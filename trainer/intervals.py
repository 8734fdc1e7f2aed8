"""95% intervals for the figures a run reports: means over seeds or states, and success rates.

A rate measured on a few states needs an interval that does not vanish when every state came
out the same: two states both failed are not evidence of a rate of exactly 0. Rates therefore get
the wider of the t-interval over states and the Wilson score interval of the pooled rate.
"""
from __future__ import annotations

import math

import numpy as np

# two-sided 95% Student t quantiles by degrees of freedom (a fact table; df > 30 uses 1.96)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t975(df: int) -> float:
    keys = [k for k in sorted(T975) if k <= df]
    return T975[keys[-1]] if keys and df <= 30 else 1.96


def mean_ci(xs) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval); half-width nan for one value or a non-finite one
    (a run that never drifted has an infinite drift time)."""
    x = np.asarray(xs, dtype=float)
    if x.size < 2 or not np.isfinite(x).all():
        return float(x.mean()), float("nan")
    return float(x.mean()), float(t975(x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))


def wilson_half(p: float, n: int, z: float = 1.96) -> float:
    """Half-width of the 95% Wilson score interval of a rate p over n trials (> 0 even at p = 0 or 1)."""
    if n < 1:
        return float("nan")
    return z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)


def rate_ci(per_state) -> tuple[float, float]:
    """(rate, half-width) of a success rate from per-state rates in [0, 1] (avg@k of each
    state): the wider of the t-interval over the states and the Wilson interval over them."""
    x = np.asarray(per_state, dtype=float)
    m, h = mean_ci(x)
    w = wilson_half(m, x.size)
    return m, w if math.isnan(h) else max(h, w)

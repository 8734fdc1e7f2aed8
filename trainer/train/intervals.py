"""95% intervals for the figures a run reports: means over seeds or states, and success rates.

A rate measured on a few states needs an interval that does not vanish when every state came
out the same: two states both failed are not evidence of a rate of exactly 0. Rates therefore get
the wider of the t-interval over states and the Wilson score interval of the pooled rate.
"""
from __future__ import annotations

import functools
import math

import numpy as np


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (modified
    Lentz), on the side of x where it converges fast."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1.0 - x)
    tiny = 1e-300
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    c, d, f = 1.0, 0.0, 1.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * (f - 1.0)


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=None)
def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (the two-sided 95% interval's
    factor), to 1e-10: bisection on the exact CDF."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    lo, hi = 0.0, 20.0  # the quantile is 12.71 at df 1 and falls with df
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < 0.975 else (lo, mid)
    return (lo + hi) / 2


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

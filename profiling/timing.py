"""Wall-clock medians for the CPU microbenchmarks (CUDA timings use triton.testing.do_bench)."""
from __future__ import annotations

import statistics
import time


def median_seconds(fn, steps: int, warmup: int = 1) -> float:
    """Median wall time of `fn()` over `steps` calls, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)

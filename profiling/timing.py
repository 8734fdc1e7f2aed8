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


def graph_us(fn, generators=()) -> str:
    """Median microseconds of fn() replayed from a CUDA graph (launch overhead removed), or why
    capture failed (a host sync inside fn makes it fail). fn runs twice before the capture: once
    to compile, once on a side stream as capture requires. `generators`: CUDA generators fn draws
    from besides the default one, registered with the graph so each replay draws anew."""
    import torch
    import triton.testing

    try:
        fn()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        for g in generators:  # torch >= 2.5; older ones report the capture's failure below
            graph.register_generator_state(g)
        with torch.cuda.graph(graph):
            fn()
        return f"{triton.testing.do_bench(graph.replay) * 1e3:.1f}"
    except Exception as e:  # report, do not hide
        return f"failed: {type(e).__name__}: {str(e)[:80]}"


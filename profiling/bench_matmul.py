"""The CPU's achievable float32 matmul rate at SmolLM2-135M's layer shapes: the limit an update or
a generation step can approach on this machine (BENCHMARKS.md, "Matmul peak").

    python -m freshper.profiling.bench_matmul [--threads 1,2] [--tokens 3000] [--reps 5]

Each shape is (tokens x in) @ (in x out) for a layer of SmolLM2-135M (hidden 576, MLP 1536, 9
query and 3 key/value heads of 64, vocabulary 49152); GFLOP/s = 2 * tokens * in * out / the
median time over `reps`, after one warm-up.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

SHAPES = {"q/o proj 576x576": (576, 576), "k/v proj 576x192": (576, 192), "mlp up/gate 576x1536": (576, 1536),
          "mlp down 1536x576": (1536, 576), "lm head 576x49152": (576, 49152)}


def rate(tokens: int, k: int, n: int, reps: int) -> float:
    """Median GFLOP/s of a (tokens, k) @ (k, n) float32 matmul."""
    a, b = torch.randn(tokens, k), torch.randn(k, n)
    torch.mm(a, b)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t)
    return 2 * tokens * k * n / statistics.median(times) / 1e9


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench_matmul", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    p.add_argument("--tokens", type=int, default=3000, help="rows of the left operand (an update's tokens)")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    print(f"float32 GFLOP/s, {args.tokens} tokens, median of {args.reps}; torch {torch.__version__}")
    print("| shape | " + " | ".join(f"{t} thread{'s' * (t > 1)}" for t in threads) + " |")
    print("|---|" + "---|" * len(threads))
    for name, (k, n) in SHAPES.items():
        cells = []
        for t in threads:
            torch.set_num_threads(t)
            cells.append(f"{rate(args.tokens, k, n, args.reps):.0f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

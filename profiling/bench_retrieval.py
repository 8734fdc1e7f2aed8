"""Retrieval latency of the search environment's BM25 retriever (bm25s) at corpus sizes of
Wikipedia-passage scale: index build, one batch of 256 queries, and one query at a time (what an
episode's search costs, as the environment asks one query per turn).

The corpus is synthetic, so nothing is downloaded: passages of 100 words drawn from a Zipf
vocabulary of 50,000 words (the shape of Search-R1's 100-word Wikipedia passages), queries of 6
words taken from random passages (every query has a true hit).

    python -m freshper.profiling.bench_retrieval [--sizes 1e4,1e5,1e6] [--queries 256] [--threads 1]
"""
from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from freshper.profiling.timing import median_seconds


def corpus(n: int, words: int = 100, vocab: int = 50_000, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, vocab + 1)
    p = 1.0 / ranks
    ids = rng.choice(vocab, size=(n, words + 2), p=p / p.sum())
    lex = np.array([f"w{i}" for i in range(vocab)])
    return [{"id": str(i), "title": " ".join(lex[row[:2]]), "text": " ".join(lex[row[2:]])}
            for i, row in enumerate(ids)]


def queries(passages: list[dict], n: int, seed: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in rng.integers(0, len(passages), n):
        words = passages[int(i)]["text"].split()
        start = int(rng.integers(0, len(words) - 6))
        out.append(" ".join(words[start:start + 6]))
    return out


def bench(n: int, n_queries: int, reps: int) -> dict:
    from freshper.trainer.envs.search import Retriever

    ps = corpus(n)
    qs = queries(ps, n_queries)
    t0 = time.perf_counter()
    r = Retriever(ps)
    index_s = time.perf_counter() - t0
    batch_s = median_seconds(lambda: r.search(qs), reps, warmup=1)
    one_s = median_seconds(lambda: [r.search([q]) for q in qs[:32]], reps, warmup=1) / 32
    hit = np.mean([any(q in f"{h['title']} {h['text']}" for h in hits) for q, hits in zip(qs, r.search(qs))])
    return {"passages": n, "index_s": index_s, "batch_ms": batch_s * 1e3, "per_query_batched_ms":
            batch_s * 1e3 / n_queries, "one_query_ms": one_s * 1e3, "hit_at_3": float(hit)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1e4,1e5,1e6")
    p.add_argument("--queries", type=int, default=256)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="numba/numpy threads (bm25s scores with numpy)")
    a = p.parse_args(argv)
    import os

    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, bm25s "
          f"{__import__('bm25s').__version__}, {a.queries} queries per batch, top-3")
    print("| passages | index build (s) | batch of 256 (ms) | per query, batched (ms) | one query alone (ms) "
          "| true passage in top 3 |")
    print("|---|---|---|---|---|---|")
    for size in a.sizes.split(","):
        r = bench(int(float(size)), a.queries, a.reps)
        print(f"| {r['passages']:.0e} | {r['index_s']:.1f} | {r['batch_ms']:.1f} | {r['per_query_batched_ms']:.2f} "
              f"| {r['one_query_ms']:.2f} | {r['hit_at_3']:.2f} |", flush=True)


if __name__ == "__main__":
    main()

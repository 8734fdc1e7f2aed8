"""Where one decode step's time goes: a batch of rows with a key/value cache of a given length,
one new token each, through the policy's model (torch.profiler's top ops by self CPU time).

    python -m freshper.profiling.bench_decode --rows 8 --cache 800 --threads 1
"""
from __future__ import annotations

import argparse
import time


def main(argv=None) -> int:
    import torch

    from freshper.trainer import config
    from freshper.trainer.model.cache_name import cache_kwarg, output_cache
    from freshper.trainer.model.load import load_policy

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--preset", default="smollm2-135m-sokoban")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--cache", type=int, default=800, help="tokens already in each row's cache")
    ap.add_argument("--steps", type=int, default=10, help="decode steps timed")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _, _ = load_policy(config.load(args.preset, None, {"train.sft_steps": 0}), torch.device("cpu"))
    model.eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        t0 = time.perf_counter()
        cache = output_cache(model(input_ids=torch.randint(3, vocab, (args.rows, args.cache), generator=g),
                                   use_cache=True))
        kw = cache_kwarg(model)
        prefill = time.perf_counter() - t0
        nxt = torch.randint(3, vocab, (args.rows, 1), generator=g)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            model(input_ids=nxt, use_cache=True, **{kw: cache})
        step = (time.perf_counter() - t0) / args.steps
        with torch.profiler.profile() as prof:
            model(input_ids=nxt, use_cache=True, **{kw: cache})
    print(f"# {args.preset}: {args.rows} rows, cache {args.cache} tokens, {args.threads} thread(s)")
    print(f"prefill of {args.rows} x {args.cache} tokens: {prefill:.2f} s; one decode step: {step * 1e3:.0f} ms "
          f"(mean of {args.steps}; the cache grows by one token a step)")
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    print("| op | share of the step's self CPU time |\n|---|---|")
    for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:6]:
        print(f"| {e.key} | {e.self_cpu_time_total / total:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where one decode step's time goes, and what the engine's two decode fixes save: a batch of
left-padded rows with a key/value cache of a given length, one new token each, through the
policy's model.

Three variants, timed in turn (rounds alternate them, so drift in the machine hits all alike):
  transformers  its DynamicCache (torch.cat of the whole cache per step) and sdpa, which under
                a padding mask expands the key/value heads to every query head
  room          the engine's RoomLayer cache (trainer/engines/kv_room.py), sdpa as above
  room+gqa      RoomLayer and grouped heads inside sdpa (trainer/engines/gqa_sdpa.py): the engine now

    python -m freshper.profiling.bench_decode --rows 8 --cache 800 --threads 1
"""
from __future__ import annotations

import argparse
import time

VARIANTS = ("transformers", "room", "room+gqa")


def main(argv=None) -> int:
    import torch

    from freshper.trainer import config
    from freshper.trainer.engines.gqa_sdpa import gqa_sdpa
    from freshper.trainer.engines.kv_room import room_cache
    from freshper.trainer.model.cache_name import cache_kwarg, output_cache
    from freshper.trainer.model.load import load_policy

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--preset", default="smollm2-135m-sokoban")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--cache", type=int, default=800, help="positions already in each row's cache (padding included)")
    ap.add_argument("--pad", type=int, default=40, help="left padding of every other row, in positions")
    ap.add_argument("--steps", type=int, default=16, help="decode steps per timed round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; each times every variant once")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    for name in ("rows", "cache", "steps", "rounds", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not 0 <= args.pad < args.cache:
        ap.error(f"--pad must be in [0, --cache), got {args.pad}")
    torch.set_num_threads(args.threads)
    model, _, _ = load_policy(config.load(args.preset, None, {"train.sft_steps": 0}), torch.device("cpu"))
    model.eval()
    vocab, n_layers = model.config.vocab_size, model.config.num_hidden_layers
    kw = cache_kwarg(model)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (args.rows, args.cache), generator=g)
    attn = torch.ones_like(ids)
    attn[::2, :args.pad] = 0  # every other row left-padded: the engine's batches always carry a mask
    with torch.no_grad():
        t0 = time.perf_counter()
        data = output_cache(model(input_ids=ids, attention_mask=attn, use_cache=True))
        prefill = time.perf_counter() - t0
        data = [(layer.keys, layer.values) for layer in data.layers]
    nxt = torch.randint(3, vocab, (args.rows, 1), generator=g)

    def fresh(variant):
        from transformers import DynamicCache

        if variant == "transformers":
            return DynamicCache(ddp_cache_data=data)
        return room_cache(n_layers, args.steps + 1, data)

    def steps(variant):
        cache, mask = fresh(variant), attn
        with torch.no_grad(), gqa_sdpa(model, variant == "room+gqa"):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                mask = torch.cat([mask, mask.new_ones(args.rows, 1)], 1)
                model(input_ids=nxt, attention_mask=mask, use_cache=True, **{kw: cache})
            return (time.perf_counter() - t0) / args.steps

    times = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for v in VARIANTS:
            times[v].append(steps(v))
    print(f"# {args.preset}: {args.rows} rows, cache {args.cache} positions (every other row {args.pad} of them "
          f"padding), {args.threads} thread(s); prefill {prefill:.2f} s")
    base = min(times["transformers"])
    print("| variant | one decode step, best of rounds (ms) | all rounds (ms) | speed-up |\n|---|---|---|---|")
    for v in VARIANTS:
        best = min(times[v])
        print(f"| {v} | {best * 1e3:.0f} | {', '.join(f'{t * 1e3:.0f}' for t in times[v])} | {base / best:.2f}x |")
    for v in ("transformers", "room+gqa"):
        with torch.profiler.profile() as prof:
            steps(v)
        total = sum(e.self_cpu_time_total for e in prof.key_averages())
        print(f"\n{v}: top ops by self CPU time over {args.steps} steps\n| op | share |\n|---|---|")
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:6]:
            print(f"| {e.key} | {e.self_cpu_time_total / total:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

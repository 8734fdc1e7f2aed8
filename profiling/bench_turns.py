"""Multi-turn rollouts with and without reuse of the earlier turns, or with and without the HF
engine's decode fixes, side by side.

One batch of game episodes is rolled out twice per round, alternating. HF engine: with the
per-episode cache kept between turns (engines/turn_cache.py) and with the whole conversation
prefilled at every turn, from the same seed, so both draw the same samples (checked: the token
rows must be equal). vLLM engine (`--engine vllm`): one engine with prefix caching on (as the
trainer runs it: a turn finds its earlier conversation in the block cache) and one with it off;
their samples may differ in the last bits of the logits, so they are compared for time only.
`--compare decode` (HF engine, turn cache on in both): the room cache and grouped heads inside sdpa
(engines/kv_room.py, engines/gqa_sdpa.py) against transformers' cache and attention.
`--compare logits` (HF engine, a bf16 or fp16 model): sampling from float32 logits (the LM head's
float32 accumulator, `model.logits_dtype float32`) against logits rounded to the compute dtype;
what the engine's share of float32 logits costs. Their samples differ where the rounding flips a
draw, so they are compared for time only.
Prints the median seconds of each and their ratio, per rollout and per turn.

    python -m freshper.profiling.bench_turns --preset smollm2-135m-sokoban --rounds 2 [--engine vllm]
    python -m freshper.profiling.bench_turns --preset smollm2-135m-frozenlake --compare decode
    python -m freshper.profiling.bench_turns --preset smollm2-135m-math --compare logits --dtype bfloat16
"""
from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> int:
    import torch

    from freshper.trainer import config
    from freshper.trainer.config import env_kwargs
    from freshper.trainer.engines.base import Sampling
    from freshper.trainer.engines.hf import HFEngine
    from freshper.trainer.model.load import load_policy
    from freshper.trainer.train.rollout import rollout

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--preset", default="smollm2-135m-sokoban")
    ap.add_argument("--groups", type=int, default=2, help="initial states; rollout.group_size episodes each")
    ap.add_argument("--rounds", type=int, default=2, help="cached then whole, this many times")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=0, help="reply length (0: the preset's)")
    ap.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--compare", choices=("turns", "decode", "logits"), default="turns",
                    help="turns: reuse of earlier turns on and off; decode: the HF engine's decode fixes on and off; "
                         "logits: the HF engine's float32 logits on and off")
    ap.add_argument("--dtype", default="auto", help="model.dtype (--compare logits needs bf16 or float16)")
    args = ap.parse_args(argv)
    if args.compare in ("decode", "logits") and args.engine != "hf":
        ap.error(f"--compare {args.compare} needs --engine hf, got --engine {args.engine}")
    torch.set_num_threads(args.threads)
    cfg = config.load(args.preset, None, {"train.sft_steps": 0, "model.dtype": args.dtype})
    r = cfg.rollout
    model, tok, folder = load_policy(cfg, torch.device("cpu"))
    tokens = args.max_new_tokens or r.max_new_tokens
    if args.compare == "logits":
        from freshper.trainer.model.precision import compute_dtype

        if compute_dtype(model) is None:
            ap.error(f"--compare logits needs a bf16 or float16 model, got --dtype {args.dtype} (float32 here)")
        engines = {f32: HFEngine(model, tok, logits32=f32) for f32 in (True, False)}
        names = {True: "float32 logits", False: "logits in the compute dtype"}
    elif args.compare == "decode":
        engines = {new: HFEngine(model, tok, kv_room=new, gqa=new) for new in (True, False)}
        names = {True: "room cache, grouped heads", False: "transformers' cache and attention"}
    elif args.engine == "hf":
        engines = {reuse: HFEngine(model, tok, turn_cache=reuse) for reuse in (True, False)}
        names = {True: "turn cache", False: "whole prefill every turn"}
    else:
        from freshper.trainer.engines.vllm_engine import VLLMEngine

        engines = {reuse: VLLMEngine(model, tok, cfg, torch.device("cpu"), folder, prefix_caching=reuse)
                   for reuse in (True, False)}
        names = {True: "vLLM, prefix caching on", False: "vLLM, prefix caching off"}
    seconds: dict[bool, list[float]] = {True: [], False: []}
    rows, turns = {}, 0
    for _ in range(args.rounds):
        for reuse in (True, False):
            torch.manual_seed(0)
            t0 = time.perf_counter()
            ep = rollout(engines[reuse], tok, cfg.env.name, env_kwargs(cfg), list(range(args.groups)),
                         r.group_size, tokens, r.max_len, Sampling(1.0, 1.0, 0))
            seconds[reuse].append(time.perf_counter() - t0)
            rows[reuse], turns = ep.tokens, int(ep.turns.max())
    same = rows[True].shape == rows[False].shape and torch.equal(rows[True], rows[False])
    c, w = statistics.median(seconds[True]), statistics.median(seconds[False])
    print(f"# {args.preset}: {args.groups * r.group_size} episodes, up to {turns} turns, {tokens} new tokens a "
          f"reply, {args.threads} thread(s), {args.rounds} round(s), engine {args.engine}, compare {args.compare}")
    print("| rollout | seconds | per turn |\n|---|---|---|")
    print(f"| {names[False]} | {w:.1f} | {w / turns:.1f} |")
    print(f"| {names[True]} | {c:.1f} | {c / turns:.1f} |")
    if args.compare == "logits":
        print(f"float32 logits take {c / w:.2f}x the time; same samples: {same}")
    else:
        print(f"speed-up {w / c:.2f}x; same samples: {same}")
    return 0 if same or args.engine == "vllm" or args.compare == "logits" else 1


if __name__ == "__main__":
    raise SystemExit(main())

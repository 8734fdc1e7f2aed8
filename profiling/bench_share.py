"""When does the shared-prompt forward pay? Forward and backward of one micro-batch, whole rows
against each distinct prompt run once (trainer/model/prefix.py), as the share of distinct prompts grows.

Rows are the default job's: SmolLM2's chat template around a one-digit sum (about 56 tokens), then
a reply of random tokens. A micro-batch of R rows holds k distinct prompts, each R / k times (k =
R: no two rows share). Both forms run alternately in one process; medians over --repeats.

    python -m freshper.profiling.bench_share --rows 32 --threads 1
"""
from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> int:
    import torch

    from freshper.trainer import config
    from freshper.trainer.config import env_kwargs
    from freshper.trainer.envs import make_env
    from freshper.trainer.model.chat import Episode
    from freshper.trainer.model.load import load_policy
    from freshper.trainer.model.prefix import reply_starts
    from freshper.trainer.model.sharding import PolicyNet

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--preset", default="smollm2-135m-math")
    ap.add_argument("--rows", type=int, default=32, help="rows per micro-batch")
    ap.add_argument("--reply", type=int, default=24, help="reply tokens per row")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = config.load(args.preset)
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    net = PolicyNet(model)
    env = make_env(cfg.env.name, **env_kwargs(cfg))
    g = torch.Generator().manual_seed(0)
    print(f"# {args.preset}: {args.rows} rows, {args.reply}-token replies, {args.threads} thread(s), "
          f"median of {args.repeats}")
    print("| distinct prompts | whole rows (s) | shared (s) | whole / shared |\n|---|---|---|---|")
    k = 1
    while k <= args.rows:
        prompts = [Episode(tok, env.opening(env.reset(s), cfg.rollout.max_new_tokens)).ids for s in range(k)]
        vocab = model.config.vocab_size
        rows = [prompts[i % k] + torch.randint(vocab // 4, vocab, (args.reply,), generator=g).tolist()
                for i in range(args.rows)]
        n = max(len(r) for r in rows)
        tokens = torch.full((args.rows, n), tok.pad_token_id)
        mask = torch.zeros((args.rows, n), dtype=torch.bool)
        for i, r in enumerate(rows):
            tokens[i, :len(r)] = torch.tensor(r)
            mask[i, len(r) - args.reply:len(r)] = True
        lengths = torch.tensor([len(r) for r in rows])
        starts = reply_starts(mask, lengths)
        times: dict[str, list[float]] = {"whole": [], "shared": []}
        for _ in range(args.repeats):
            for name, st in (("whole", None), ("shared", starts)):
                model.zero_grad(set_to_none=True)
                t0 = time.perf_counter()
                loss = net(tokens, lengths, lambda h, w: (h.float() @ w[:64].float().T).square().mean(), st)
                loss.backward()
                times[name].append(time.perf_counter() - t0)
        w, s = statistics.median(times["whole"]), statistics.median(times["shared"])
        print(f"| {k} of {args.rows} | {w:.2f} | {s:.2f} | {w / s:.2f}x |", flush=True)
        k *= 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m freshper.trainer.probe --preset frozenlake --steps 150`: the perception warm start
(trainer/train/perception.py) alone, with held-out probe accuracy before and after. A command, so
it lives beside cli.py and flags.py, whose option parsing it uses."""
from __future__ import annotations

import torch


def main(argv=None) -> int:
    """python -m freshper.trainer.probe --preset frozenlake --steps 150: the warm start alone,
    with held-out probe accuracy before and after, by kind of question."""
    import argparse

    from . import config as C
    from .config import env_kwargs
    from .envs import make_env
    from .flags import parse_overrides
    from .model.load import load_policy
    from .train.perception import probe_accuracy, warm_start

    p = argparse.ArgumentParser(description=main.__doc__.split(":")[0])
    p.add_argument("--preset", default="frozenlake")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--probes", type=int, default=200, help="held-out questions asked")
    args, rest = p.parse_known_args(argv)
    torch.set_num_threads(1)
    cfg = C.load(args.preset, None, parse_overrides(rest))
    model, tok, path = load_policy(cfg, torch.device("cpu"))
    mk = lambda: make_env(cfg.env.name, **env_kwargs(cfg))  # noqa: E731
    for label in ("before", "after"):
        if label == "after":
            warm_start(model, tok, mk, path, args.steps, args.lr, cfg.train.seed)
        kinds = {}
        acc = probe_accuracy(model, tok, mk, args.probes, by_kind=kinds)
        parts = ", ".join(f"{k} {r / n:.3f} ({n})" for k, (r, n) in sorted(kinds.items()))
        print(f"{label}: held-out probe accuracy {acc:.3f} on {args.probes} questions; by kind: {parts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

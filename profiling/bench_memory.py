"""Where a run's memory goes: the peak resident memory of each part of an iteration, measured apart.

Builds the trainer of a preset (no warm start: the untrained policy's replies keep every episode
to its turn limit, the longest episodes, so the peaks are the largest the preset can reach), then
runs each part alone and reads the process's peak resident set (VmHWM) after it, resetting the
peak before each part (Linux: writing 5 to /proc/self/clear_refs). Parts: the model and trainer
as built; a validation rollout (eval.episodes x eval.samples episodes at once); a training
rollout; one whole iteration (rollout, update, replay). Prints a table in GB.

    python -m freshper.profiling.bench_memory --preset smollm2-135m-sokoban
"""
from __future__ import annotations

import argparse
import gc
import tempfile
from pathlib import Path


def rss_gb() -> tuple[float, float]:
    """(current, peak since the last reset) resident memory of this process, GB."""
    now = peak = 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            now = int(line.split()[1]) / 1e6
        elif line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1e6
    return now, peak


def reset_peak() -> None:
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")


def main(argv=None) -> int:
    import torch

    from freshper.trainer import config
    from freshper.trainer.train.loop import Trainer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--preset", default="smollm2-135m-sokoban")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    over = {"train.sft_steps": 0, "train.iterations": 1, "eval.every": 0, "train.progress": False}
    over.update(dict(kv.split("=", 1) for kv in args.set))
    cfg = config.load(args.preset, None, over)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        reset_peak()
        tr = Trainer(cfg, Path(d) / "run")
        rows.append(("model and trainer built", *rss_gb()))
        reset_peak()
        tr.evaluate()
        rows.append((f"validation rollout ({cfg.eval.episodes} x {cfg.eval.samples} episodes)", *rss_gb()))
        reset_peak()
        tr._rollout(0)
        rows.append((f"training rollout ({cfg.rollout.episodes} episodes)", *rss_gb()))
        reset_peak()
        row = tr.iteration_step()
        rows.append(("one iteration (rollout, update, replay)", *rss_gb()))
    print(f"# {args.preset} ({', '.join(f'{k}={v}' for k, v in over.items())}), {args.threads} thread(s); "
          f"the iteration's episodes averaged {row['turns']:.1f} turns, {row['gen_tokens']} generated tokens")
    print("| part | resident after (GB) | peak during (GB) |\n|---|---|---|")
    for name, now, peak in rows:
        print(f"| {name} | {now:.2f} | {peak:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

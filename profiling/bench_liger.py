"""The fused LM-head policy loss against Liger-Kernel's LigerFusedLinearGRPOLoss, same job.

Both compute the token-mean clipped GRPO loss (Liger's `bnpo`; here agg="token-mean") of the
taken tokens' log-probs from hidden states and the LM head without keeping (tokens x vocabulary)
logits, forward and backward. Each (path, shape) runs in a fresh process, so its peak resident
memory above the inputs (VmHWM, Linux) is its own; time is the median of `--reps` runs. The values
and gradients of the two are compared on the same inputs (float32).

    pip install -e '.[bench]'   # liger-kernel
    python -m freshper.profiling.bench_liger [--shapes 576x49152,896x151936] [--tokens 1024,4096]
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys

import torch

ROWS = 4  # sequences; tokens / ROWS per sequence


def inputs(tokens: int, H: int, V: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    T = tokens // ROWS
    hidden = torch.randn(ROWS, T, H, generator=g)
    weight = torch.randn(V, H, generator=g) / H ** 0.5
    targets = torch.randint(0, V, (ROWS, T), generator=g)
    mask = torch.ones(ROWS, T, dtype=torch.bool)
    mask[1, T // 2:] = False  # rows of unequal length
    with torch.no_grad():  # behaviour log-probs near the current ones, so ratios are ~1 with some clipped
        logp = torch.log_softmax(hidden @ weight.T, -1).gather(-1, targets[..., None])[..., 0]
    old = logp + torch.randn(ROWS, T, generator=g) * 0.2
    adv = torch.randn(ROWS, generator=g)
    return hidden, weight, targets, mask, old, adv


def run_path(path: str, tokens: int, H: int, V: int, reps: int) -> dict:
    """One path's loss, gradients' checksum, median seconds and peak extra MiB, in this process."""
    import time

    from freshper.profiling.bench_kernels import _peak_extra_cpu_mb

    torch.set_num_threads(1)
    hidden, weight, targets, mask, old, adv = inputs(tokens, H, V)
    h = hidden.requires_grad_(True)
    w = weight.requires_grad_(True)
    if path == "freshper":
        from freshper.kernels import fused_linear_policy_loss

        def fn():
            return fused_linear_policy_loss(h, w, targets, old, adv[:, None].expand_as(old), mask, agg="token-mean")
    else:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        loss_fn = LigerFusedLinearGRPOLoss(beta=0.0, use_ref_model=False, loss_type="bnpo",
                                           compiled=path == "liger-compiled", chunk_size=1)

        def fn():
            out = loss_fn(h, w, targets, mask.long(), adv, old_per_token_logps=old)
            return out[0] if isinstance(out, tuple) else out
    result = {}

    def once():
        loss = fn()
        gh, gw = torch.autograd.grad(loss, (h, w))
        result.update(loss=float(loss), gh=gh, gw=gw)

    once()  # warm-up (and compilation)
    peak = _peak_extra_cpu_mb(once)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    torch.save({"gh": result["gh"], "gw": result["gw"]}, f"/tmp/bench_liger_{path}_{tokens}_{H}_{V}.pt")
    return {"loss": result["loss"], "seconds": sorted(times)[len(times) // 2], "peak_mib": peak}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="576x49152,896x151936", help="HxV pairs (SmolLM2's, Qwen2.5-0.5B's)")
    ap.add_argument("--tokens", default="1024,4096")
    ap.add_argument("--paths", default="freshper,liger,liger-compiled")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--child", nargs=4, metavar=("PATH", "TOKENS", "H", "V"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        p, t, h, v = a.child
        print(json.dumps(run_path(p, int(t), int(h), int(v), a.reps)))
        return
    from importlib.metadata import version

    import liger_kernel  # noqa: F401  (a clear ImportError before any child starts)

    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, liger-kernel "
          f"{version('liger-kernel')}, 1 thread, float32, forward + backward, {ROWS} rows\n")
    print("| H x V | tokens | path | seconds | peak extra MiB | loss | vs freshper: max rel. grad diff |")
    print("|---|---|---|---|---|---|---|")
    for shape in a.shapes.split(","):
        H, V = (int(x) for x in shape.split("x"))
        for tokens in (int(x) for x in a.tokens.split(",")):
            base = None
            for path in a.paths.split(","):
                out = subprocess.run([sys.executable, "-m", "freshper.profiling.bench_liger", "--reps", str(a.reps),
                                      "--child", path, str(tokens), str(H), str(V)], capture_output=True, text=True)
                if out.returncode:
                    print(f"| {H} x {V} | {tokens} | {path} | failed: {out.stderr.strip().splitlines()[-1][:80]} "
                          f"| | | |")
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                g = torch.load(f"/tmp/bench_liger_{path}_{tokens}_{H}_{V}.pt")
                if base is None:
                    base, diff = g, "—"
                else:
                    d = max(float((g[k] - base[k]).abs().max() / base[k].abs().max()) for k in ("gh", "gw"))
                    diff = f"{d:.1e}"
                print(f"| {H} x {V} | {tokens} | {path} | {r['seconds']:.2f} | {r['peak_mib']:.0f} | "
                      f"{r['loss']:.6f} | {diff} |", flush=True)


if __name__ == "__main__":
    main()

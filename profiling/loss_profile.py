"""Where one fused LM-head loss call spends its time: the head GEMMs against the row kernel.

    python -m freshper.profiling.loss_profile [--tokens 4096] [--hidden 896] [--vocab 151936]

One forward + backward of fused_linear_policy_loss (float32 logits, bf16 operands on CUDA) under
torch.profiler, after a warm-up call. On CUDA every kernel's device time is put in one of three
rows: the cuBLAS GEMMs (logits, d @ W, d^T @ h), the Triton row kernel (`_rows`), and the rest
(index_select, the scatter back, the stats); a loss that misses its goal then says whether the
GEMMs or the row kernel did. On the CPU (the dry run) the same split is of the ops' own CPU time:
mm/addmm against everything else, the torch reference row pass among it. First it prints which
float32-logits path this torch takes with bf16 operands on the device (`path_line`).
"""
from __future__ import annotations

import argparse
import re

import torch

GEMM_KERNEL = re.compile(r"gemm|nvjet|xmma|cutlass|cublas|s16816|s1688|wgmma", re.I)
GEMM_OP = re.compile(r"^aten::(mm|addmm|bmm|matmul)$")
ROW_KERNEL = re.compile(r"^_rows\b")


def split(prof, cuda: bool) -> dict[str, list]:
    """{"GEMMs", "row kernel", "other"} -> [milliseconds, count] over the profiled region: on CUDA
    the device kernels' times, elsewhere the CPU ops' self times (no row kernel then: "other")."""
    out = {"GEMMs": [0.0, 0], "row kernel": [0.0, 0], "other": [0.0, 0]}
    for ev in prof.events():
        if cuda:
            if ev.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = ev.time_range.elapsed_us()
            kind = "row kernel" if ROW_KERNEL.search(ev.name) else "GEMMs" if GEMM_KERNEL.search(ev.name) else "other"
        else:
            if ev.device_type != torch.autograd.DeviceType.CPU or not ev.name.startswith("aten::"):
                continue
            us = ev.self_cpu_time_total
            kind = "GEMMs" if GEMM_OP.match(ev.name) else "other"
        out[kind][0] += us / 1e3
        out[kind][1] += 1
    return out


def table(parts: dict[str, list], what: str) -> str:
    """A Markdown table of `split`'s result, with each row's share of the total."""
    total = sum(ms for ms, _ in parts.values()) or float("nan")
    lines = [f"| {what} | ms | share | launches |", "|---|---|---|---|"]
    lines += [f"| {k} | {ms:.3f} | {ms / total:.0%} | {n} |" for k, (ms, n) in parts.items()]
    lines.append(f"| total | {total:.3f} | 100% | {sum(n for _, n in parts.values())} |")
    return "\n".join(lines)


def profile_fused(tokens: int, hidden: int, vocab: int, device: str, seed: int = 0,
                  logits_dtype: torch.dtype | None = torch.float32):
    """torch.profiler over one forward + backward of the fused loss at (1, tokens) x hidden x
    vocab (bf16 on CUDA, float32 on the CPU), after one warm-up call; returns (profile, cuda)."""
    from freshper.kernels import fused_linear_policy_loss

    cuda = device == "cuda"
    dt = torch.bfloat16 if cuda else torch.float32
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(1, tokens, hidden, generator=g).to(device, dt).requires_grad_(True)
    w = (torch.randn(vocab, hidden, generator=g) / hidden ** 0.5).to(device, dt).requires_grad_(True)
    y = torch.randint(0, vocab, (1, tokens), generator=g).to(device)
    old = (-torch.rand(1, tokens, generator=g) * 3).to(device)
    adv = torch.randn(1, tokens, generator=g).to(device)
    mask = torch.ones(1, tokens, dtype=torch.bool, device=device)

    def run():
        loss = fused_linear_policy_loss(h, w, y, old, adv, mask, n_active=tokens, check=False,
                                        logits_dtype=logits_dtype if cuda else None)
        torch.autograd.grad(loss, (h, w))

    run()
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts) as prof:
        run()
        if cuda:
            torch.cuda.synchronize()
    return prof, cuda


def path_line(device: str) -> str:
    """One line: the float32-logits path the fused loss takes with bf16 operands on `device` under
    this torch (probed: freshper.kernels' logits32_path), in the trainer's own words (its log
    says the same once a run), so that the GPU call's rows say which path they timed."""
    from freshper.trainer.model.precision import head_path

    return f"fused loss path on {device}, torch {torch.__version__}: {head_path('float32', device, torch.bfloat16)[1]}"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096, help="active tokens (one row)")
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--vocab", type=int, default=151_936)
    args = ap.parse_args(argv)
    for name in ("tokens", "hidden", "vocab"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(path_line(device), flush=True)
    prof, cuda = profile_fused(args.tokens, args.hidden, args.vocab, device)
    parts = split(prof, cuda)
    where = "device kernel time" if cuda else "CPU self time (dry run: torch reference)"
    print(f"\none fused loss call, forward + backward, {args.tokens} tokens, H {args.hidden}, V {args.vocab}, "
          f"{'bf16 operands, float32 logits' if cuda else 'float32'}: {where}")
    print(table(parts, "part"), flush=True)
    return parts


if __name__ == "__main__":
    main()

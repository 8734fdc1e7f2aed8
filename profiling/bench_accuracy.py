"""The accuracy figures of BENCHMARKS.md: the fused-linear loss in bf16 and the sampler's draws,
each against its float64 reference, on the cases the tests use.

    TRITON_INTERPRET=1 python -m freshper.profiling.bench_accuracy [--big]   # from a checkout

Run from the repository root: the cases come from tests/kernels. --big adds the sampler at 1e7
slots (about a minute interpreted). The "before" figures in BENCHMARKS.md are this script run
against the kernels of commit 944b4fa.
"""
from __future__ import annotations

import argparse
import math
import os

import torch


def fused_linear_rows():
    from freshper.kernels import token_logprobs
    from tests.kernels.test_fused_linear_policy_loss import bf16_case, rel_l2, three_ways

    print("| bf16 case | grad hidden: fused / eager | grad weight: fused / eager | log-probs > 0 (fused) |")
    print("|---|---|---|---|")
    for kind in ("confident", "unconfident"):
        h, w, y, mask, old, adv = bf16_case(kind, 0)
        fused, eag, ref = three_ways(h, w, y, mask, old, adv, chunk_size=16)
        lp, _ = token_logprobs(h.reshape(-1, h.shape[-1]), w, y.reshape(-1), chunk_size=16)
        print(f"| {kind} | {rel_l2(fused[0], ref[0]):.4f} / {rel_l2(eag[0], ref[0]):.4f} | "
              f"{rel_l2(fused[1], ref[1]):.4f} / {rel_l2(eag[1], ref[1]):.4f} | "
              f"{int((lp > 0).sum())} of {lp.numel()} |")


def sampler_rows(sizes):
    from freshper.kernels.sampler import sample_reference, sample_triton

    print("\n| N | draws on another slot than the float64 reference |\n|---|---|")
    for n in sizes:
        g = torch.Generator().manual_seed(0)
        k = torch.randn(n, generator=g, dtype=torch.float64) * 2
        k[torch.rand(n, generator=g) < 0.05] = -math.inf
        wrong = draws = 0
        for _ in range(4):
            u = torch.rand(256, generator=g, dtype=torch.float64)
            wrong += int((sample_triton(k, u, 0.4)[0] != sample_reference(k, u, 0.4)[0]).sum())
            draws += 256
        print(f"| {n:.0e} | {wrong} of {draws} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big", action="store_true", help="also the sampler at 1e7 slots")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        ap.error("on a machine without CUDA set TRITON_INTERPRET=1 (before Python starts)")
    fused_linear_rows()
    sampler_rows([10**6, 10**7] if args.big else [10**6])


if __name__ == "__main__":
    main()

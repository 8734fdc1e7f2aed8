"""The fused LM-head policy loss at main against the design of 2bad1d3 (logits recomputed in the
backward) and eager autograd, in one process on the CPU: head GEMM FLOPs per token (FlopCounterMode,
forward + backward, in units of 2 n H V over the n active tokens), host syncs (HostSyncs; main with
n_active and check=False, as the trainer calls it), median time of forward + backward, and peak
resident memory above the start. 2bad1d3's kernel files are read from git into a temporary package.

    python results/benchmarks/fused-loss-cpu-2026-12-06/compare.py \\
        > results/benchmarks/fused-loss-cpu-2026-12-06/output.txt
"""
import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from freshper.kernels import fused_linear_policy_loss, policy_loss_reference
from freshper.profiling.host_syncs import HostSyncs
from freshper.profiling.timing import median_seconds

ROOT = Path(__file__).resolve().parents[3]
OLD = "2bad1d3"


def old_kernel():
    pkg = Path(tempfile.mkdtemp()) / "oldkernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for f in ("backend.py", "policy_loss.py", "fused_linear_policy_loss.py"):
        text = subprocess.run(["git", "show", f"{OLD}:kernels/{f}"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout
        (pkg / f).write_text(text)
    sys.path.insert(0, str(pkg.parent))
    return importlib.import_module("oldkernels.fused_linear_policy_loss").fused_linear_policy_loss


def rss_mb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_extra_mb(run):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = rss_mb("VmRSS")
    run()
    return rss_mb("VmHWM") - before


def eager(h, w, y, old, adv, mask, wt):
    logp = torch.log_softmax((h @ w.T).float(), -1).gather(-1, y[..., None])[..., 0]
    return policy_loss_reference(logp, old, adv, mask, wt)


def main():
    torch.manual_seed(0)
    torch.set_num_threads(2)
    old_fused = old_kernel()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; float32; mask keeps ~70% of tokens")
    print("| shape (B x T, H, V) | path | head GEMM FLOPs / (2 n H V) | host syncs | fwd+bwd ms | peak extra MiB |")
    print("|---|---|---|---|---|---|")
    for B, T, H, V in ((2, 256, 256, 151936), (2, 256, 576, 49152)):
        h = torch.randn(B, T, H).requires_grad_(True)
        w = (torch.randn(V, H) / H ** 0.5).requires_grad_(True)
        y = torch.randint(0, V, (B, T))
        mask = torch.rand(B, T) > 0.3
        old = -torch.rand(B, T) * 3
        adv = torch.randn(B, T)
        wt = torch.rand(B)
        n = int(mask.sum())
        paths = {"eager (logits + log_softmax)": lambda: eager(h, w, y, old, adv, mask, wt),
                 f"fused at {OLD}": lambda: old_fused(h, w, y, old, adv, mask, wt),
                 "fused at main": lambda: fused_linear_policy_loss(h, w, y, old, adv, mask, wt, n_active=n,
                                                                   check=False)}
        for name, fn in paths.items():
            def step():
                h.grad = w.grad = None
                fn().backward()
            with FlopCounterMode(display=False) as fc:
                step()
            with HostSyncs() as syncs:
                step()
            ms = median_seconds(step, 3) * 1e3
            mem = peak_extra_mb(step)
            units = fc.get_total_flops() / (2 * n * H * V)
            print(f"| {B}x{T}, {H}, {V} | {name} | {units:.2f} | {len(syncs.events)} | {ms:.0f} | {mem:.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()

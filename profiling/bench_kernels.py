"""Microbenchmarks of the kernels against their baselines, measured in the same run.

    python -m freshper.profiling.bench_kernels [--quick] [--part all|loss|baselines]

On CUDA: triton.testing.do_bench medians for the fused sampler at N = 1e4..1e7 (B = 256)
against the torch composite (exp, cumsum, searchsorted, gather), and for the policy losses
(forward + backward) against torch eager and torch.compile; the fused LM-head loss (bf16 and
float32 logits) against eager, each row printed as soon as it is measured, then a profile of
one call split into GEMM and row-kernel time; then, in a table of their own, Liger's fused-linear
GRPO loss and Cut Cross-Entropy where installed (their cold compiles cannot delay our rows);
achieved GB/s against the measured device-to-device copy bandwidth; peak memory. `--part loss`
runs only our loss rows and the profile, `--part baselines` only Liger's and CCE's rows, with
ours float32-logits loss timed again beside them in the same process.
On CPU: the torch references, and the peak extra memory of the fused-linear loss against eager
logits at V = 151,936 with a scaled-down token count, so the memory claim is checked every run.
Baselines are the same functions the tests compare against.
"""
from __future__ import annotations

import argparse
import math

import torch

from freshper.kernels import fused_linear_policy_loss, policy_loss, policy_loss_reference
from freshper.kernels.fused_linear_policy_loss import default_chunk
from freshper.kernels.sampler import sample_reference, sample_triton
from freshper.profiling.timing import graph_us, median_seconds

VOCAB = 151_936  # Qwen2.5


def _keys(n: int, device) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(0)
    k = torch.randn(n, generator=g, dtype=torch.float64) * 2
    k[torch.rand(n, generator=g) < 0.05] = -math.inf  # a few empty slots
    return k.to(device)


def _loss_inputs(B, T, device, dtype=torch.float32, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 3)
    old = logp + torch.randn(B, T, generator=g) * 0.2
    adv = torch.randn(B, T, generator=g)
    mask = torch.rand(B, T, generator=g) > 0.1
    w = torch.rand(B, generator=g)
    ref = logp + torch.randn(B, T, generator=g) * 0.1
    to = lambda t: t.to(device)  # noqa: E731
    return to(logp.to(dtype)), to(old), to(adv), to(mask), to(w), to(ref)


def _eager_linear(hidden, weight, targets, old, adv, mask, w):
    logits = (hidden @ weight.T).float()
    logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    return policy_loss_reference(logp, old, adv, mask, w)


def _fwd_bwd(fn, *leaves):
    def run():
        loss = fn()
        torch.autograd.grad(loss, leaves)
    return run


# --------------------------------------------------------------------------- CPU measurement
def _rss_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_extra_cpu_mb(run) -> float:
    """Peak resident memory above the current level while `run()` executes (Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        return float("nan")
    before = _rss_mb("VmRSS")
    run()
    return _rss_mb("VmHWM") - before


def _median_ms(run, reps=5) -> float:
    return median_seconds(run, reps) * 1e3


def bench_cpu(quick: bool):
    print("# CPU: torch references (Triton kernels need CUDA)")
    print("\n| sampler N | B | torch reference (ms) |\n|---|---|---|")
    for n in ([10**4, 10**5] if quick else [10**4, 10**5, 10**6]):
        keys = _keys(n, "cpu")
        u = torch.rand(256, dtype=torch.float64)
        print(f"| {n:.0e} | 256 | {_median_ms(lambda: sample_reference(keys, u, 0.4)):.2f} |")

    tokens = 256 if quick else 1024
    B, T, H = 2, tokens // 2, 256
    print(f"\n## fused-linear policy loss, V = {VOCAB}, {B}x{T} tokens, H = {H}, float32, forward + backward")
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(B, T, H, generator=g).requires_grad_(True)
    weight = (torch.randn(VOCAB, H, generator=g) / H ** 0.5).requires_grad_(True)
    targets = torch.randint(0, VOCAB, (B, T), generator=g)
    _, old, adv, mask, w, _ = _loss_inputs(B, T, "cpu")
    eager = _fwd_bwd(lambda: _eager_linear(hidden, weight, targets, old, adv, mask, w), hidden, weight)
    fused = _fwd_bwd(lambda: fused_linear_policy_loss(hidden, weight, targets, old, adv, mask, w), hidden, weight)
    chunk = default_chunk(int(mask.sum()), VOCAB, "cpu")
    logits_mb = B * T * VOCAB * 4 / 2**20
    grads_mb = (VOCAB * H + B * T * H) * 4 / 2**20  # the gradients that must exist: weight + hidden
    m_eager, m_fused = _peak_extra_cpu_mb(eager), _peak_extra_cpu_mb(fused)
    print("| path | peak extra memory (MiB) | / needed gradients | time (ms) |\n|---|---|---|---|")
    print(f"| eager logits + log_softmax | {m_eager:.0f} | {m_eager / grads_mb:.2f} | {_median_ms(eager, 3):.0f} |")
    print(f"| fused linear (default chunk {chunk} tokens) | {m_fused:.0f} | {m_fused / grads_mb:.2f} | "
          f"{_median_ms(fused, 3):.0f} |")
    print(f"\nfused / eager peak memory: {m_fused / m_eager:.1%}; needed gradients (weight + hidden): "
          f"{grads_mb:.0f} MiB; one float32 logits tensor: {logits_mb:.0f} MiB")
    return {"fused_over_eager_memory": m_fused / m_eager}


# -------------------------------------------------------------------------- CUDA measurement
def _copy_bandwidth_gbs() -> float:
    import triton.testing

    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x))
    return 2 * x.numel() / ms / 1e6


def bench_cuda(quick: bool, part: str = "all"):
    import triton

    name = torch.cuda.get_device_name()
    print(f"# CUDA: {name}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    results = {}
    if part == "all":
        results.update(_sampler_and_policy_rows(quick))
    shapes = _loss_shapes(quick)
    if part in ("all", "loss"):
        from freshper.profiling.loss_profile import path_line, profile_fused, split, table

        print(path_line("cuda"), flush=True)  # which float32-logits path the rows below time
        results.update(_fused_rows(shapes))

        B, T, H, V = shapes[0]
        prof, _ = profile_fused(B * T, H, V, "cuda")
        print(f"\none fused call, float32 logits, {B * T} tokens, H={H}, V={V}: device time by part", flush=True)
        print(table(split(prof, True), "part"), flush=True)
    if part in ("all", "baselines"):
        results.update(_baseline_rows(shapes))
    return results


def _sampler_and_policy_rows(quick: bool) -> dict:
    import triton.testing

    dev = "cuda"
    copy_bw = _copy_bandwidth_gbs()
    print(f"device-to-device copy: {copy_bw:.0f} GB/s")
    results = {"copy_gbs": copy_bw}

    print("\n| sampler N | B | fused Triton (us) | graph-captured (us) | torch composite (us) | speedup | "
          "buffer.sample (us) | GB/s (bytes moved) |")
    print("|---|---|---|---|---|---|---|---|")
    for n in ([10**4, 10**6] if quick else [10**4, 10**5, 10**6, 10**7]):
        keys = _keys(n, dev)
        u = torch.rand(256, dtype=torch.float64, device=dev)
        # No host syncs on either side: the live-slot check is the caller's (the buffer knows).
        t_fused = triton.testing.do_bench(lambda: sample_triton(keys, u, 0.4, check_live=False)) * 1e3
        t_graph = graph_us(lambda: sample_triton(keys, u, 0.4, check_live=False))
        t_ref = triton.testing.do_bench(lambda: sample_reference(keys, u, 0.4, check_live=False)) * 1e3
        t_buf = _buffer_sample_us(n, dev)
        moved = sampler_bytes(n, 256)
        print(f"| {n:.0e} | 256 | {t_fused:.1f} | {t_graph} | {t_ref:.1f} | {t_ref / t_fused:.1f}x | {t_buf:.1f} | "
              f"{moved / (t_fused * 1e-6) / 1e9:.0f} |", flush=True)
        results[f"sampler_us_{n:.0e}"] = t_fused
        results[f"sampler_speedup_{n:.0e}"] = t_ref / t_fused

    print("\n| policy loss B x T | Triton (ms) | eager (ms) | torch.compile (ms) | Triton GB/s |")
    print("|---|---|---|---|---|")
    compiled = torch.compile(policy_loss_reference)
    for B, T in ([(8, 1024)] if quick else [(8, 1024), (16, 4096), (8, 8192)]):
        logp, old, adv, mask, w, ref = _loss_inputs(B, T, dev)
        leaf = logp.clone().requires_grad_(True)
        kw = dict(ref_logp=ref, kl_coef=0.01)
        t_tr = triton.testing.do_bench(_fwd_bwd(lambda: policy_loss(leaf, old, adv, mask, w, **kw), leaf))
        t_eager = triton.testing.do_bench(_fwd_bwd(lambda: policy_loss_reference(leaf, old, adv, mask, w, **kw), leaf))
        try:
            t_comp = triton.testing.do_bench(_fwd_bwd(lambda: compiled(leaf, old, adv, mask, w, **kw), leaf))
            comp = f"{t_comp:.3f}"
        except Exception as e:  # report, do not hide
            comp = f"failed: {type(e).__name__}"
        bytes_moved = B * T * (4 * 5 + 1 + 4)  # logp, old, adv, ref, dl write, mask, grad write
        print(f"| {B}x{T} | {t_tr:.3f} | {t_eager:.3f} | {comp} | {bytes_moved / (t_tr * 1e-3) / 1e9:.0f} |",
              flush=True)
        results[f"loss_speedup_{B}x{T}"] = t_eager / t_tr
    return results


def _loss_shapes(quick: bool) -> list[tuple[int, int, int, int]]:
    """Qwen2.5-0.5B's head and SmolLM2's (B, T, H, V); more and larger without --quick."""
    shapes = [(4, 1024, 896, VOCAB), (4, 1024, 576, 49152)]
    if not quick:
        shapes += [(4, 2048, 896, VOCAB), (2, 4096, 3584, VOCAB)]
    return shapes


def _loss_case(B, T, H, V, dev="cuda"):
    """bf16 hidden and head (leaves), targets, and the loss's other inputs, seeded."""
    g = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(B, T, H, generator=g).to(dev, torch.bfloat16).requires_grad_(True)
    weight = (torch.randn(V, H, generator=g) / H ** 0.5).to(dev, torch.bfloat16).requires_grad_(True)
    targets = torch.randint(0, V, (B, T), generator=g).to(dev)
    _, old, adv, mask, w, _ = _loss_inputs(B, T, dev)
    return hidden, weight, targets, old, adv, mask, w


def _ours(hidden, weight, targets, old, adv, mask, w, logits_dtype=None):
    """Our loss called as the trainer calls it: the active-token count known, no host-side check,
    the default chunking (default_chunk)."""
    n_act = int(mask.sum())
    return _fwd_bwd(lambda: fused_linear_policy_loss(hidden, weight, targets, old, adv, mask, w, n_active=n_act,
                                                     check=False, logits_dtype=logits_dtype), hidden, weight)


def _peak_gib(run) -> float:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def _fused_rows(shapes) -> dict:
    """Ours (bf16 logits, as eager rounds them; float32 logits, the trainer's default) against
    eager, one row per shape, each printed as soon as it is measured."""
    import triton.testing

    print("\n| fused-linear B x T, H, V, bf16 | fused (ms) | fused, float32 logits (ms) | eager (ms) | "
          "fused/eager time | float32 logits/eager time | fused peak (GiB) | float32 logits peak (GiB) | "
          "eager peak (GiB) | float32 logits/eager memory |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    results = {}
    for B, T, H, V in shapes:
        case = _loss_case(B, T, H, V)
        fused, fused32 = _ours(*case), _ours(*case, logits_dtype=torch.float32)
        eager = _fwd_bwd(lambda: _eager_linear(*case), case[0], case[1])
        peaks = {label: _peak_gib(run) for label, run in (("fused", fused), ("fused32", fused32), ("eager", eager))}
        t_fused, t_fused32, t_eager = (triton.testing.do_bench(run) for run in (fused, fused32, eager))
        print(f"| {B}x{T}, H={H}, V={V} | {t_fused:.2f} | {t_fused32:.2f} | {t_eager:.2f} | {t_fused / t_eager:.2f} | "
              f"{t_fused32 / t_eager:.2f} | {peaks['fused']:.2f} | {peaks['fused32']:.2f} | {peaks['eager']:.2f} | "
              f"{peaks['fused32'] / peaks['eager']:.0%} |", flush=True)
        key = f"{B}x{T}x{H}x{V}"
        results[f"fused_time_ratio_{key}"] = t_fused / t_eager
        results[f"fused32_time_ratio_{key}"] = t_fused32 / t_eager
        results[f"fused_memory_ratio_{key}"] = peaks["fused"] / peaks["eager"]
        results[f"fused32_memory_ratio_{key}"] = peaks["fused32"] / peaks["eager"]
    return results


def _baseline_rows(shapes) -> dict:
    """Liger's fused-linear GRPO loss and Cut Cross-Entropy beside ours (float32 logits, timed
    again in this process), one row per shape, printed as measured."""
    import triton.testing

    print("\n| baselines B x T, H, V, bf16 | ours, float32 logits (ms) | Liger GRPO (ms) | "
          "CCE loss only (ms; a floor: it skips gradient tiles it filters as negligible) |")
    print("|---|---|---|---|", flush=True)
    results = {}
    for B, T, H, V in shapes:
        hidden, weight, targets, old, adv, mask, w = case = _loss_case(B, T, H, V)
        t_ours = triton.testing.do_bench(_ours(*case, logits_dtype=torch.float32))
        liger = _liger_time(hidden, weight, targets, old, adv, mask)
        cce = _cce_time(hidden, weight, targets)
        print(f"| {B}x{T}, H={H}, V={V} | {t_ours:.2f} | {liger} | {cce} |", flush=True)
        results[f"ours32_ms_{B}x{T}x{H}x{V}"] = t_ours
    return results


def sampler_bytes(n: int, draws: int, block: int = 4096, sub: int = 64) -> int:
    """Bytes one fused sample call moves: every float64 key read once; per block, 3 stats and
    block/sub sub-block masses written, then 4 stats read and the prefix and owner written by the
    scan; per draw the binary search's prefix reads, the block's stats, one sub-block row of masses
    and one sub-block of keys read, 3 outputs written."""
    nb = -(-n // block)
    steps = nb.bit_length()
    per_draw = 8 * (steps + 3 + block // sub + sub + 3) + 4
    return 8 * n + 8 * nb * (3 + block // sub) + 8 * 4 * nb + 12 * nb + draws * per_draw


def _buffer_sample_us(n: int, dev) -> float:
    """ReplayBuffer.sample(256) on a full CUDA buffer of n slots: Python, RNG, NVTX and gathers
    included; the cost a trainer pays per replay batch."""
    import triton.testing

    from freshper import ReplayBuffer

    buf = ReplayBuffer(n, mode="freshper", tau=500.0, device=dev)
    g = torch.Generator(device="cpu").manual_seed(0)
    for s in range(0, n, 2**20):
        m = min(2**20, n - s)
        buf.add(torch.rand(m, generator=g, dtype=torch.float64) + 0.01, step=s // 2**20)
    return triton.testing.do_bench(lambda: buf.sample(256)) * 1e3


def _liger_time(hidden, weight, targets, old, adv, mask) -> str:
    """Liger's fused-linear GRPO loss on the same shapes, if the package is installed."""
    try:
        import triton.testing
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
    except Exception:
        return "not installed"
    try:
        loss_fn = LigerFusedLinearGRPOLoss(beta=0.0, use_ref_model=False)
        adv_seq = adv.mean(-1)

        def run():
            out = loss_fn(hidden, weight, targets, mask.long(), adv_seq, old_per_token_logps=old)
            loss = out[0] if isinstance(out, tuple) else out
            torch.autograd.grad(loss, (hidden, weight))
        return f"{triton.testing.do_bench(run):.2f}"
    except Exception as e:  # the API moves between versions; say so instead of guessing
        return f"failed: {type(e).__name__}: {str(e)[:60]}"


def _cce_time(hidden, weight, targets) -> str:
    """Cut Cross-Entropy's linear cross-entropy (loss and both gradients; a plain CE loss, not a
    policy loss), if the package is installed. A floor, not a like-for-like time: CCE filters
    gradients, skipping backward tiles whose softmax entries are negligible (about half of them
    on random logits), which a policy loss's exact gradient cannot."""
    try:
        import triton.testing
        from cut_cross_entropy import linear_cross_entropy
    except Exception:
        return "not installed"
    try:
        def run():
            loss = linear_cross_entropy(hidden, weight, targets)
            torch.autograd.grad(loss, (hidden, weight))
        return f"{triton.testing.do_bench(run):.2f}"
    except Exception as e:  # report, do not hide
        return f"failed: {type(e).__name__}: {str(e)[:60]}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer, smaller shapes")
    ap.add_argument("--part", choices=("all", "loss", "baselines"), default="all",
                    help="on CUDA: everything, our fused loss rows and profile only, or Liger's and CCE's rows only")
    args = ap.parse_args(argv)
    if torch.cuda.is_available():
        return bench_cuda(args.quick, args.part)
    return bench_cpu(args.quick)


if __name__ == "__main__":
    main()

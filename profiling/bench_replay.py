"""Per-step cost of the replay buffer against cpprb's PrioritizedReplayBuffer and TorchRL's.

One step is what the trainer does each iteration: add(B) + sample(B) + update_priorities(B).
FreshPER pays for the age decay; cpprb and TorchRL run classic PER (no decay) on their C++
segment trees (cpprb and we in float64; TorchRL in its default float32: with dtype=float64
its buffer fails on extend at 0.14.0, "expected scalar type Double but found Float", its
default priority being float32). TorchRL is timed twice: the replay buffer a user builds
(TensorDictReplayBuffer + LazyTensorStorage + PrioritizedSampler) and its PrioritizedSampler
alone on a filled storage (the segment trees and their Python wrapper, no tensordict). All run
in this process on the same machine, and the table prints each peer's time over ours.
A peer that does not import is reported as n/a.

    python -m freshper.profiling.bench_replay [--capacities 1e4,1e5,1e6] [--batch 256] [--steps 200]
"""
from __future__ import annotations

import argparse
import platform

import numpy as np
import torch

from freshper import ReplayBuffer
from freshper.profiling.timing import graph_us, median_seconds


def _median_us(fn, steps: int) -> float:
    return median_seconds(fn, steps, warmup=20) * 1e6


def bench_freshper(capacity: int, batch: int, steps: int, sampler: str, device: str = "cpu",
                   profile: bool = False, sync_free: bool | None = None) -> float:
    buf = ReplayBuffer(capacity, mode="freshper", tau=500.0, sampler=sampler, device=device, sync_free=sync_free)
    g = torch.Generator().manual_seed(0)
    chunk = 10_000
    step = 0
    while len(buf) < capacity:
        n = min(chunk, capacity - len(buf))
        buf.add(torch.rand(n, generator=g, dtype=torch.float64), step=step, obs=torch.zeros(n, 1))
        step += 1
    state = {"step": step}
    # inputs made where the buffer lives, as a GPU trainer's rewards and priorities are
    gd = torch.Generator(device=device).manual_seed(1)
    obs = torch.zeros(batch, 1, device=device)

    def one():
        state["step"] += 1
        t = state["step"]
        buf.add(torch.rand(batch, generator=gd, dtype=torch.float64, device=device), step=t, obs=obs)
        b = buf.sample(batch, step=t)
        buf.update_priorities(b.indices, torch.rand(batch, generator=gd, dtype=torch.float64, device=device))

    if device == "cuda":
        def timed():
            one()
            torch.cuda.synchronize()
        us = _median_us(timed, steps)
        if profile:  # where a step's time goes: each phase's wall time, then the top host-side ops
            _profile_phases(buf, batch, g, state)
        return us
    return _median_us(one, steps)


def bench_captured(capacity: int, batch: int, steps: int) -> str:
    """A sync-free CUDA buffer's step (add + sample + update of `batch`, device inputs) captured in
    one CUDA graph and replayed: the launch overhead gone, what the GPU itself takes. Capture fails
    at any host sync, so a result is also the proof that the step has none. A replay repeats the
    captured step number and beta; or why capture failed."""
    buf = ReplayBuffer(capacity, mode="freshper", tau=500.0, sampler="triton", device="cuda", sync_free=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    for s in range(0, capacity, 2**20):
        n = min(2**20, capacity - s)
        buf.add(torch.rand(n, generator=g, dtype=torch.float64, device="cuda") + 0.01, step=0,
                obs=torch.zeros(n, 1, device="cuda"))
    prio = torch.rand(batch, generator=g, dtype=torch.float64, device="cuda") + 0.01
    obs = torch.zeros(batch, 1, device="cuda")

    def one():
        buf.add(prio, step=1, obs=obs)
        b = buf.sample(batch, step=1)
        buf.update_priorities(b.indices, prio)

    out = graph_us(one, generators=(buf._gen,))
    buf.check()
    return out


def _profile_phases(buf, batch: int, g, state) -> None:
    import time

    phases = {"add": [], "sample": [], "update_priorities": []}
    for _ in range(50):
        state["step"] += 1
        t, pr = state["step"], torch.rand(batch, generator=g, dtype=torch.float64)
        for name, fn in (("add", lambda: buf.add(pr, step=t, obs=torch.zeros(batch, 1))),
                         ("sample", lambda: state.__setitem__("b", buf.sample(batch, step=t))),
                         ("update_priorities", lambda: buf.update_priorities(state["b"].indices, pr))):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            phases[name].append(time.perf_counter() - t0)
    print("  phases (median us): " + ", ".join(f"{k} {sorted(v)[len(v) // 2] * 1e6:.0f}" for k, v in phases.items()))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            state["step"] += 1
            t = state["step"]
            buf.add(torch.rand(batch, generator=g, dtype=torch.float64), step=t, obs=torch.zeros(batch, 1))
            b = buf.sample(batch, step=t)
            buf.update_priorities(b.indices, torch.rand(batch, generator=g, dtype=torch.float64))
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def bench_cpprb(capacity: int, batch: int, steps: int) -> float | None:
    try:
        from cpprb import PrioritizedReplayBuffer
    except ImportError:
        return None
    rng = np.random.default_rng(0)
    rb = PrioritizedReplayBuffer(capacity, {"obs": {"shape": (1,)}}, alpha=0.6)
    for s in range(0, capacity, 10_000):
        n = min(10_000, capacity - s)
        rb.add(obs=np.zeros((n, 1)), priorities=rng.random(n) + 1e-6)

    def one():
        rb.add(obs=np.zeros((batch, 1)), priorities=rng.random(batch) + 1e-6)
        b = rb.sample(batch, beta=0.4)
        rb.update_priorities(b["indexes"], rng.random(batch) + 1e-6)

    return _median_us(one, steps)


def bench_torchrl(capacity: int, batch: int, steps: int, sampler_only: bool) -> float | None:
    try:
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, PrioritizedSampler, TensorDictReplayBuffer
        from torchrl.data.replay_buffers.samplers.prioritized import SumSegmentTreeFp32
    except ImportError:
        return None
    if SumSegmentTreeFp32 is None:  # its C++ extension did not load: the sampler would refuse to start
        return None
    g = torch.Generator().manual_seed(0)

    def rand(n):
        return torch.rand(n, generator=g) + 1e-6

    sampler = PrioritizedSampler(capacity, alpha=0.6, beta=0.4)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, priority_key="priority",
                                batch_size=batch)
    for s in range(0, capacity, 10_000):
        n = min(10_000, capacity - s)
        rb.extend(TensorDict({"obs": torch.zeros(n, 1), "priority": rand(n)}, [n]))
    if sampler_only:
        state = {"next": 0}

        def one():
            new = (state["next"] + torch.arange(batch)) % capacity  # FIFO slots, as the storage's
            state["next"] = int(new[-1]) + 1
            sampler.update_priority(new, rand(batch))
            idx, _ = sampler.sample(rb.storage, batch)
            sampler.update_priority(idx, rand(batch))
    else:
        def one():
            rb.extend(TensorDict({"obs": torch.zeros(batch, 1), "priority": rand(batch)}, [batch]))
            b = rb.sample()
            rb.update_priority(b["index"], rand(batch))

    return _median_us(one, steps)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capacities", default="1e4,1e5,1e6", help="comma-separated buffer sizes")
    ap.add_argument("--batch", type=int, default=256, help="trajectories added, sampled and updated per step")
    ap.add_argument("--steps", type=int, default=200, help="timed steps per configuration (median reported)")
    ap.add_argument("--scan", action="store_true", help="also time the flat torch scan sampler")
    ap.add_argument("--profile", action="store_true", help="on CUDA: each phase's time and the top ops of a step")
    ap.add_argument("--cuda-only", action="store_true",
                    help="on CUDA: only the CUDA table (the CPU tree beside it), not cpprb's and TorchRL's")
    args = ap.parse_args(argv)
    caps = [int(float(c)) for c in args.capacities.split(",")]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"# bench_replay: B={args.batch}, {args.steps} steps, median per step; "
          f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    cols = ["capacity", "freshper tree (us)"] + (["freshper scan (us)"] if args.scan else []) + [
        "cpprb PER (us)", "cpprb / freshper", "TorchRL buffer (us)", "TorchRL / freshper",
        "TorchRL sampler alone (us)", "sampler alone / freshper"]
    cpu_table = not (args.cuda_only and torch.cuda.is_available())
    if cpu_table:
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
    for cap in caps if cpu_table else ():
        tree = bench_freshper(cap, args.batch, args.steps, "tree")
        row = [f"{cap:.0e}", f"{tree:.0f}"]
        if args.scan:
            row.append(f"{bench_freshper(cap, args.batch, max(20, args.steps // 10), 'scan'):.0f}")
        for ref in (bench_cpprb(cap, args.batch, args.steps), bench_torchrl(cap, args.batch, args.steps, False),
                    bench_torchrl(cap, args.batch, args.steps, True)):
            row += [f"{ref:.0f}" if ref else "n/a", f"{ref / tree:.2f}x" if ref else "n/a"]
        print("| " + " | ".join(row) + " |", flush=True)
    if torch.cuda.is_available():
        # the step on device inputs, without and with the sync-free path, and captured in a CUDA graph; against
        # the CPU tree, same process
        print("\n| capacity | CUDA, host syncs (us) | CUDA, sync-free (us) | CUDA graph (us) | CPU tree (us) | "
              "tree / sync-free |\n|---|---|---|---|---|---|")
        for cap in caps:
            old = bench_freshper(cap, args.batch, args.steps, "triton", "cuda", sync_free=False)
            new = bench_freshper(cap, args.batch, args.steps, "triton", "cuda", args.profile and cap == caps[-1],
                                 sync_free=True)
            graph = bench_captured(cap, args.batch, args.steps)
            tree = bench_freshper(cap, args.batch, args.steps, "tree")
            print(f"| {cap:.0e} | {old:.0f} | {new:.0f} | {graph} | {tree:.0f} | {tree / new:.2f}x |", flush=True)


if __name__ == "__main__":
    main()

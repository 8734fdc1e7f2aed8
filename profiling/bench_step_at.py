"""The buffer step (add B + sample B + update_priorities B, FreshPER, CPU tree) of the freshper
package found in SRC, e.g. a `git worktree` of an older commit, to compare two commits in
processes run alternately on one machine.

    python profiling/bench_step_at.py SRC [--capacity 1e6] [--batch 256] [--steps 300]
"""
import argparse
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="a checkout holding freshper/ (its buffer is imported from there)")
    ap.add_argument("--capacity", type=float, default=1e6)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    sys.path.insert(0, a.src)
    import torch

    import freshper
    from freshper import ReplayBuffer

    if not freshper.__file__.startswith(a.src):
        raise SystemExit(f"freshper was imported from {freshper.__file__}, not from {a.src}")
    torch.set_num_threads(1)
    cap, B = int(a.capacity), a.batch
    buf = ReplayBuffer(cap, mode="freshper", tau=500.0, device="cpu")
    g = torch.Generator().manual_seed(0)
    step = 0
    while len(buf) < cap:
        n = min(10_000, cap - len(buf))
        buf.add(torch.rand(n, generator=g, dtype=torch.float64), step=step, obs=torch.zeros(n, 1))
        step += 1

    def one(t):
        buf.add(torch.rand(B, generator=g, dtype=torch.float64), step=t, obs=torch.zeros(B, 1))
        b = buf.sample(B, step=t)
        buf.update_priorities(b.indices, torch.rand(B, generator=g, dtype=torch.float64))

    for i in range(30):
        one(step + i)
    times = []
    for i in range(a.steps):
        t0 = time.perf_counter()
        one(step + 30 + i)
        times.append(time.perf_counter() - t0)
    times.sort()
    print(f"{a.src}: capacity {cap:.0e}, B {B}: {times[len(times) // 2] * 1e6:.0f} us per step (median)")


if __name__ == "__main__":
    main()

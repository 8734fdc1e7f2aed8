"""Where one add + sample + update step of the CPU buffer spends its time at N slots (B = 256,
FreshPER mode, FIFO, numba tree): each call alone, the compiled tree work alone with cold and
warm caches, and cpprb's whole step beside it; median microseconds.

    python breakdown.py 1e6        (in the project's venv)
"""
import sys
import time

import numpy as np
import torch
from cpprb import PrioritizedReplayBuffer

from freshper import ReplayBuffer
from freshper import sumtree as S

torch.set_num_threads(1)
cap, B = int(float(sys.argv[1])), 256
buf = ReplayBuffer(cap, mode="freshper", tau=500.0, sampler="tree")
g = torch.Generator().manual_seed(0)
step = 0
while len(buf) < cap:
    n = min(10_000, cap - len(buf))
    buf.add(torch.rand(n, generator=g, dtype=torch.float64), step=step, obs=torch.zeros(n, 1))
    step += 1
st = {"s": step}
pr, obs = torch.rand(B, generator=g, dtype=torch.float64), torch.zeros(B, 1)


def med(f, n=300):
    for _ in range(20):
        f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return np.median(ts) * 1e6


def add():
    st["s"] += 1
    buf.add(pr, step=st["s"], obs=obs)


def sample():
    st["b"] = buf.sample(B, step=st["s"])


def update():
    buf.update_priorities(st["b"].indices, pr)


rows = {"whole step": med(lambda: (add(), sample(), update())), "add": med(add)}
sample()
rows.update({"sample": med(sample), "update_priorities": med(update)})
t, rng = buf._tree, np.random.default_rng(0)
idx, p, w = np.empty(B, np.int64), np.empty(B), np.empty(B)
us = iter([rng.random(B) for _ in range(400)] * 100)
u0 = rng.random(B)
rows["  tree: 256 stratified descents, cold"] = med(
    lambda: S.sample_slots(t.sums, t.mins, t.size, buf._np_keys, next(us), 0.4, idx, p, w))
rows["  tree: the same 256 descents again (warm)"] = med(
    lambda: S.sample_slots(t.sums, t.mins, t.size, buf._np_keys, u0, 0.4, idx, p, w))
slots = iter([rng.integers(0, cap, B) for _ in range(400)] * 100)
rows["  tree: lift of 256 random leaves, cold"] = med(lambda: S._lift(t.sums, t.mins, t.size, next(slots)))
i = st["b"].indices
rows["  check_indices (update)"] = med(lambda: buf._check_indices(i))
rows["  check_priority (add, update)"] = med(lambda: buf._check_priority(pr, B))
rows["  _batch: gather birth and fields (sample)"] = med(
    lambda: buf._batch(i, st["b"].weights, st["b"].probs, st["s"], 0.4))
rb, r = PrioritizedReplayBuffer(cap, {"obs": {"shape": (1,)}}, alpha=0.6), np.random.default_rng(0)
for s in range(0, cap, 10_000):
    n = min(10_000, cap - s)
    rb.add(obs=np.zeros((n, 1)), priorities=r.random(n) + 1e-6)


def cp():
    rb.add(obs=np.zeros((B, 1)), priorities=r.random(B) + 1e-6)
    b = rb.sample(B, beta=0.4)
    rb.update_priorities(b["indexes"], r.random(B) + 1e-6)


rows["cpprb whole step"] = med(cp)
for k, v in rows.items():
    print(f"{cap:.0e} | {k} | {v:.1f} us")

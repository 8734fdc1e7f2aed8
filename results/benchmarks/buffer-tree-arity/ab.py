"""The binary sum tree of freshper/sumtree.py against an 8-ary one (sumtree_8ary.py here: a
node's 8 children in one 64-byte line, 7 levels at 1e6 instead of 20), in one process, the
two alternating: a stratified sample of B=256 (cold: new uniforms each call) and the lift of
256 random leaves, median microseconds over 400 calls, three rounds.

    python ab.py 1e6        (from this folder, in the project's venv)
"""
import sys
import time

import numpy as np
import sumtree_8ary as N

from freshper import sumtree as O

cap, B = int(float(sys.argv[1])), 256
rng = np.random.default_rng(0)
keys = rng.random(cap)
to, tn = O.SumMinTree(cap), N.SumMinTree(cap)
to.rebuild_from_keys(keys, 1.0)
tn.rebuild_from_keys(keys, 1.0)
idx, p, w = np.empty(B, np.int64), np.empty(B), np.empty(B)
us = [rng.random(B) for _ in range(1000)]
slots = [rng.integers(0, cap, B) for _ in range(1000)]
a, b = np.empty(B, np.int64), np.empty(B, np.int64)
O._find(to.sums, to.size, np.sort(us[0]) * to.total, a)
N._find(tn.sums, tn.offs, np.sort(us[0]) * tn.total, b)
assert (a == b).all(), "the two trees must draw the same leaves"


def median_us(f, arr, n=400):
    ts = []
    for i in range(n):
        x = arr[i % len(arr)]
        t0 = time.perf_counter()
        f(x)
        ts.append(time.perf_counter() - t0)
    return np.median(ts) * 1e6


for _ in range(3):
    so = median_us(lambda u: O.sample_slots(to.sums, to.mins, to.size, keys, u, 0.4, idx, p, w), us)
    sn = median_us(lambda u: N.sample_slots(tn.sums, tn.mins, tn.offs, keys, u, 0.4, idx, p, w), us)
    lo = median_us(lambda s: O._lift(to.sums, to.mins, to.size, s), slots)
    ln = median_us(lambda s: N._lift(tn.sums, tn.mins, tn.offs, s), slots)
    print(f"{cap:.0e}: sample binary {so:.1f} us, 8-ary {sn:.1f} us | lift binary {lo:.1f} us, 8-ary {ln:.1f} us",
          flush=True)

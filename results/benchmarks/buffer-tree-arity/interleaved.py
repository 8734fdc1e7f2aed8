"""The sum tree's nodes as two arrays (sums, mins: the layout of freshper/sumtree.py) against one
interleaved (2*size, 2) array ([sum, min] of a node side by side, so a lift reads one cache line
per level instead of two): the lift of 256 random leaves and 256 stratified descents, alternating
in one process, median microseconds of 300 calls cycling over 500 batches (cold caches at 1e6
leaves and up). Three rounds per capacity.

    python interleaved.py 1e6        (in the project's venv)
"""
import itertools
import sys
import time

import numba
import numpy as np


@numba.njit(cache=True)
def lift_two_arrays(sums, mins, size, idx):
    pos = idx + size
    level = size
    while level > 1:
        for j in range(pos.shape[0]):
            p = pos[j] >> 1
            pos[j] = p
            left = 2 * p
            sums[p] = sums[left] + sums[left + 1]
            mins[p] = min(mins[left], mins[left + 1])
        level >>= 1


@numba.njit(cache=True)
def lift_interleaved(nodes, size, idx):
    pos = idx + size
    level = size
    while level > 1:
        for j in range(pos.shape[0]):
            p = pos[j] >> 1
            pos[j] = p
            left = 2 * p
            nodes[p, 0] = nodes[left, 0] + nodes[left + 1, 0]
            nodes[p, 1] = min(nodes[left, 1], nodes[left + 1, 1])
        level >>= 1


@numba.njit(cache=True)
def find_two_arrays(sums, size, targets, out):
    n = targets.shape[0]
    out[:] = 1
    x = targets.copy()
    level = size
    while level > 1:
        for j in range(n):
            left = 2 * out[j]
            s_left = sums[left]
            if sums[left + 1] > 0.0 and (x[j] >= s_left or s_left <= 0.0):
                x[j] -= s_left
                out[j] = left + 1
            else:
                out[j] = left
        level >>= 1


@numba.njit(cache=True)
def find_interleaved(nodes, size, targets, out):
    n = targets.shape[0]
    out[:] = 1
    x = targets.copy()
    level = size
    while level > 1:
        for j in range(n):
            left = 2 * out[j]
            s_left = nodes[left, 0]
            if nodes[left + 1, 0] > 0.0 and (x[j] >= s_left or s_left <= 0.0):
                x[j] -= s_left
                out[j] = left + 1
            else:
                out[j] = left
        level >>= 1


def median_us(f, batches):
    it = itertools.cycle(batches)
    ts = []
    for _ in range(300):
        a = next(it)
        t = time.perf_counter()
        f(a)
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e6


def main():
    cap, B = int(float(sys.argv[1])), 256
    size = 1 << (cap - 1).bit_length()
    rng = np.random.default_rng(0)
    sums, mins = np.zeros(2 * size), np.full(2 * size, np.inf)
    sums[size:size + cap], mins[size:size + cap] = rng.random(cap), rng.random(cap)
    level = size
    while level > 1:  # internal nodes, one level at a time
        half = level // 2
        sums[half:level] = sums[2 * half:2 * level:2] + sums[2 * half + 1:2 * level:2]
        mins[half:level] = np.minimum(mins[2 * half:2 * level:2], mins[2 * half + 1:2 * level:2])
        level = half
    nodes = np.stack([sums, mins], axis=1)  # (2*size, 2), C order: [sum, min] of a node together
    slots = [rng.integers(0, cap, B) for _ in range(500)]
    targets = [np.sort(rng.random(B)) * sums[1] for _ in range(500)]
    out = np.empty(B, np.int64)
    for _ in range(3):
        row = {"lift, two arrays": median_us(lambda s: lift_two_arrays(sums, mins, size, s), slots),
               "lift, interleaved": median_us(lambda s: lift_interleaved(nodes, size, s), slots),
               "descents, two arrays": median_us(lambda t: find_two_arrays(sums, size, t, out), targets),
               "descents, interleaved": median_us(lambda t: find_interleaved(nodes, size, t, out), targets)}
        print(f"{cap:.0e}", {k: round(v, 1) for k, v in row.items()}, flush=True)


if __name__ == "__main__":
    main()

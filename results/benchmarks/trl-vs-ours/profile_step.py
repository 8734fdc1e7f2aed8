"""Which torch operators the non-generation part of an iteration spends its time in, ours against
TRL's GRPOTrainer, on bench_trl's job (replay off, HF generation, activation checkpointing off):
torch.profiler over `--iterations` iterations, operators ranked by self CPU time, generation's
share included (it is the same transformers generate on both sides).

    python profile_step.py ours|trl [--iterations 3] [--threads 2]    (from this folder, in the venv)
"""
import argparse
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from freshper.profiling import bench_trl

p = argparse.ArgumentParser()
p.add_argument("side", choices=("ours", "trl"))
p.add_argument("--iterations", type=int, default=3)
p.add_argument("--threads", type=int, default=2)
a = p.parse_args()
torch.set_num_threads(a.threads)
run = bench_trl.run_ours if a.side == "ours" else bench_trl.run_trl
with tempfile.TemporaryDirectory() as out, profile(activities=[ProfilerActivity.CPU]) as prof:
    res = run(False, a.iterations, 1, out, False, "hf")
print(f"# {a.side}: {a.iterations} iterations, {a.threads} threads; means over iterations 2-{a.iterations}: "
      f"{res['s_per_iter']:.2f} s/iteration, generate {res['generate_s']:.2f} s, rest {res['rest_s']:.2f} s")
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=50))

"""Pre-clip gradient norms of the SmolLM2 presets, from the committed runs of the registered
studies (their on-policy updates' `grad_norm`; those runs predate `replay_grad_norm`).

    python results/benchmarks/grad-norms-cpu-2026-12-07/from_studies.py
"""
import json
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parents[2]
STUDIES = {"smollm2-135m-math": ("compare-study-staleness", "compare-precision-bf16", "compare-precision-float32"),
           "smollm2-135m-multiply": ("compare-study-multiply",),
           "smollm2-135m-frozenlake": ("compare-study-frozenlake",)}

for preset, folders in STUDIES.items():
    norms, runs = [], 0
    for folder in folders:
        for m in sorted((RESULTS / folder).glob("*/metrics.jsonl")):
            runs += 1
            norms += [json.loads(x)["grad_norm"] for x in m.read_text().splitlines()
                      if x.strip() and "grad_norm" in json.loads(x)]
    g = np.array(norms)
    live = g[g > 0]
    print(f"{preset} ({', '.join(folders)}; {runs} runs): on-policy median {np.median(live):.1f}, range "
          f"{live.min():.1f}-{live.max():.1f}, above the clip {np.mean(live > 1.0):.1%} of {live.size} "
          f"(and {g.size - live.size} without signal)")

"""The withdrawn equal-compute readout of this comparison, recomputed with each second counted
once and every run assumed to have run on one machine (no run recorded its machine, so the
assumption is untested and the readout stays withdrawn in RESULTS.md):
    python results/compare-smollm2-math-5seeds/compute_once.py
"""
import json
from pathlib import Path

from freshper.trainer.compare_readouts import matched

HERE = Path(__file__).resolve().parent
ARMS = ["on-policy", "per", "freshper", "freshper-group", "freshper-stored"]
by = {a: [({"seed": s, "machine": "assumed-one"},
           [json.loads(x) for x in (HERE / f"{a}-s{s}" / "metrics.jsonl").read_text().splitlines()], {})
          for s in range(5)] for a in ARMS}
res = matched(by)
for a in ARMS[1:]:
    m, h, wins, n, _ = res[a]["compute"]
    print(f"{a}: {m:+.3f} ± {h:.3f} [{wins}/{n}]")

"""Print the mismatch per iteration of growth.sh's three runs (argument: their parent folder)."""
import json
import sys
from pathlib import Path

RUNS = ("float32", "bf16", "bf16-compute-logits")
root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/mismatch-growth")
rows = {r: [json.loads(line) for line in (root / r / "metrics.jsonl").open()] for r in RUNS}
print("mean |engine - trainer log-prob| per reply token (max in brackets), nats")
print("| iteration | " + " | ".join(RUNS) + " |")
print("|---|" + "---|" * len(RUNS))
for i in range(max(len(v) for v in rows.values())):
    cells = []
    for r in RUNS:
        m = rows[r][i] if i < len(rows[r]) else None
        cells.append(f"{m['engine_trainer_logp_meanabs']:.2e} ({m['engine_trainer_logp_maxdiff']:.1e})" if m else "")
    print(f"| {i} | " + " | ".join(cells) + " |")
for r in RUNS:
    v = [m["engine_trainer_logp_meanabs"] for m in rows[r]]
    half = len(v) // 2
    print(f"{r}: first {v[0]:.2e}, mean of first {half} {sum(v[:half]) / half:.2e}, "
          f"of last {len(v) - half} {sum(v[half:]) / (len(v) - half):.2e}, "
          f"validation {rows[r][0].get('eval_success')} before, {rows[r][-1].get('final_eval_success')} after")

"""Figures the game study's record (results/study-frozenlake/README.md, secondaries.md) gives
beside its registered readouts, written after the readout (not registered): the primary contrast's paired SD and the power it implies at 0.15, whether each
control run ended above its seed's iteration-0 validation, and the runs that ended at 0 (training
success in their last 3 iterations, valid-move share in their last one).

    python results/compare-study-frozenlake/after_readout.py   (needs scipy, in the dev extra)
"""
import json
import math
import statistics
from pathlib import Path

from scipy.stats import nct, t

HERE = Path(__file__).parent
ARMS = ("on-policy-matched", "uniform", "per", "freshper", "freshper-group")


def rows(arm, seed):
    return [json.loads(x) for x in (HERE / f"{arm}-s{seed}" / "metrics.jsonl").read_text().splitlines()]


def final(r):
    return next(x["final_eval_success"] for x in r if "final_eval_success" in x)


d = [final(rows("freshper-group", s)) - final(rows("on-policy-matched", s)) for s in range(10)]
sd = statistics.stdev(d)
c, nc = t.ppf(0.975, 9), 0.15 / (sd / math.sqrt(10))
print(f"freshper-group - control: paired SD {sd:.3f}, power at 0.15 {1 - nct.cdf(c, 9, nc) + nct.cdf(-c, 9, nc):.2f}")
ctl = [(rows("on-policy-matched", s)[0]["eval_success"], final(rows("on-policy-matched", s))) for s in range(10)]
up = [f for s0, f in ctl if f > s0]
print(f"control above its iteration-0 validation on {len(up)} seeds ({min(up):.3f}-{max(up):.3f}), "
      f"below on {10 - len(up)}")
zero = []
for a in ARMS:
    for s in range(10):
        r = rows(a, s)
        if final(r) == 0:
            it = [x for x in r if "success" in x]
            zero.append((a, s, max(x["success"] for x in it[-3:]), it[-1]["valid_action"]))
print(f"{len(zero)} runs ended at 0; training success 0 in the last 3 iterations: {sum(z[2] == 0 for z in zero)}; "
      f"last valid-move share >= 0.94: {sum(z[3] >= 0.94 for z in zero)}")
for a in ARMS:
    print(f"  {a} seed 9 training success by iteration: {[x['success'] for x in rows(a, 9) if 'success' in x]}")
r0 = rows("on-policy-matched", 9)[0]  # iteration 0: the same weights and episodes in every arm of seed 9
print(f"seed 9, iteration 0: success {r0['success']}, invalid-move penalty {r0['penalty']:.3f}, "
      f"groups with a signal {r0['groups_with_signal']}")

"""Pilot 8's rule (pilot8/plan.md, committed before its runs), applied from the runs' metrics
alone: the control's validation at iteration 0 and at the end and the valid share of its final
validation replies; FreshPER-stored's mean KL(mu || pi) per token over its replay updates and its
share of replayed tokens with a non-zero advantage; the drift rate r (compare's fit,
trainer/study/replay_stats.py) and freshper-auto's tau = 1 / (2r). Also each run's wall time and
peak memory.

Run: python results/pilot-corners/pilot8.py
"""
import json
from pathlib import Path

from freshper.trainer.study.replay_stats import replay_summary

folder = Path(__file__).parent / "pilot8"


def rows(run: str) -> list[dict]:
    return [json.loads(line) for line in (folder / run / "metrics.jsonl").read_text().splitlines()]


control, stored = rows("on-policy-matched-s101"), rows("freshper-stored-s101")
start, final = control[0]["eval_success"], control[-1]["final_eval_success"]
valid = control[-1]["final_eval_valid_action"]
kl = [r["replay_kl"] for r in stored if r.get("replay_kl") is not None]
print("control: validation", [(r["iteration"], r["eval_success"]) for r in control if "eval_success" in r],
      f"final {final:.3f}")
print("freshper-stored: validation", [(r["iteration"], r["eval_success"]) for r in stored if "eval_success" in r],
      f"final {stored[-1]['final_eval_success']:.3f}")
rise = final - start
print(f"rule 1, the control learns without breaking: rise {rise:+.3f} (>= 0.15: {rise >= 0.15}), final {final:.3f} "
      f"(<= 0.9: {final <= 0.9}), valid share of its final validation replies {valid:.3f} (>= 0.8: {valid >= 0.8})")
mean_kl = sum(kl) / len(kl)
print(f"rule 2, replayed data goes stale: mean KL(mu||pi) {mean_kl:.4f} nats/token over {len(kl)} replay updates "
      f"(>= 0.05: {mean_kl >= 0.05}); per update {[round(k, 3) for k in kl]}")
summary = replay_summary(stored)
print(f"replayed tokens with a non-zero advantage (mean over updates): {summary['adv_nonzero']:.3f} "
      "(>= 0.5 declares stored)")
r_fit = summary["drift_rate"]
print(f"drift rate r {r_fit:.5f} (compare's fit): tau = 1 / (2r) = {summary['drift_time']:.1f} iterations")
for run in ("on-policy-matched-s101", "freshper-stored-s101"):
    secs = (folder / run / "DONE").read_text().split()[0]
    peak = max(int(line.split()[3]) for line in (folder / "hwm.log").read_text().splitlines() if run in line)
    print(f"{run}: {secs} s, peak resident memory {peak / 1e6:.2f} GB")

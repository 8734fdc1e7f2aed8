"""Figures the record states that are computed from committed run data: recomputed here from the
data, so a figure taken from rounded values, or a readout label that says what it does not
compute, fails."""
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _final(folder: Path) -> float:
    return json.loads((folder / "metrics.jsonl").read_text().splitlines()[-1])["final_eval_success"]


def test_the_staleness_pilots_per_seed_differences_are_of_the_unrounded_values():
    runs = ROOT / "results" / "compare-pilot-staleness-runs"
    diffs = [_final(runs / f"stale-none-s{s}") - _final(runs / f"synchronous-s{s}") for s in (900, 901, 902)]
    text = ", ".join(f"{d:+.3f}".replace("-", "−") for d in diffs)
    assert f"lower on all three ({text})" in (ROOT / "results" / "PILOTS.md").read_text(encoding="utf-8")


def test_the_staleness_readout_says_which_batches_its_mean_ages_are_of():
    """The gate drops batches: the mean age over all the batches that reached their update is not
    the age of those it trained on (3.07 against 1.66), and the readout names both."""
    folder = ROOT / "results" / "study-staleness"
    out = subprocess.run([sys.executable, str(folder / "readout.py")], capture_output=True, text=True, timeout=300,
                         check=True).stdout
    assert out == (folder / "readout.txt").read_text(encoding="utf-8"), "readout.txt is what the readout prints"
    gate = next(line for line in out.splitlines() if line.startswith("stale-gate:"))
    rows = [json.loads(line) for s in range(1100, 1116)
            for line in (ROOT / "results" / "compare-study-staleness" / f"stale-gate-s{s}" / "metrics.jsonl")
            .read_text().splitlines()]
    trained = statistics.mean(r["batch_age"] for r in rows if "loss" in r)
    assert f"{trained:.2f}" == "1.66"
    assert "mean age of the batches that reached their update 3.07 (trained on: 1.66)" in gate

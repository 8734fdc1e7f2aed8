"""A registered readout runs on stand-in runs before its study's own are read, so that a bug in it
shows while fixing it still changes nothing that was seen. The stand-ins for the study of replay
over stale data are the stale-replay probe's runs (the same preset, lags and metrics, published
in results/probe-stale-replay/), copied under the study's names into a temporary folder; the
study's own folder is never opened here."""
import importlib.util
import json
import re
import statistics
from pathlib import Path

import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "results" / "compare-probe-stale-replay"


def _stale_replay_readout():
    spec = importlib.util.spec_from_file_location("stale_replay_readout",
                                                  ROOT / "results" / "study-stale-replay" / "readout.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """All 96 registered runs: each seed takes probe seed 1300 or 1301 in turn, PER's runs for per
    and (without their replay metrics) for the two on-policy arms, FreshPER's for freshper."""
    mod = _stale_replay_readout()
    probe = {(arm, k): _rows(PROBE / f"{arm}-s{1300 + k}") for arm in ("per", "freshper") for k in (0, 1)}
    for i, seed in enumerate(mod.SEEDS):
        for arm in mod.ARMS:
            rows = probe[("freshper" if arm == "freshper" else "per", i % 2)]
            if arm.startswith("on-policy"):
                rows = [{k: v for k, v in r.items() if not k.startswith("replay_") and k != "is_ess"} for r in rows]
            run = tmp_path / f"{arm}-s{seed}"
            run.mkdir()
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (run / "DONE").touch()
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    return mod, probe, tmp_path


def test_before_every_run_is_in_it_prints_the_count_and_no_figure(stand_ins, capsys):
    mod, _, runs = stand_ins
    (runs / "per-s1423" / "DONE").unlink()
    with pytest.raises(SystemExit) as stop:
        mod.main()
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("runs done: 95 of 96\n") and "missing per-s1423" in out
    assert not re.search(r"\d\.\d", out), "a figure of a run was printed before all were in"


def test_the_complete_readout_gives_the_registered_contrasts_and_their_readings(stand_ins, capsys):
    mod, probe, _ = stand_ins
    mod.main()
    out = capsys.readouterr().out
    assert out.startswith("runs done: 96 of 96\n")
    final = {(arm, k): probe[(arm, k)][-1]["final_eval_success"] for arm in ("per", "freshper") for k in (0, 1)}
    d = [final[("freshper", i % 2)] - final[("per", i % 2)] for i in range(24)]
    half = stats.t.ppf(0.975, 23) * statistics.stdev(d) / 24 ** 0.5
    primary = next(line for line in out.splitlines() if line.startswith("primary: freshper - per:"))
    m = statistics.mean(d)
    assert f"{m:+.3f} (SD {statistics.stdev(d):.3f})" in primary
    assert f"95% [{m - half:+.3f}, {m + half:+.3f}]" in primary
    assert f"freshper higher on {sum(x > 0 for x in d)}/24" in primary
    # each contrast's reading is the registered rule applied to the intervals it prints
    for line in (x for x in out.splitlines() if "reading: " in x):
        lo90, hi90, lo95, hi95 = (float(v) for v in
                                  re.search(r"90% \[(\S+), (\S+)\], 95% \[(\S+), (\S+)\]", line).groups())
        a, b = re.match(r"(?:primary: )?(\S+) - (\S+):", line).groups()
        want = (f"{a} better" if lo95 > 0 else f"{b} better" if hi95 < 0
                else "equivalent within +-0.1" if -0.1 < lo90 and hi90 < 0.1 else "not shown")
        assert line.split("reading: ")[1].startswith(want), line
    # the replayed generation ages are those of the replay arms' stand-ins, none for on-policy
    blocks = out.split("\n\n")[1:]
    by_arm = {b.split(":")[0]: b for b in blocks}
    assert set(by_arm) == set(mod.ARMS)
    assert "replayed:" not in by_arm["on-policy"] and "replayed:" not in by_arm["on-policy-matched"]
    n = sum(c for k in (0, 1) for r in probe[("per", k)] for c, _, _ in r.get("replay_by_gen_age", {}).values())
    assert f"replayed: {12 * n} trajectories" in by_arm["per"]


@pytest.mark.parametrize("lo90, hi90, lo95, hi95, want", [
    (0.02, 0.20, 0.01, 0.21, "a better"), (-0.20, -0.02, -0.21, -0.01, "b better"),
    (-0.09, 0.09, -0.12, 0.12, "equivalent"), (-0.05, 0.11, -0.07, 0.13, "not shown"),
    (-0.11, 0.05, -0.13, 0.07, "not shown")])
def test_the_reading_rule_at_its_edges(lo90, hi90, lo95, hi95, want):
    mod = _stale_replay_readout()
    assert mod.reading({0.90: (lo90, hi90), 0.95: (lo95, hi95)}, "a", "b").startswith(want)


def test_a_collapse_is_dated_from_the_first_iteration_it_stayed_at_zero():
    mod = _stale_replay_readout()
    run = [{"iteration": i, "success": s} for i, s in enumerate([0.5, 0.0, 0.25, 0.0, 0.0, 0.0])]
    assert mod.collapsed_at(run) == 3
    assert mod.collapsed_at(run[:5]) is None, "not 0 over the last 3 iterations: not collapsed"

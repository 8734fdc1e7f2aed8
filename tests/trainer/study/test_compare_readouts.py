"""The matched readouts of `freshper compare` on synthetic runs whose answers are known by hand."""
import math

import pytest

from freshper.trainer.study.readouts import eval_track, first_reach, matched, matched_table, value_at


def run(its, updates_per_it, secs_per_it, evals, final, steps_per_it=32):
    """Rows of a run: `evals` {iteration: eval_success} (run before that iteration), `final` after."""
    rows = []
    for i in range(its):
        r = {"iteration": i, "env_steps": steps_per_it * (i + 1), "updates": updates_per_it * (i + 1),
             "time_rollout": secs_per_it / 2, "time_onpolicy_update": secs_per_it / 2, "time_eval": 100.0}
        if i in evals:
            r.update(eval_success=evals[i], eval_env_steps=steps_per_it * i)
        rows.append(r)
    rows[-1].update(final_eval_success=final, final_eval_env_steps=steps_per_it * its)
    return rows


def by_label(**arms):
    """Every run on one machine, as compare's jobs record it."""
    return {label: [({"seed": s, "machine": "one"}, rows, {}) for s, rows in enumerate(seeds)]
            for label, seeds in arms.items()}


def test_tracks_sit_where_validation_ran():
    rows = run(10, 2, 3.0, {0: 0.1, 5: 0.3}, 0.5)
    assert eval_track(rows, "updates") == [(0.0, 0.1), (10.0, 0.3), (20.0, 0.5)]
    assert eval_track(rows, "compute") == [(0.0, 0.1), (15.0, 0.3), (30.0, 0.5)]  # time_eval is not training
    assert eval_track(rows, "env_steps") == [(0.0, 0.1), (160.0, 0.3), (320.0, 0.5)]
    assert eval_track([{k: v for k, v in r.items() if k != "updates"} for r in rows], "updates") == []
    assert value_at([(0.0, 0.1), (10.0, 0.3)], 5.0) == pytest.approx(0.2)
    assert math.isnan(value_at([(0.0, 0.1), (10.0, 0.3)], 10.5))  # never extrapolated
    assert first_reach([(0.0, 0.1), (10.0, 0.3), (20.0, 0.5)], 0.4) == pytest.approx(15.0)
    assert first_reach([(0.0, 0.6), (10.0, 0.3)], 0.4) == 0.0
    assert math.isnan(first_reach([(0.0, 0.1), (10.0, 0.3)], 0.4))


def test_matched_readouts_by_hand():
    """Control: 1 update and 1 s an iteration; replay: 2 updates and 2 s. At equal updates (the
    control's 10) the replay arm is read at its iteration 5, where its curve is 0.2 + ...; the
    numbers below are worked out by hand from the linear curves."""
    control = [run(10, 1, 1.0, {0: 0.1, 5: 0.3}, 0.5), run(10, 1, 1.0, {0: 0.2, 5: 0.2}, 0.4)]
    replay = [run(10, 2, 2.0, {0: 0.1, 5: 0.5}, 0.9), run(10, 2, 2.0, {0: 0.2, 5: 0.3}, 0.3)]
    res = matched(by_label(control=control, replay=replay))
    # seed 0: replay's updates track (0, .1) (10, .5) (20, .9): at 10 updates 0.5, control's final 0.5
    # seed 1: (0, .2) (10, .3) (20, .3): at 10 updates 0.3, control's final 0.4
    m, h, wins, n, d = res["replay"]["updates"]
    assert d == pytest.approx([0.0, -0.1]) and (wins, n) == (0, 2) and m == pytest.approx(-0.05)
    # compute: control spends 10 s; replay at 10 s is at its iteration 5: the same reads here
    assert res["replay"]["compute"][4] == pytest.approx([0.0, -0.1])
    # env steps to reach the control's final (0.5, 0.4): replay seed 0 (0, .1) (160, .5): 160;
    # seed 1 never reaches 0.4; the control reaches its own final at its end (320)
    med, ok, n, steps = res["replay"]["reach"]
    assert steps[0] == pytest.approx(160.0) and math.isnan(steps[1]) and (ok, n) == (1, 2)
    assert res["control"]["reach"][3] == pytest.approx([320.0, 320.0])
    table, js = matched_table(by_label(control=control, replay=replay), 320)
    assert "| replay | -0.050 ± " in table and "[0/2]" in table and "| 1/2 |" in table
    assert js["replay"]["at_equal_updates"]["per_seed"] == pytest.approx([0.0, -0.1])


def test_a_wrong_reading_point_fails():
    """Reading the replay arm at its own final updates (no matching) or off by one validation
    interval gives other numbers than the matched readout: the test above would fail on either."""
    replay = run(10, 2, 2.0, {0: 0.1, 5: 0.5}, 0.9)
    track = eval_track(replay, "updates")
    assert value_at(track, 10.0) == pytest.approx(0.5)
    assert value_at(track, 20.0) != pytest.approx(0.5) and value_at(track, 12.0) != pytest.approx(0.5)


def test_seeds_whose_arms_ran_on_different_machines_leave_the_compute_readout_only():
    """Seconds from a machine twice as fast would make an arm look twice as cheap: such a seed
    (here seed 1) is left out at equal compute and kept at equal updates. Without the check the
    compute readout would hold both seeds' differences, as the updates readout does."""
    control = [run(10, 1, 1.0, {0: 0.1, 5: 0.3}, 0.5), run(10, 1, 1.0, {0: 0.2, 5: 0.2}, 0.4)]
    replay = [run(10, 2, 2.0, {0: 0.1, 5: 0.5}, 0.9), run(10, 2, 1.0, {0: 0.2, 5: 0.3}, 0.3)]
    arms = by_label(control=control, replay=replay)
    for label, items in arms.items():
        for j, _, _ in items:
            j["machine"] = "fast" if (label, j["seed"]) == ("replay", 1) else "slow"
    res = matched(arms)
    assert res["replay"]["compute"][4] == pytest.approx([0.0])  # seed 0 alone
    assert res["replay"]["updates"][4] == pytest.approx([0.0, -0.1])  # both seeds
    assert res["control"]["compute_mixed_machines"] == [1]
    table, _ = matched_table(arms, 320)
    assert "1 seed(s) are left out because their arms ran on different machines" in table
    unknown = by_label(control=control, replay=replay)  # not recorded (older runs): left out, and said
    for items in unknown.values():
        for j, _, _ in items:
            del j["machine"]
    assert matched(unknown)["replay"]["compute"] is None
    assert matched(unknown)["control"]["compute_unrecorded_machines"] == [0, 1]
    table, _ = matched_table(unknown, 320)
    assert "2 seed(s) are left out because no machine is recorded" in table


def test_a_studys_machines_md_gives_the_machine_of_runs_that_record_none(tmp_path):
    """The study's runs predate source.json's machine: its machines.md table names each run's type.
    Seed 0's arms ran on two types there, so seed 0 leaves the compute readout; seed 1 stays."""
    from freshper.trainer.study.readouts import run_machine, study_machines

    (tmp_path / "machines.md").write_text(
        "# machines\n\n| date | type | machine (lscpu) | runs |\n|---|---|---|---|\n"
        "| d1 | SLOW | a | control-s0 (beside a test) |\n"
        "| d2 | FAST | b | replay-s0, control-s1 and replay-s1 (stopped and resumed) |\n")
    assert study_machines(tmp_path) == {"control-s0": "SLOW", "replay-s0": "FAST", "control-s1": "FAST",
                                        "replay-s1": "FAST"}
    assert run_machine({"run": tmp_path / "replay-s1"}) == "FAST"
    assert run_machine({"run": tmp_path / "replay-s7"}) is None
    control = [run(10, 1, 1.0, {0: 0.1, 5: 0.3}, 0.5), run(10, 1, 1.0, {0: 0.2, 5: 0.2}, 0.4)]
    replay = [run(10, 2, 2.0, {0: 0.1, 5: 0.5}, 0.9), run(10, 2, 2.0, {0: 0.2, 5: 0.3}, 0.3)]
    arms = by_label(control=control, replay=replay)
    for label, items in arms.items():
        for j, _, _ in items:
            del j["machine"]
            j["run"] = tmp_path / f"{label}-s{j['seed']}"
    res = matched(arms)
    assert res["control"]["compute_mixed_machines"] == [0]
    assert res["replay"]["compute"][4] == pytest.approx([-0.1])  # seed 1 alone
    (tmp_path / "machines.md").write_text("| date | machine | runs |\n|---|---|---|\n| d | a | control-s0 |\n")
    with pytest.raises(ValueError, match="'type'"):
        study_machines(tmp_path)


def test_compute_counts_a_nested_phase_once():
    """The rollout is timed around generation and the env's steps: the sum counts the rollout (its
    parts and the glue between them) once. Summing every time_* key would give 24.5 s here."""
    from freshper.trainer.train.metrics import compute_seconds

    row = {"time_rollout": 10.0, "time_generate": 9.0, "time_env_step": 0.5, "time_onpolicy_update": 5.0,
           "time_eval": 100.0, "time_checkpoint": 3.0, "loss": 1.0}
    assert compute_seconds(row) == pytest.approx(15.0)
    assert compute_seconds({k: v for k, v in row.items() if k != "time_rollout"}) == pytest.approx(14.5)
    assert eval_track([{**row, "eval_success": 0.1}, {**row, "final_eval_success": 0.2}], "compute") == \
        [(0.0, 0.1), (30.0, 0.2)]


def test_phases_refuse_a_nesting_compute_would_count_twice():
    from freshper.profiling.nvtx import Phases

    P = Phases()
    with P("rollout"):
        with P("generate"):
            pass
        with P("env_step"):
            pass
    assert set(P.take()) == {"rollout", "generate", "env_step"}
    with pytest.raises(RuntimeError, match="'sample' opened inside 'onpolicy_update'"):
        with P("onpolicy_update"):
            with P("sample"):
                pass
    with P("sample"):  # the stack is clean after the refusal
        pass


def test_the_machine_is_read_from_the_run_folder(tmp_path):
    import json

    from freshper.trainer.study.readouts import run_machine

    (tmp_path / "source.json").write_text(json.dumps({"commit": "x", "machine": {"cpu": "A", "simd": "avx2"}}))
    assert run_machine({"run": tmp_path}) == '{"cpu": "A", "simd": "avx2"}'
    (tmp_path / "source.json").write_text(json.dumps({"commit": "x"}))
    assert run_machine({"run": tmp_path}) is None
    assert run_machine({"seed": 0}) is None


def test_the_t_quantile_is_exact_at_every_df():
    """Against scipy's t quantile: a table with 1.96 past df 30 was 4% narrow at df 31, and the
    table's gaps (df 11 read as 10) were wide; either fails this."""
    scipy = pytest.importorskip("scipy.stats")
    from freshper.trainer.train.intervals import t975

    for df in list(range(1, 61)) + [100, 1000]:
        assert t975(df) == pytest.approx(scipy.t.ppf(0.975, df), rel=1e-9), df
    assert abs(t975(31) - 1.96) > 0.07

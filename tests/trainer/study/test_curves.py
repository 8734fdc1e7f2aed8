"""compare's curves.png (trainer/study/curves.py) draws a panel only where some arm logged its data,
and a lagged comparison gets its own: trained batch ages per arm, the gate's drops, the decay's
weights. Built from synthetic metrics rows and from the committed staleness study's runs."""
import json
import math
from pathlib import Path

import pytest

from freshper.trainer.study.curves import LABELS, figure, panels

TAU = 17.0
STUDY = Path(__file__).resolve().parents[3] / "results" / "compare-study-staleness"


def rows_of(ages, gate: int = 0, tau: float = 0.0, replay: bool = False) -> list[dict]:
    """A run's metrics rows, 4 episodes an iteration: batches of the given ages, dropped when
    older than `gate` (0: no gate), weighted exp(-age / tau) (0: unweighted), with replay figures."""
    rows, dropped = [], 0
    for it, age in enumerate(ages):
        drop = bool(gate) and age > gate
        dropped += 4 * drop
        r = {"iteration": it, "env_steps": 4 * (it + 1), "success": (it % 3) / 4, "reward": 0.0, "batch_age": age,
             "batch_weight": math.exp(-age / tau) if tau and not drop else 1.0, "episodes_generated": 4,
             "episodes_dropped": 4 * drop, "episodes_dropped_total": dropped}
        if it % 4 == 0:
            r.update(eval_success=0.25, eval_env_steps=4 * it)
        if replay:
            r.update(replay_kl_by_age={"0": [0.01, 3], "1": [0.02, 2]}, is_ess=0.9)
        rows.append(r)
    return rows


def comparison(**arms) -> dict:
    """{arm: [(job, rows, summary)] for two seeds}, as report() hands them to the plot."""
    return {arm: [({"seed": s, "tau": None}, rows, {}) for s in range(2)] for arm, rows in arms.items()}


LAGS = [0, 1, 3, 2, 0, 3, 1, 0, 2, 3, 1, 0]


def drawn(by_label, budget: int = 48) -> set[str]:
    """The panels of the figure, each checked to hold data."""
    fig = figure(by_label, {}, budget, False)
    assert [ax.get_ylabel() for ax in fig.axes if not ax.has_data()] == [], "an empty panel"
    return {key for key, (_, y) in LABELS.items() if y in {ax.get_ylabel() for ax in fig.axes}}


def test_a_lagged_comparison_without_replay_draws_its_own_panels_and_no_empty_one():
    by_label = comparison(synchronous=rows_of([0] * 12), gate=rows_of(LAGS, gate=2),
                          decay=rows_of(LAGS, tau=TAU))
    assert drawn(by_label) == {"success", "eval_success", "batch_ages", "dropped", "weights"}
    lines = {key: {line["label"]: line for line in v} for key, v in panels(by_label, {}, 48, False).items()}
    assert set(lines["batch_ages"]) == {"synchronous", "gate", "decay"}
    assert lines["batch_ages"]["gate"]["x"] == [0, 1, 2], "the trained batches: the gate's drops left out"
    assert lines["batch_ages"]["decay"]["y"] == pytest.approx([4 / 12, 3 / 12, 2 / 12, 3 / 12])
    assert set(lines["dropped"]) == {"gate"} and lines["dropped"]["gate"]["y"][-1] == 4 * 3
    assert set(lines["weights"]) == {"decay"}
    assert lines["weights"]["decay"]["y"] == pytest.approx([math.exp(-a / TAU) for a in range(4)])


def test_a_synchronous_comparison_without_replay_draws_success_only():
    assert drawn(comparison(**{"on-policy": rows_of([0] * 12), "on-policy-matched": rows_of([0] * 12)})) == {
        "success", "eval_success"}


def test_a_replay_comparison_draws_its_replay_panels():
    assert drawn(comparison(**{"on-policy": rows_of([0] * 12), "freshper": rows_of([0] * 12, replay=True)})) == {
        "success", "eval_success", "kl", "ages", "ess"}


def test_the_staleness_study_draws_no_empty_panel():
    by_label = {}
    for metrics in sorted(STUDY.glob("*-s*/metrics.jsonl")):
        arm = metrics.parent.name.rsplit("-s", 1)[0]
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        by_label.setdefault(arm, []).append(({"seed": int(metrics.parent.name.rsplit("-s", 1)[1])}, rows, {}))
    assert set(by_label) == {"synchronous", "stale-gate", "stale-is", "stale-decay"}
    assert drawn(by_label, budget=800) == {"success", "eval_success", "batch_ages", "dropped", "weights"}


def test_a_tau_sweep_draws_the_aucs_against_tau():
    by_label = {f"freshper-tau{t}": [({"seed": 0, "tau": t}, rows_of([0] * 12, replay=True), {})] for t in (100, 1000)}
    summary = {label: {"auc": (0.5, 0.1), "auc_eval_success": (0.4, math.nan)} for label in by_label}
    fig = figure(by_label, summary, 48, True)
    assert all(ax.has_data() for ax in fig.axes)
    assert LABELS["tau"][1] in {ax.get_ylabel() for ax in fig.axes}

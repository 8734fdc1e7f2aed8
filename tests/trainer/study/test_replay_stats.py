"""The replay diagnostics behind the KL-vs-age reading: binning, the drift fit, the summary."""
import math

import pytest

from freshper.trainer.study.replay_stats import age_shares, bin_age, drift_fit, kl_by_age, replay_summary


def _binned(kl_of_age, counts=(50, 40, 30, 20, 10, 5)):
    """{lowest age: (KL at the bin's representative age, count)} for bins 0, 1, 2, 4, 8, 16."""
    lows = [0, 1, 2, 4, 8, 16]
    return {a: (kl_of_age(bin_age(a)), n) for a, n in zip(lows, counts)}


def test_bin_ages_are_bin_midpoints():
    assert [bin_age(a) for a in (0, 1, 2, 4, 8)] == [0, 1, 2.5, 5.5, 11.5]


@pytest.mark.parametrize("r", [0.003, 0.05])
def test_linear_drift_gives_its_rate_and_exponent_one(r):
    rate, p = drift_fit(_binned(lambda a: r * a))
    assert rate == pytest.approx(r, rel=1e-9) and p == pytest.approx(1.0, abs=1e-9)


def test_quadratic_drift_gives_exponent_two():
    rate, p = drift_fit(_binned(lambda a: 0.01 * a * a))
    assert p == pytest.approx(2.0, abs=1e-9) and rate > 0.01


def test_exponent_needs_two_positive_bins():
    rate, p = drift_fit({0: (0.01, 5), 1: (0.02, 5)})
    assert rate == pytest.approx(0.02) and math.isnan(p)


def test_pooling_weights_bins_by_count():
    rows = [{"replay_kl_by_age": {"0": [0.0, 3], "4": [0.4, 1]}},
            {"replay_kl_by_age": {"4": [0.0, 3]}}, {"success": 1.0}]
    kl = kl_by_age(rows)
    assert kl == {0: (0.0, 3), 4: (pytest.approx(0.1), 4)}
    assert age_shares(kl) == {0: 3 / 7, 4: 4 / 7}


def test_summary_of_a_run():
    row = {"replay_kl_by_age": {"1": [0.01, 10], "2": [0.025, 10]}, "replay_age_mean": 1.5, "replay_kl": 0.02,
           "is_ess": 0.9, "replay_clip_frac": 0.01}
    s = replay_summary([row, {**row, "is_ess": 0.7}, {"success": 0.0}])
    assert s["ess"] == pytest.approx(0.8) and s["age_mean"] == 1.5 and s["drift_rate"] == pytest.approx(0.01)
    assert s["drift_time"] == pytest.approx(50) and s["drift_exponent"] == pytest.approx(1.0)
    assert replay_summary([{"success": 0.0}]) == {}


def test_signal_by_window():
    from freshper.trainer.study.replay_stats import signal_by_window

    rows = [{"iteration": i, "replay_singleton_frac": 0.1 * (i // 2), "replay_adv_nonzero_frac": 1.0 - 0.1 * (i // 2)}
            for i in range(5)]
    assert signal_by_window(rows, 2) == [(0, 0.0, 1.0), (2, pytest.approx(0.1), pytest.approx(0.9)),
                                         (4, pytest.approx(0.2), pytest.approx(0.8))]
    assert signal_by_window([{"iteration": 0}]) == []

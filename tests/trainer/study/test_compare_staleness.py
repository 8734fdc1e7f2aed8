"""`freshper compare`'s staleness arms (lockstep lags drawn from --lag-probs, trained as
algo.staleness says) and the table that reads their runs."""
import json

import pytest

from freshper.trainer.cli import main
from freshper.trainer.study.compare import parse, plan
from freshper.trainer.study.staleness import staleness_row, staleness_table

from .test_compare import TINY


def test_the_stale_arms_draw_lags_and_report_their_staleness(tmp_path, capsys):
    argv = ["compare", "--env", "frozenlake", "--arms", "synchronous,stale-gate,stale-decay", "--seeds", "1",
            "--budget", "60", "--lag-probs", "0.4,0.2,0.4", "--max-age", "1", "--run-dir", str(tmp_path),
            "--name", "t", "--algo.mode", "on-policy", *TINY]
    assert main(argv) == 0
    out = tmp_path / "compare-t"
    table = (out / "table.md").read_text()
    part = table.split("Staleness of the on-policy batches")[1]
    assert "| stale-gate | 1 |" in part and "| stale-decay | 1 |" in part
    assert "| synchronous |" not in part, "a synchronous run has nothing stale to report"
    rows = [json.loads(x) for x in (out / "stale-gate-s0" / "metrics.jsonl").read_text().splitlines()]
    sync = [json.loads(x) for x in (out / "synchronous-s0" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["batch_age"] == 0 for r in sync)
    got = staleness_row(rows)
    dropped = sum(r["episodes_dropped"] for r in rows)
    assert got["dropped"] == pytest.approx(dropped / sum(r["episodes_generated"] for r in rows))
    assert dropped == 4 * sum(r["batch_age"] > 1 for r in rows), "each batch older than --max-age dropped whole"
    capsys.readouterr()


@pytest.mark.parametrize("argv, msg", [(["--arms", "stale-is"], "give --lag-probs"),
                                       (["--arms", "stale-is", "--lag-probs", "0.5,0.6"], "--lag-probs"),
                                       (["--arms", "stale-is", "--lag-probs", "0.5,0.5", "--rollout.lag_probs", "1"],
                                        "use --lag-probs")])
def test_the_stale_arms_need_their_distribution(tmp_path, capsys, argv, msg):
    with pytest.raises(SystemExit):
        main(["compare", "--env", "frozenlake", "--run-dir", str(tmp_path), *argv])
    assert msg in capsys.readouterr().err


def test_the_stale_arms_differ_only_in_their_staleness(tmp_path):
    jobs = plan(tmp_path, "frozenlake", ["synchronous", "stale-none", "stale-is", "stale-decay"], 1, 100, {}, None,
                lag_probs="0.5,0.5")
    flags = [{a.split("=")[0] for a in j["cmd"] if a.startswith("--")} for j in jobs]
    assert "--rollout.lag_probs" not in flags[0]
    assert all("--rollout.lag_probs" in f and "--algo.staleness" in f for f in flags[1:])
    assert all("--rollout.lag_probs=0.5,0.5" in j["cmd"] for j in jobs[1:])


def test_the_stale_arms_replay_a_run_folders_staleness(tmp_path, capsys):
    """--lag-probs RUN_DIR: every stale run gets the folder's shares of batch ages as probabilities
    (trainer/config/lag_history.py); a folder without batch ages is refused naming --lag-probs."""
    run = tmp_path / "async-run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"batch_age": a}) + "\n" for a in (0, 2, 2, 1)))
    args = parse(["--arms", "synchronous,stale-is", "--lag-probs", str(run), "--algo.mode", "on-policy"])[1]
    assert args.lag_probs == "0.25,0.25,0.5"
    jobs = plan(tmp_path, "frozenlake", ["synchronous", "stale-is"], 1, 100, {}, None, lag_probs=args.lag_probs)
    assert "--rollout.lag_probs=0.25,0.25,0.5" in jobs[1]["cmd"]
    (run / "metrics.jsonl").write_text('{"iteration": 0}\n')
    with pytest.raises(SystemExit):
        parse(["--arms", "stale-is", "--lag-probs", str(run)])
    assert "--lag-probs" in capsys.readouterr().err


def test_the_table_reports_the_ess_learning_rate_factor_of_the_updates_taken():
    """The ESS arm's column is the mean of batch_lr_scale over the batches trained, 1 where a row
    logs none (the loop logs it for stale batches only); a batch the gate dropped has no step and
    does not count. Every line of the table has as many cells as its header."""
    ess = [{"batch_age": 0}, {"batch_age": 3, "batch_lr_scale": 0.6},
           {"batch_age": 5, "batch_lr_scale": 0.2, "episodes_dropped": 4}]
    decay = [{"batch_age": 0, "batch_weight": 1.0}, {"batch_age": 2, "batch_weight": 0.5}]
    assert staleness_row(ess)["lr_scale"] == pytest.approx(0.8)
    assert staleness_row(decay)["lr_scale"] == 1.0 and staleness_row(decay)["weight"] == 0.75
    table = staleness_table({"stale-ess": [(None, ess, None)], "stale-decay": [(None, decay, None)]})
    lines = [[c.strip() for c in x.strip("|").split("|")] for x in table.splitlines() if x.startswith("|")]
    cols, cell = lines[0], {x[0]: x for x in lines}
    assert all(len(x) == len(cols) for x in lines)
    i = cols.index("ESS lr factor")
    assert cell["stale-ess"][i] == "0.800" and cell["stale-decay"][i] == "1.000"
    assert cell["stale-decay"][cols.index("decay weight")] == "0.750"

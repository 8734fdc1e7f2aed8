"""`freshper compare` end to end with tiny runs: table, plot, command, skip and resume."""
import json
import math

import pytest

from freshper.trainer.cli import main
from freshper.trainer.study.report import mean_ci, summarize

TINY = ["--model.tiny_hidden", "64", "--model.tiny_layers", "1", "--model.tiny_vocab", "512", "--rollout.episodes",
        "4", "--rollout.group_size", "2", "--env.max_turns", "3", "--algo.replay_batch", "4", "--train.sft_steps", "2",
        "--rollout.max_len", "640", "--algo.capacity", "64", "--eval.every", "1", "--eval.episodes", "2"]


def test_compare_runs_reports_and_resumes(tmp_path, capsys):
    argv = ["compare", "--env", "frozenlake", "--arms", "on-policy,freshper", "--seeds", "2", "--budget", "20",
            "--run-dir", str(tmp_path), "--name", "t", *TINY]
    assert main(argv) == 0
    out = tmp_path / "compare-t"
    table = (out / "table.md").read_text()
    assert "| on-policy | 2 |" in table and "| freshper | 2 |" in table and "final eval success" in table
    # replay diagnostics for the replay arm only
    diagnostics = table.split("Replay diagnostics")[1].split("Paired by seed")[0]
    assert "| freshper | " in diagnostics and "drift rate" in table
    assert "| on-policy |" not in diagnostics
    assert "Matched readouts" in table and "| on-policy | (control) |" in table
    assert (out / "curves.png").stat().st_size > 0
    assert (out / "command.txt").read_text().startswith("freshper compare --env frozenlake")
    res = json.loads((out / "results.json").read_text())
    assert set(res) == {"on-policy", "freshper"} and len(res["freshper"]["per_seed"]) == 2
    assert "replay" not in res["on-policy"] and len(res["freshper"]["replay"]["per_seed"]) == 2
    for s in res["freshper"]["per_seed"]:
        assert s["env_steps"] >= 20 and 0 <= s["final_eval_success"] <= 1
    rows = [json.loads(x) for x in (out / "freshper-s0" / "metrics.jsonl").read_text().splitlines()]
    assert "replay_kl_by_age" in rows[-1] and rows[-1]["lr"] > 0
    # the same environments for every arm: seed 0 of both arms starts from identical states
    a = (out / "on-policy-s0" / "metrics.jsonl").read_text().splitlines()[0]
    b = (out / "freshper-s0" / "metrics.jsonl").read_text().splitlines()[0]
    assert json.loads(a)["env_steps"] > 0 and json.loads(b)["env_steps"] > 0
    capsys.readouterr()
    assert main(argv) == 0
    assert "4 done, 0 to run" in capsys.readouterr().out
    (out / "freshper-s1" / "DONE").unlink()
    assert main(argv) == 0
    assert "3 done, 1 to run" in capsys.readouterr().out
    (out / "table.md").unlink()
    assert main([*argv, "--report-only"]) == 0 and (out / "table.md").exists()
    assert "0 to run" in capsys.readouterr().out


def test_compare_rejects_bad_arguments(tmp_path, capsys):
    for argv, msg in [(["--arms", "on-policy,magic"], "unknown arms"), (["--env", "chess"], "--preset must be"),
                      (["--arms", "on-policy", "--tau-sweep", "100"], "freshper arm"),
                      (["--algo.bogus", "1"], "unknown config key 'algo.bogus'")]:
        with pytest.raises(SystemExit):
            main(["compare", "--run-dir", str(tmp_path), *argv])
        assert msg in capsys.readouterr().err


def test_summary_statistics():
    rows = [{"env_steps": 10 * (i + 1), "success": 1.0 if i >= 5 else 0.0, "reward": 0.0} for i in range(10)]
    s = summarize(rows, 100)
    assert s["final_success"] == 1.0 and 0.4 < s["auc"] < 0.6 and s["final_eval_success"] != s["final_eval_success"]
    rows[4]["eval_success"], rows[9]["eval_success"], rows[9]["eval_score"], rows[4]["eval_score"] = 0.0, 0.5, 1, 0
    s = summarize(rows, 100)
    assert s["final_eval_success"] == 0.5 and 0.0 < s["auc_eval_success"] < 0.5
    assert mean_ci([1.0, math.inf])[0] == math.inf and math.isnan(mean_ci([1.0, math.inf])[1])
    m, h = mean_ci([0.2, 0.4, 0.6])
    assert m == pytest.approx(0.4) and h == pytest.approx(4.302653 * 0.2 / 3 ** 0.5)  # t(0.975, df 2) = 4.302653


def test_runs_go_seed_by_seed(tmp_path):
    """Every arm of a seed runs before the next seed: a comparison cut short holds whole seeds."""
    from freshper.trainer.study.compare import plan

    jobs = plan(tmp_path, "math-cpu", ["on-policy", "per", "freshper"], 3, 100, {}, None)
    assert [(j["seed"], j["label"]) for j in jobs[:4]] == [(0, "on-policy"), (0, "per"), (0, "freshper"),
                                                          (1, "on-policy")]
    assert len(jobs) == 9


def test_paired_differences_match_arms_by_seed():
    """Seed s of every arm saw the same states: differences pair runs by seed, not by position."""
    from freshper.trainer.study.report import PAIRED, paired, paired_table

    def arm(seeds, aucs):
        return [({"seed": s}, [], {k: a for k in PAIRED}) for s, a in zip(seeds, aucs)]

    by_label = {"on-policy": arm([0, 1, 2], [0.10, 0.20, 0.30]),
                "freshper": arm([2, 0, 1], [0.35, 0.12, 0.19]),  # listed out of seed order
                "per": arm([0, 1], [0.05, 0.20])}  # a tie is not a win
    d = paired(by_label)
    m, h, wins, n = d["freshper"]["auc"]
    diffs = [0.02, -0.01, 0.05]
    assert (wins, n) == (2, 3) and m == pytest.approx(sum(diffs) / 3)
    assert h == pytest.approx(mean_ci(diffs)[1])
    assert d["per"]["auc"][2:] == (0, 2) and d["per"]["auc"][0] == pytest.approx(-0.025)
    table = paired_table("on-policy", d)
    assert "difference to on-policy" in table and "| freshper | 3 | 0.020 ± " in table and "[2/3]" in table
    assert paired({"on-policy": by_label["on-policy"]}) == {} and paired_table("on-policy", {}) == ""


def test_arms_resolve_against_the_run_config(tmp_path):
    """on-policy-matched makes 1 + K passes (K the replay arms' replay_updates, as given); the gate
    arms take --max-age; a user's flag wins over compare's own run defaults, written --k=v."""
    from freshper.trainer.study.compare import plan

    given = {"algo.replay_updates": 3, "train.threads": 2, "env.format_penalty": -1e-3}
    jobs = plan(tmp_path, "math-cpu", ["on-policy-matched", "per-gate", "freshper", "stale-gate"], 1, 100, given,
                None, 6, lag_probs="0.5,0.5")
    cmds = {j["label"]: j["cmd"] for j in jobs}
    # the staleness gate alone, as the registered staleness study ran it: the replay buffer keeps its own limit
    assert "--algo.stale_max_age=6" in cmds["stale-gate"] and "--algo.staleness=gate" in cmds["stale-gate"]
    assert not any(a.startswith("--algo.max_age") for a in cmds["stale-gate"])
    assert not any(a.startswith("--algo.stale_max_age") for a in cmds["per-gate"])
    assert "--algo.onpolicy_passes=4" in cmds["on-policy-matched"]
    assert "--algo.mode=on-policy" in cmds["on-policy-matched"]
    assert "--algo.max_age=6" in cmds["per-gate"] and "--algo.mode=per" in cmds["per-gate"]
    assert not any(a.startswith("--algo.max_age") for a in cmds["freshper"])
    for cmd in cmds.values():
        keys = [a.split("=", 1)[0] for a in cmd if a.startswith("--")]
        assert len(keys) == len(set(keys)), "a flag given twice"
        assert "--train.threads=2" in cmd and "--env.format_penalty=-0.001" in cmd
    from freshper.trainer.flags import parse_overrides  # every child's line parses as train's would

    child = cmds["per-gate"][cmds["per-gate"].index("--preset") + 2:]
    assert parse_overrides(child)["algo.max_age"] == 6


@pytest.mark.parametrize("flag,msg", [
    (["--train.threads", "1"], None),  # compare's own default: the user's value wins, no "given twice"
    (["--train.seed", "3"], "use --seeds and --first-seed"),
    (["--seed", "3"], "use --seeds"),
    (["--train.iterations", "5"], "use --budget"),
    (["--train.name", "x"], "use --name"),
    (["--algo.mode", "per"], "defines arm 'on-policy'"),
    (["--algo.max_age", "3"], "use --max-age"),
    (["--arms", "stale-gate", "--lag-probs", "0.5,0.5", "--algo.stale_max_age", "3"], "use --max-age"),
])
def test_compare_flags_it_sets(tmp_path, capsys, monkeypatch, flag, msg):
    """A flag compare sets for each run is refused up front in one line (or, for its defaults,
    the user's value wins): the real parser, not a copy of it."""
    from freshper.trainer.study import compare

    argv = ["--preset", "math-cpu", "--arms", "on-policy,per-gate", "--seeds", "1", "--budget", "16",
            "--run-dir", str(tmp_path), *flag]
    if msg is None:
        ran = []
        monkeypatch.setattr(compare, "_run_one", lambda cmd, log: ran.append(cmd) or 1)  # no child starts
        assert compare.main(argv) == 1
        assert ran and all(sum(a.startswith("--train.threads") for a in c) == 1 for c in ran)
        assert all("--train.threads=1" in c for c in ran)
        return
    with pytest.raises(SystemExit):
        compare.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert msg in err[-1]


def test_first_seed_moves_the_seeds(tmp_path):
    from freshper.trainer.study.compare import plan

    jobs = plan(tmp_path, "math-cpu", ["on-policy"], 2, 100, {}, None, first_seed=100)
    assert [j["seed"] for j in jobs] == [100, 101] and jobs[0]["run"].name == "on-policy-s100"
    assert "--train.seed=100" in jobs[0]["cmd"]


def test_the_papers_setting_is_one_compare_command(tmp_path):
    """On a GPU node `freshper compare --preset qwen2.5-0.5b-sokoban-simple` plans the paper's arms at
    the preset's own budget (iterations x episodes); planning needs no GPU."""
    from freshper.trainer import config
    from freshper.trainer.study.compare import default_budget, parse, plan

    _, args, arms, _, given = parse(["--preset", "qwen2.5-0.5b-sokoban-simple", "--arms", "on-policy,per,freshper",
                                     "--seeds", "2", "--run-dir", str(tmp_path)])
    budget = default_budget(args.env)
    cfg = config.apply(config.Config(), config.PRESETS["qwen2.5-0.5b-sokoban-simple"])
    assert budget == cfg.train.iterations * cfg.rollout.episodes == 100 * 1024
    jobs = plan(tmp_path, args.env, arms, args.seeds, budget, given, None)
    assert [(j["seed"], j["label"]) for j in jobs] == [(0, "on-policy"), (0, "per"), (0, "freshper"),
                                                      (1, "on-policy"), (1, "per"), (1, "freshper")]
    assert all("--preset" in j["cmd"] and "qwen2.5-0.5b-sokoban-simple" in j["cmd"] for j in jobs)

"""The replay arms as the authors run them, and what a replay batch can teach."""
import math
import subprocess
import sys

import pytest
import torch

from freshper.trainer import config
from freshper.trainer.model.policy import lr_lambda
from freshper.trainer.train.loop import Trainer
from freshper.trainer.train.replay_signal import replay_signal, signal_rows


@pytest.mark.parametrize("mode,rule,want", [("freshper", "auto", "max-one-step"), ("per", "auto", "max"),
                                            ("uniform", "auto", "own"), ("freshper", "max", "max"),
                                            ("per", "max-one-step", "max-one-step"), ("freshper", "own", "own")])
def test_each_arm_inserts_by_the_authors_rule(mode, rule, want):
    cfg = config.load("tiny", None, {"algo.mode": mode, "algo.insert_priority": rule})
    assert config.buffer_insert(cfg.algo) == want


def test_freshper_run_ends_the_boost_after_one_iteration(tmp_path):
    tr = Trainer(config.load("tiny", None, {"algo.mode": "freshper", "train.iterations": 2}), tmp_path / "f")
    tr.run()
    b = tr.buffer
    assert b.insert == "max-one-step"
    newest = b._birth == 1
    assert not b._boosted[~newest].any()  # a boost is ended by a replay or by the next iteration
    # the first iteration's trajectories hold their own priority |reward| + eps, not the maximum
    first = (b._birth == 0) & b._live
    torch.testing.assert_close(b._log_base[first], torch.log(b._fields["reward"][first].abs().double() + b.eps))


def test_replay_signal_counts_singletons_and_zero_advantage_tokens():
    group = torch.tensor([7, 7, 3, 9, 9, 9, 4])
    adv = torch.tensor([1.0, -1.0, 0.0, 0.5, 0.0, -0.5, 0.0])
    mask = torch.zeros(7, 6, dtype=torch.bool)
    mask[:, 2:5] = True  # 3 tokens each
    mask[0, 5] = True  # row 0: 4 tokens
    single, nonzero = (float(x) for x in replay_signal(signal_rows(group, adv, mask)))
    assert single == pytest.approx(2 / 7)  # groups 3 and 4
    assert nonzero == pytest.approx((4 + 3 + 3 + 3) / 22)


def test_group_replay_has_no_singletons_and_trajectory_replay_reports_them(tmp_path):
    over = {"algo.mode": "freshper", "train.iterations": 3, "rollout.episodes": 8, "algo.replay_batch": 4,
            "algo.capacity": 64}
    rows = Trainer(config.load("tiny", None, {**over, "algo.replay_unit": "group"}), tmp_path / "g").run()
    assert all(r["replay_singleton_frac"] == 0 and r["replay_rows"] == 4 for r in rows)
    rows = Trainer(config.load("tiny", None, over), tmp_path / "t").run()
    assert all(0 <= r["replay_singleton_frac"] <= 1 and 0 <= r["replay_adv_nonzero_frac"] <= 1 for r in rows)
    assert rows[-1]["replay_singleton_frac"] > 0  # 4 draws from 12 groups of 2: singletons are near certain
    with pytest.raises(ValueError, match="multiple of rollout.group_size"):
        config.load("tiny", None, {"algo.replay_unit": "group", "algo.replay_batch": 3})


def test_replay_kl_is_never_negative(tmp_path):
    rows = Trainer(config.load("tiny", None, {"algo.mode": "per", "train.iterations": 3}), tmp_path / "k").run()
    assert all(r["replay_kl"] >= 0 for r in rows)
    assert all(v[0] >= 0 for r in rows for v in r["replay_kl_by_age"].values())


def test_infinite_tau_runs_as_no_decay(tmp_path):
    cfg = config.load("tiny", None, {"algo.mode": "freshper", "algo.tau": "inf", "train.iterations": 1})
    tr = Trainer(cfg, tmp_path / "inf")
    tr.run()
    assert math.isinf(tr.buffer.tau)
    from freshper.trainer.train.drift import DriftTau

    d = DriftTau(100.0, 20.0, math.inf)
    d.observe(torch.tensor([1.0, 2.0]), torch.tensor([-0.1, -0.2]))  # no drift measured: tau_max
    tr.buffer.set_tau(d.update())
    assert math.isinf(tr.buffer.tau)


def test_cosine_past_its_horizon_rises_again_as_in_the_papers_code():
    f = lr_lambda("cosine", 0, 100)
    assert f(0) == 1.0 and f(100) == pytest.approx(0.0, abs=1e-12)
    assert f(150) == pytest.approx(0.5) and f(200) == pytest.approx(1.0)
    cfg = config.load("tiny", None, {"algo.mode": "per", "algo.lr_horizon": "all", "train.iterations": 4})
    assert cfg.algo.lr_horizon == "all"


def test_gpu_presets_follow_the_authors_replay_configs():
    for name in ("qwen2.5-0.5b-frozenlake", "qwen2.5-0.5b-sokoban-simple", "qwen2.5-0.5b-sokoban-hard"):
        p = config.PRESETS[name]
        assert p["algo.replay_updates"] == 1 and p["eval.every"] == 5 and p["rollout.max_new_tokens"] == 128
        assert p["rollout.max_len"] == 4096 and p["train.iterations"] == 100
    assert config.EvalConfig().temperature == config.RolloutConfig().temperature == 0.99


def test_reading_a_config_imports_no_environment_or_model_library():
    # validating reads the environments' OPTIONS (freshper.trainer.envs), which load none of these
    heavy = "('gymnasium', 'transformers', 'datasets', 'math_verify', 'PIL', 'freshper.kernels')"
    code = ("import sys; import freshper.trainer.config as c; c.field_table(); print([m for m in HEAVY if m in "
            "sys.modules]); c.load('math-cpu'); print([m for m in HEAVY[:-1] if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code.replace("HEAVY", heavy)], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["[]", "[]"]  # validating a config loads the kernels (their choices), nothing more
    from freshper.trainer.envs import ENVS

    assert set(config.ENV_NAMES) == set(ENVS)


def test_frozenlake_replay_prompts_are_the_authors_replay_configs():
    from freshper.trainer.envs import make_env

    env = make_env("frozenlake", prompts="replay")
    state = env.reset(3)
    sys_msg, user = env.opening(state, 128)
    assert sys_msg["content"] == ("You are an agent solving the FrozenLake puzzle. Output must be wrapped as "
                                  "<answer>Action</answer>.")
    assert user["content"].startswith("You are solving the FrozenLake puzzle. Forbid the whole and go to the target.")
    assert user["content"].endswith(f"Current turn: 0\nGrid state:\n{state}\nActions left: 10\n"
                                    "Respond with one action token only, within 128 tokens.\n")
    r = env.step("<answer>Left</answer>")
    fb = env.feedback(r, 128)
    assert fb.startswith(f"Feedback: Your previous action received reward {float(r.reward)!r}. Revise your plan if "
                         "needed.Current turn: 1\nGrid state:\n")
    with pytest.raises(ValueError, match="prompts must be one of"):
        make_env("sokoban", prompts="replay")
    with pytest.raises(ValueError, match="env.prompts='replay' is not an option of env.name='sokoban'"):
        config.load("sokoban-simple", None, {"env.prompts": "replay"})
    assert config.load("qwen2.5-0.5b-frozenlake").env.prompts == "replay"


def test_a_tiny_run_with_the_replay_prompts(tmp_path):
    cfg = config.load("tiny", None, {"env.prompts": "replay", "train.iterations": 1})
    rows = Trainer(cfg, tmp_path / "rp").run()
    assert rows[0]["gen_tokens"] > 0


def test_rollout_signal_counts_groups_of_one_outcome_and_the_sampled_surprisal():
    from freshper.trainer.train.replay_signal import rollout_signal

    score = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.0, 0.0])
    group = torch.tensor([7, 7, 9, 9, 4, 4])  # groups 7 (differs), 9 and 4 (one outcome each)
    mask = torch.tensor([[0, 1, 1], [0, 1, 0], [0, 0, 1], [1, 1, 1], [0, 1, 1], [0, 0, 0]])
    logp = torch.tensor([[-9.0, -1.0, -2.0], [-9.0, -0.5, -9.0], [-9.0, -9.0, -0.25], [-1.0, -1.0, -1.0],
                         [-9.0, -2.0, -2.0], [-9.0, -9.0, -9.0]])
    out = rollout_signal(score, group, mask, logp)
    assert out["groups_varied"] == pytest.approx(1 / 3)
    # the masked tokens only: 1 + 2 + 0.5 + 0.25 + 3 x 1 + 2 + 2 over 9 tokens
    assert out["reply_nll"] == pytest.approx(10.75 / 9)

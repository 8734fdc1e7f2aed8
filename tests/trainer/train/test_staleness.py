"""The staleness control acts on the parameter update, not on the loss (trainer/train/staleness.py).

Every update of the default job is clipped, and the clip divides any factor on a batch's loss back
out. So the decay weighs the batch's clipped gradient where it enters AdamW's first moment
(freshper/batch_weight.py: tested there against a float64 reference), and the ESS rule
scales the step's learning rate; these tests measure parameter changes from one optimizer state.
The batch's part of a step is the step minus the step the optimizer makes with the batch's
gradient out of its first moment (weight 0). In float32 the decay's part agrees with the weight
times `is`'s to 2e-5 (relative, L2); tolerance 1e-3. Measured once against wrong variants: the
decay on the loss (the code before this test) gives the whole step 1.000 (clipped) and 1.003
(unclipped) times `is`'s; the ESS applied linearly instead of as its square root is off by 0.21.
"""
import copy
import math

import pytest
import torch

from freshper.trainer import config
from freshper.trainer.config import env_kwargs
from freshper.trainer.engines.base import Sampling
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.model.load import load_policy
from freshper.trainer.model.policy import Policy, row_lengths
from freshper.trainer.train.loop import Trainer
from freshper.trainer.train.rollout import rollout
from freshper.trainer.train.staleness import STALENESS, treat

TOL = 1e-3
OVER = {"rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0, "train.iterations": 2,
        "rollout.episodes": 16, "algo.mode": "on-policy", "algo.lr": 3e-3, "rollout.lag": 1, "algo.tau": 1.0}


def flat(state):
    return torch.cat([v.detach().double().flatten() for v in state.values()])


def relative(a, b):
    return float((a - b).norm() / b.norm())


# --------------------------------------------------------------------------------- the treatment
@pytest.mark.parametrize("mode", STALENESS)
def test_a_fresh_batch_is_trained_alike_under_every_mode(mode):
    t = treat(mode, 5, 5, tau=2.0, max_age=1, stale_tis_cap=2.0)
    assert (t.age, t.keep, t.weight, t.ess_lr, t.tis_cap, t.birth) == (0, True, 1.0, False, None, 5)


def test_each_mode_treats_a_stale_batch_as_documented():
    kw = dict(tau=2.0, max_age=2, stale_tis_cap=1.5)
    none, is_, decay, ess = (treat(m, 7, 4, **kw) for m in ("none", "is", "decay", "ess"))
    assert (none.weight, none.tis_cap, none.birth) == (1.0, None, 7), "as if fresh, born at arrival"
    assert (is_.weight, is_.ess_lr, is_.tis_cap, is_.birth) == (1.0, False, 1.5, 4)
    assert decay.weight == pytest.approx(math.exp(-3 / 2.0)) and (decay.tis_cap, decay.birth) == (1.5, 4)
    assert ess.ess_lr and (ess.weight, ess.tis_cap, ess.birth) == (1.0, 1.5, 4)
    assert not treat("gate", 7, 4, **kw).keep and treat("gate", 6, 4, **kw).keep, "the gate keeps age <= max_age"
    with pytest.raises(ValueError, match="algo.staleness='drop': expected one of none, is, decay, ess, gate"):
        treat("drop", 7, 4, **kw)


# --------------------------------------------------------------- the decay, through the trainer
def step_change(tmp_path, name, **over):
    """The parameter change of iteration 1's update (a batch of age 1 under lag 1), after an
    iteration 0 that every mode trains alike (a fresh batch): the same optimizer state."""
    tr = Trainer(config.load("tiny", None, {**OVER, **over}), tmp_path / name)
    tr.run(iterations=1)
    before = flat(tr.model.state_dict())
    row = tr.run(iterations=1)[-1]
    assert row["batch_age"] == 1
    return flat(tr.model.state_dict()) - before, row


@pytest.mark.parametrize("clip", [1.0, 1e6], ids=["default-clip", "unclipped"])
def test_the_decays_part_of_the_step_is_exp_minus_age_over_tau_times_is(tmp_path, clip):
    d_is, r_is = step_change(tmp_path, "is", **{"algo.staleness": "is", "algo.grad_clip": clip})
    d_w, r_w = step_change(tmp_path, "decay", **{"algo.staleness": "decay", "algo.grad_clip": clip})
    # tau far below the age: weight exp(-1e9) = 0, the step without the batch's gradient in its momentum
    d_0, r_0 = step_change(tmp_path, "none-of-it", **{"algo.staleness": "decay", "algo.tau": 1e-9,
                                                      "algo.grad_clip": clip})
    w = math.exp(-1 / 1.0)
    assert (r_w["batch_weight"], r_is["batch_weight"], r_0["batch_weight"]) == (pytest.approx(w), 1.0, 0.0)
    assert (r_is["grad_norm"] > clip) == (clip == 1.0), "the default clip clips this update; 1e6 does not"
    assert relative(d_w - d_0, w * (d_is - d_0)) < TOL
    assert relative(d_is - d_0, d_is) > 0.05, "the batch's part is not the whole step: momentum carries the rest"


def test_every_pass_over_a_stale_batch_gets_its_treatment(tmp_path, monkeypatch):
    """algo.onpolicy_passes 2: both updates of the stale batch are weighted (and under ess scaled)."""
    seen = []
    real = Policy.update

    def spy(self, *a, **kw):
        seen.append((kw.get("batch_weight", 1.0), kw.get("ess_lr", False)))
        return real(self, *a, **kw)

    monkeypatch.setattr(Policy, "update", spy)
    for mode in ("decay", "ess"):
        seen.clear()
        rows = Trainer(config.load("tiny", None, {**OVER, "algo.staleness": mode, "algo.onpolicy_passes": 2}),
                       tmp_path / mode).run()
        w = math.exp(-1) if mode == "decay" else 1.0
        assert seen == [(1.0, False)] * 2 + [(pytest.approx(w), mode == "ess")] * 2, seen
        if mode == "ess":
            assert 0 < rows[1]["batch_ess"] <= 1 and rows[1]["batch_lr_scale"] == pytest.approx(
                math.sqrt(rows[1]["batch_ess"]))
            assert "batch_ess" not in rows[0], "a fresh batch: no ESS rule"


@pytest.mark.parametrize("mode", ["decay", "ess", "gate"])
def test_a_lag_0_run_is_the_synchronous_run_under_every_mode(tmp_path, mode):
    over = {**OVER, "rollout.lag": 0, "algo.mode": "freshper", "algo.replay_updates": 1}
    sync = Trainer(config.load("tiny", None, over), tmp_path / "sync")
    rows_sync = sync.run()
    extra = {"algo.stale_max_age": 1} if mode == "gate" else {}
    other = Trainer(config.load("tiny", None, {**over, "algo.staleness": mode, **extra}), tmp_path / mode)
    rows_other = other.run()
    stable = lambda r: {k: v for k, v in r.items() if not k.startswith(("time_", "weight_sync_s"))}  # noqa: E731
    assert [stable(r) for r in rows_sync] == [stable(r) for r in rows_other]
    assert torch.equal(flat(sync.model.state_dict()), flat(other.model.state_dict()))


# ----------------------------------------------------------------- the ESS rule, on one update
@pytest.fixture(scope="module")
def batch():
    """Episodes of the tiny model on FrozenLake and a policy state after one update, so that
    AdamW's moments are not those of a first step (where Adam's step is the gradient's sign)."""
    # micro-batches of 2: the update runs the rows in its own order (prompts together), and the
    # rows come interleaved (prompts 3, 4, 5, 6, 3, 4, 5, 6), so that order is not the identity
    # (a constant learning rate: a one-step cosine ends at lr 0)
    cfg = config.load("tiny", None, {"train.sft_steps": 0, "algo.lr": 1e-3, "algo.warmup_steps": 0,
                                     "algo.lr_schedule": "constant", "algo.micro_batch": 2})
    torch.manual_seed(0)
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    ep = rollout(HFEngine(model, tok), tok, "frozenlake", env_kwargs(cfg), [3, 4, 5, 6], 2,
                 cfg.rollout.max_new_tokens, cfg.rollout.max_len, Sampling(1.0, 1.0, 0))
    mix = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])
    rows = (ep.tokens[mix], ep.mask[mix])
    adv = torch.linspace(-1, 1, len(ep))[:, None] * rows[1].float()
    policy = Policy(model, cfg, torch.device("cpu"))
    policy.update(*rows, None, adv)
    return cfg, copy.deepcopy(model.state_dict()), copy.deepcopy(policy.opt.state_dict()), rows, adv


def policy_at(batch):
    cfg, state, opt_state, _, _ = batch
    model, _, _ = load_policy(cfg, torch.device("cpu"))
    model.load_state_dict(state)
    p = Policy(model, cfg, torch.device("cpu"))
    p.opt.load_state_dict(copy.deepcopy(opt_state))  # loading keeps the tensors: each policy its own moments
    return p


def behaviour_at(batch, seq):
    """Behaviour log-probs that put each row's sequence-level log-ratio log pi/mu at `seq` (R,)."""
    _, _, _, (tokens, mask), _ = batch
    logp = policy_at(batch).logprobs(tokens, mask)
    n = mask[:, 1:].sum(1).double()
    return (logp - (seq / n)[:, None].float() * mask.float()).masked_fill(~mask, 0)


def test_ess_scales_the_step_by_the_root_of_the_importance_ratios_ess(batch):
    _, _, _, (tokens, mask), adv = batch
    seq = torch.linspace(-1.5, 1.0, len(tokens)).double()
    mu = behaviour_at(batch, seq)
    order = policy_at(batch)._order(tokens, policy_at(batch)._starts(mask, row_lengths(mask), None),
                                    row_lengths(mask))
    assert order is not None and order.tolist() != list(range(len(tokens))), "the update reorders these rows"
    w = seq.exp()
    ess = float(w.sum() ** 2 / (len(w) * (w * w).sum()))
    changes = {}
    for ess_lr in (False, True):
        p = policy_at(batch)
        before = flat(p.model.state_dict())
        st = p.update(tokens, mask, None, adv, tis_logp=mu, tis_cap=2.0, ess_lr=ess_lr)
        changes[ess_lr] = flat(p.model.state_dict()) - before
    assert st["ess"] == pytest.approx(ess, rel=1e-4) and ess < 0.9, "a spread of ratios: the ESS well below 1"
    assert st["lr_scale"] == pytest.approx(math.sqrt(ess), rel=1e-4)
    assert relative(changes[True], math.sqrt(ess) * changes[False]) < TOL


@pytest.mark.parametrize("kw, match", [({"batch_weight": 1.5}, r"batch_weight=1.5: expected a number in \[0, 1\]"),
                                       ({"batch_weight": float("nan")}, "batch_weight=nan"),
                                       ({"ess_lr": True}, "ess_lr needs tis_logp")])
def test_bad_step_scales_are_refused_before_anything_changes(batch, kw, match):
    _, _, _, (tokens, mask), adv = batch
    p = policy_at(batch)
    before = flat(p.model.state_dict())
    with pytest.raises(ValueError, match=match):
        p.update(tokens, mask, None, adv, **kw)
    assert torch.equal(flat(p.model.state_dict()), before)


def test_an_infinite_importance_ratio_stops_the_update_before_the_step(batch):
    """A sampled token the engine gave probability 0 (log mu = -inf): the ESS is undefined, and
    the update raises instead of stepping with a NaN learning rate."""
    _, _, _, (tokens, mask), adv = batch
    mu = behaviour_at(batch, torch.zeros(len(tokens)).double())
    mu[0, mask[0].nonzero()[0, 0]] = -math.inf
    p = policy_at(batch)
    before = flat(p.model.state_dict())
    with pytest.raises(FloatingPointError, match="ESS is nan"):
        p.update(tokens, mask, None, adv, tis_logp=mu, tis_cap=2.0, ess_lr=True)
    assert torch.equal(flat(p.model.state_dict()), before)


def test_a_weight_0_update_leaves_the_first_moment_at_b1_times_itself(batch):
    """The weight takes the clipped gradient out of AdamW's first moment, not the raw one (on the
    default job 20-130 times larger): a batch at weight 0 leaves m = b1 * m. Measured error 1e-8
    relative to the largest moment; taking the unclipped gradient out instead is off by its size."""
    _, _, _, (tokens, mask), adv = batch
    p = policy_at(batch)
    before = {q: p.opt.state[q]["exp_avg"].clone() for q in p.model.parameters() if q in p.opt.state}
    st = p.update(tokens, mask, None, adv, batch_weight=0.0)
    assert st["grad_norm"] > p.cfg.algo.grad_clip, "a clipped update: the clip's place matters"
    b1 = p.opt.param_groups[0]["betas"][0]
    top = max(float(m.abs().max()) for m in before.values())
    for q, m in before.items():
        assert torch.allclose(p.opt.state[q]["exp_avg"], b1 * m, rtol=0, atol=1e-6 * top)

"""The staleness control acts on the parameter update, not on the loss (trainer/train/staleness.py).

The gradient clip and Adam divide any uniform factor on a batch's loss back out: under the
default clip every update of the default job is clipped, and even unclipped, Adam's step barely
depends on the gradient's scale. So the decay and the ESS rule scale the step's learning rate,
and these tests measure what matters, the parameter change from one optimizer state. Their
tolerance: in float32 the only difference between the two steps is the learning rate, and the
parameter changes agree to 1.2e-5 (relative, L2) where they should be equal up to that factor;
1e-3 leaves room for rounding. Measured once against wrong variants: the decay on the loss alone
(the code before this test) moves the weights 1.000 (clipped) and 1.003 (unclipped) times as far
as `is`, not 0.37; the decay on the loss as well as on the step is off by 0.27 unclipped (under
the default clip the clip divides that loss weight out, and the two coincide); the ESS applied
linearly instead of as its square root is off by 0.21.
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
from freshper.trainer.model.policy import Policy
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
    assert (t.age, t.keep, t.lr_scale, t.ess_lr, t.tis_cap, t.birth) == (0, True, 1.0, False, None, 5)


def test_each_mode_treats_a_stale_batch_as_documented():
    kw = dict(tau=2.0, max_age=2, stale_tis_cap=1.5)
    none, is_, decay, ess = (treat(m, 7, 4, **kw) for m in ("none", "is", "decay", "ess"))
    assert (none.lr_scale, none.tis_cap, none.birth) == (1.0, None, 7), "as if fresh, born at arrival"
    assert (is_.lr_scale, is_.ess_lr, is_.tis_cap, is_.birth) == (1.0, False, 1.5, 4)
    assert decay.lr_scale == pytest.approx(math.exp(-3 / 2.0)) and (decay.tis_cap, decay.birth) == (1.5, 4)
    assert ess.ess_lr and (ess.lr_scale, ess.tis_cap, ess.birth) == (1.0, 1.5, 4)
    assert not treat("gate", 7, 4, **kw).keep and treat("gate", 6, 4, **kw).keep, "the gate keeps age <= max_age"
    with pytest.raises(ValueError, match="algo.staleness='drop': expected one of none, is, decay, ess, gate"):
        treat("drop", 7, 4, **kw)


# --------------------------------------------------------------- the decay, through the trainer
def step_change(tmp_path, mode, **over):
    """The parameter change of iteration 1's update (a batch of age 1 under lag 1), after an
    iteration 0 that every mode trains alike (a fresh batch): the same optimizer state."""
    tr = Trainer(config.load("tiny", None, {**OVER, "algo.staleness": mode, **over}), tmp_path / mode)
    tr.run(iterations=1)
    before = flat(tr.model.state_dict())
    row = tr.run(iterations=1)[-1]
    assert row["batch_age"] == 1
    return flat(tr.model.state_dict()) - before, row


@pytest.mark.parametrize("clip", [1.0, 1e6], ids=["default-clip", "unclipped"])
def test_the_decay_moves_the_weights_exp_minus_age_over_tau_as_far_as_is(tmp_path, clip):
    d_is, r_is = step_change(tmp_path, "is", **{"algo.grad_clip": clip})
    d_decay, r_decay = step_change(tmp_path, "decay", **{"algo.grad_clip": clip})
    w = math.exp(-1 / 1.0)
    assert r_decay["batch_weight"] == pytest.approx(w) and r_is["batch_weight"] == 1.0
    assert (r_is["grad_norm"] > clip) == (clip == 1.0), "the default clip clips this update; 1e6 does not"
    assert relative(d_decay, w * d_is) < TOL, (float(d_decay.norm() / d_is.norm()), w)


# ----------------------------------------------------------------- the ESS rule, on one update
@pytest.fixture(scope="module")
def batch():
    """Episodes of the tiny model on FrozenLake and a policy state after one update, so that
    AdamW's moments are not those of a first step (where Adam's step is the gradient's sign)."""
    cfg = config.load("tiny", None, {"train.sft_steps": 0, "algo.lr": 1e-3, "algo.warmup_steps": 0,
                                     "algo.lr_schedule": "constant"})  # a one-step cosine ends at lr 0
    torch.manual_seed(0)
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    ep = rollout(HFEngine(model, tok), tok, "frozenlake", env_kwargs(cfg), [3, 4, 5, 6], 2,
                 cfg.rollout.max_new_tokens, cfg.rollout.max_len, Sampling(1.0, 1.0, 0))
    adv = torch.linspace(-1, 1, len(ep))[:, None] * ep.mask.float()
    policy = Policy(model, cfg, torch.device("cpu"))
    policy.update(ep.tokens, ep.mask, None, adv)
    return cfg, copy.deepcopy(model.state_dict()), copy.deepcopy(policy.opt.state_dict()), ep, adv


def policy_at(batch):
    cfg, state, opt_state, _, _ = batch
    model, _, _ = load_policy(cfg, torch.device("cpu"))
    model.load_state_dict(state)
    p = Policy(model, cfg, torch.device("cpu"))
    p.opt.load_state_dict(copy.deepcopy(opt_state))  # loading keeps the tensors: each policy its own moments
    return p


def test_ess_scales_the_step_by_the_root_of_the_importance_ratios_ess(batch):
    _, _, _, ep, adv = batch
    probe = policy_at(batch)
    logp = probe.logprobs(ep.tokens, ep.mask)
    # behaviour log-probs that put each row's sequence-level log-ratio log pi/mu at a chosen value
    seq = torch.linspace(-1.5, 1.0, len(ep)).double()
    n = ep.mask[:, 1:].sum(1).double()
    mu = (logp - (seq / n)[:, None].float() * ep.mask.float()).masked_fill(~ep.mask, 0)
    w = seq.exp()
    ess = float(w.sum() ** 2 / (len(w) * (w * w).sum()))
    changes = {}
    for ess_lr in (False, True):
        p = policy_at(batch)
        before = flat(p.model.state_dict())
        st = p.update(ep.tokens, ep.mask, None, adv, tis_logp=mu, tis_cap=2.0, ess_lr=ess_lr)
        changes[ess_lr] = flat(p.model.state_dict()) - before
    assert st["ess"] == pytest.approx(ess, rel=1e-4) and ess < 0.9, "a spread of ratios: the ESS well below 1"
    assert st["lr_scale"] == pytest.approx(math.sqrt(ess), rel=1e-4)
    assert relative(changes[True], math.sqrt(ess) * changes[False]) < TOL


@pytest.mark.parametrize("kw, match", [({"lr_scale": 0.0}, r"lr_scale=0.0: expected a number in \(0, 1\]"),
                                       ({"lr_scale": float("nan")}, "lr_scale=nan"),
                                       ({"ess_lr": True}, "ess_lr needs tis_logp")])
def test_bad_step_scales_are_refused_before_anything_changes(batch, kw, match):
    _, _, _, ep, adv = batch
    p = policy_at(batch)
    before = flat(p.model.state_dict())
    with pytest.raises(ValueError, match=match):
        p.update(ep.tokens, ep.mask, None, adv, **kw)
    assert torch.equal(flat(p.model.state_dict()), before)

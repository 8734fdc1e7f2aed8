"""The three ways to put a weight w on one batch under the clip and AdamW, measured on the tiny
model from one optimizer state: the batch's effect on the weights (the run with the batch minus
the run where its advantages are zero, so it adds no gradient), right after its step and after 5
further identical updates, as a multiple of its effect at weight 1 (projection)."""
import copy, math, sys, torch
from freshper.trainer import config
from freshper.trainer.config import env_kwargs
from freshper.trainer.engines.base import Sampling
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.model.load import load_policy
from freshper.trainer.model import policy as P
from freshper.trainer.model.policy import Policy
from freshper.trainer.train.rollout import rollout

warm = int(sys.argv[1]) if len(sys.argv) > 1 else 10
cfg = config.load("tiny", None, {"train.sft_steps": 0, "algo.lr": 1e-3, "algo.warmup_steps": 0,
                                 "algo.lr_schedule": "constant"})
torch.manual_seed(0)
model, tok, _ = load_policy(cfg, torch.device("cpu"))
eng = HFEngine(model, tok)
eps = [rollout(eng, tok, "frozenlake", env_kwargs(cfg), seeds, 2, cfg.rollout.max_new_tokens, cfg.rollout.max_len,
               Sampling(1.0, 1.0, 0)) for seeds in ([3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14])]
advs = [torch.linspace(-1, 1, len(e))[:, None] * e.mask.float() for e in eps]
advs[1] = torch.linspace(1, -1, len(eps[1]))[:, None] * eps[1].mask.float()
policy = Policy(model, cfg, torch.device("cpu"))
for _ in range(warm):
    policy.update(eps[0].tokens, eps[0].mask, None, advs[0])
state, opt = copy.deepcopy(model.state_dict()), copy.deepcopy(policy.opt.state_dict())
real = P.weigh_momentum


def design(name):
    def f(o, w):
        if name == "first moment":
            real(o, w)
        elif name == "gradient":
            for g in o.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        p.grad.mul_(w)
        elif name == "both moments":
            for g in o.param_groups:
                b1, b2 = g["betas"]
                for p in g["params"]:
                    st = o.state[p]
                    if p.grad is None or "exp_avg" not in st:
                        continue
                    st["exp_avg"].sub_(p.grad, alpha=(1 - b1) * (1 - w) / b1)
                    st["exp_avg_sq"].sub_(p.grad * p.grad, alpha=(1 - b2) * (1 - w) / b2)
        elif name == "learning rate":
            for g in o.param_groups:
                g["lr"] *= w  # restored by the scheduler's next step
    return f


def flat(m): return torch.cat([v.detach().double().flatten() for v in m.state_dict().values()])


def path(w, zero=False):
    m, _, _ = load_policy(cfg, torch.device("cpu")); m.load_state_dict(state)
    p = Policy(m, cfg, torch.device("cpu")); p.opt.load_state_dict(copy.deepcopy(opt))
    p.update(eps[1].tokens, eps[1].mask, None, advs[1] * (0 if zero else 1), batch_weight=w)
    out = [flat(m)]
    for _ in range(5):
        p.update(eps[2].tokens, eps[2].mask, None, advs[2])
    return out + [flat(m)]


w = math.exp(-1)
P.weigh_momentum = real
zero = path(1.0, zero=True)
one = path(1.0)
for name in ("gradient", "learning rate", "first moment", "both moments"):
    P.weigh_momentum = design(name)
    dec = path(w)
    ratios = [float((dec[i] - zero[i]).dot(one[i] - zero[i]) / (one[i] - zero[i]).dot(one[i] - zero[i])) for i in (0, 1)]
    print(f"after {warm} updates, weight {w:.3f} on the {name}: the batch's effect {ratios[0]:.3f} of weight 1's "
          f"right after its step, {ratios[1]:.3f} after 5 more")
P.weigh_momentum = real

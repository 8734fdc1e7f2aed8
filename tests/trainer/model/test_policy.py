"""One Policy.update moves the policy the way its advantages say: on-policy rows and replayed rows
(drawn from a ReplayBuffer, with and without IS weights). These are the tests that fail when the
update's advantage is negated or zeroed (checked once: both variants fail every sign test here)."""
import pytest
import torch

from freshper import ReplayBuffer
from freshper.trainer import config
from freshper.trainer.config import env_kwargs
from freshper.trainer.engines.base import Sampling
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.model.load import load_policy
from freshper.trainer.model.policy import Policy
from freshper.trainer.train.rollout import rollout

FULL = Sampling(1.0, 1.0, 0)


@pytest.fixture(scope="module")
def batch():
    """Episodes of the tiny model on FrozenLake, with their recomputed log-probs."""
    cfg = config.load("tiny", None, {"train.sft_steps": 0, "algo.lr": 1e-3, "algo.warmup_steps": 0})
    torch.manual_seed(0)
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    ep = rollout(HFEngine(model, tok), tok, "frozenlake", env_kwargs(cfg), [3, 4, 5, 6], 2,
                 cfg.rollout.max_new_tokens, cfg.rollout.max_len, FULL)
    return cfg, model.state_dict(), ep


def fresh_policy(batch):
    cfg, state, _ = batch
    model, _, _ = load_policy(cfg, torch.device("cpu"))
    model.load_state_dict(state)
    return Policy(model, cfg, torch.device("cpu"))


def objective(policy, tokens, mask, adv):
    """Sum over response tokens of A_t * log pi(a_t): what one policy-gradient step must raise."""
    return float((policy.logprobs(tokens, mask) * adv).sum())


def token_adv(mask, per_row):
    return per_row[:, None].float() * mask.float()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_on_policy_update_raises_positive_and_lowers_negative_advantage_tokens(batch, sign):
    _, _, ep = batch
    policy = fresh_policy(batch)
    old = policy.logprobs(ep.tokens, ep.mask)
    adv = token_adv(ep.mask, torch.full((len(ep),), sign))
    st = policy.update(ep.tokens, ep.mask, old, adv)
    assert st["grad_norm"] > 0 and st["tokens"] == int(ep.mask[:, 1:].sum())
    new = policy.logprobs(ep.tokens, ep.mask)
    change = float((new - old)[ep.mask].sum())
    assert sign * change > 0, f"advantage {sign:+}: response log-probs moved by {change:+.4f}"


def test_mixed_advantages_raise_the_objective_and_zero_advantages_change_nothing(batch):
    _, _, ep = batch
    policy = fresh_policy(batch)
    old = policy.logprobs(ep.tokens, ep.mask)
    adv = token_adv(ep.mask, torch.tensor([1.0, -1.0] * (len(ep) // 2)))
    before = objective(policy, ep.tokens, ep.mask, adv)
    policy.update(ep.tokens, ep.mask, old, adv)
    assert objective(policy, ep.tokens, ep.mask, adv) > before

    still = fresh_policy(batch)
    st = still.update(ep.tokens, ep.mask, old, torch.zeros_like(adv))
    assert st["grad_norm"] == 0.0
    torch.testing.assert_close(still.logprobs(ep.tokens, ep.mask), old, atol=0, rtol=0)


@pytest.mark.parametrize("is_weights", [False, True])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_replayed_rows_move_as_their_advantages_say(batch, sign, is_weights):
    """The replay path: rows go into a FreshPER buffer with their behaviour log-probs, a batch is
    drawn (aged one step), and the update on it, IS-weighted or not, moves the drawn rows."""
    _, _, ep = batch
    policy = fresh_policy(batch)
    old = policy.logprobs(ep.tokens, ep.mask)
    buf = ReplayBuffer(16, mode="freshper", tau=50.0, seed=0)
    buf.add(torch.linspace(0.1, 1.0, len(ep)).double(), step=0, tokens=ep.tokens.to(torch.int32), mask=ep.mask,
            old_logp=old)
    b = buf.sample(6, step=1)
    tokens, mask = b.tokens.long(), b.mask
    adv = token_adv(mask, torch.full((len(b),), sign))
    weights = b.weights if is_weights else None
    if is_weights:
        assert not torch.allclose(b.weights, torch.ones_like(b.weights)), "the draw must carry unequal IS weights"
    before = policy.logprobs(tokens, mask)
    st = policy.update(tokens, mask, b.old_logp, adv, weights)
    assert st["grad_norm"] > 0
    change = float((policy.logprobs(tokens, mask) - before)[mask].sum())
    assert sign * change > 0, f"replayed rows, advantage {sign:+}: log-probs moved by {change:+.4f}"


def _shift(mask, alternate: bool):
    """Old log-probs below the current ones by 0.3 on every response token, or by +-0.5 in turn
    (each row's mean log-ratio then near 0, its tokens' ratios 1.65 and 0.61)."""
    m = mask.float()
    if not alternate:
        return 0.3 * m
    sign = (torch.cumsum(mask.long(), 1) % 2 * 2 - 1).float()
    return 0.5 * sign * m


@pytest.mark.parametrize("loss,level", [("cispo", "token"), ("clip", "sequence")])
def test_the_update_takes_the_configured_loss(batch, loss, level):
    """algo.loss / algo.ratio_level reach the update: on rows the policy has moved away from, CISPO
    keeps the gradient PPO's clip drops (every token's ratio 1.35 > 1 + clip_high), and GSPO's
    sequence ratio (near 1 for rows of alternating token ratios) another one than the token ratios;
    both still raise the log-probs of positive-advantage tokens."""
    cfg, state, ep = batch
    shift = _shift(ep.mask, alternate=level == "sequence")
    out = {}
    for name, over in (("plain", {}), ("variant", {"algo.loss": loss, "algo.ratio_level": level})):
        c = config.load("tiny", None, {"train.sft_steps": 0, "algo.lr": 1e-3, "algo.warmup_steps": 0, **over})
        model, _, _ = load_policy(c, torch.device("cpu"))
        model.load_state_dict(state)
        policy = Policy(model, c, torch.device("cpu"))
        now = policy.logprobs(ep.tokens, ep.mask)
        st = policy.update(ep.tokens, ep.mask, now - shift, token_adv(ep.mask, torch.ones(len(ep))))
        out[name] = (st["grad_norm"], float((policy.logprobs(ep.tokens, ep.mask) - now)[ep.mask].sum()))
    if loss == "cispo":
        assert out["plain"][0] == 0.0, "every token above 1 + clip_high: PPO's clip leaves no gradient"
    assert out["variant"][0] > 0 and abs(out["variant"][0] - out["plain"][0]) > 0.01 * out["variant"][0]
    assert out["variant"][1] > 0, "positive advantages: the update raises the response log-probs"


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_skipping_the_backward_of_silent_micro_batches_changes_no_weight(batch, kl_coef, monkeypatch):
    """algo.skip_zero_adv: micro-batches (of 2 rows, one group each) whose advantages are all 0
    skip their backward, and the weights, the returned statistics and the row KLs are bit-equal
    to running every backward: over an update with half its groups silent, then one with all
    silent (AdamW's momentum still moves the weights on that zero gradient), then one with the
    replayed old log-probs. With a KL term nothing is skipped (its gradient is not zero).
    Checked once: treating a micro-batch as silent when only its first row is, or skipping every
    backward of an all-silent update, fails here."""
    cfg, state, ep = batch
    calls = {"n": 0}
    backward = torch.Tensor.backward

    def counted(self, *args, **kwargs):
        calls["n"] += 1
        return backward(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "backward", counted)
    groups = ep.tokens.shape[0] // 2
    per_row = torch.tensor([[1.0, -1.0] if g % 2 else [0.0, 0.0] for g in range(groups)]).flatten()
    steps = [token_adv(ep.mask, per_row), torch.zeros(ep.mask.shape)]
    out = {}
    for skip in (False, True):
        c = config.load("tiny", None, {"train.sft_steps": 0, "algo.lr": 1e-3, "algo.warmup_steps": 0,
                                       "algo.micro_batch": 2, "algo.kl_coef": kl_coef, "algo.skip_zero_adv": skip})
        model, _, _ = load_policy(c, torch.device("cpu"))
        model.load_state_dict(state)
        policy = Policy(model, c, torch.device("cpu"))
        calls["n"] = 0
        stats = [policy.update(ep.tokens, ep.mask, None, adv) for adv in steps]
        old = stats[0]["logp"]
        stats.append(policy.update(ep.tokens, ep.mask, old, steps[0]))
        out[skip] = (calls["n"], {k: v.clone() for k, v in policy.model.state_dict().items()}, stats)
    (n_all, w_all, s_all), (n_skip, w_skip, s_skip) = out[False], out[True]
    assert n_all == 3 * groups
    assert n_skip == (n_all if kl_coef else groups // 2 + 1 + groups // 2), "silent micro-batches skip their backward"
    for k in w_all:
        assert torch.equal(w_all[k], w_skip[k]), k
    assert any(not torch.equal(w_all[k], state[k]) for k in w_all)
    for a, b in zip(s_all, s_skip):
        for k in a:
            if isinstance(a[k], torch.Tensor):
                assert torch.equal(a[k], b[k]), k
            else:
                assert a[k] == b[k], k


def test_an_update_of_no_rows_runs_with_the_skip_on(batch):
    """Zero rows (no micro-batch to skip or keep) step as with the skip off: loss 0, no error.
    Checked once: marking the last of no micro-batches as not silent raises here."""
    cfg, state, ep = batch
    out = []
    for skip in (False, True):
        c = config.load("tiny", None, {"train.sft_steps": 0, "algo.skip_zero_adv": skip})
        model, _, _ = load_policy(c, torch.device("cpu"))
        model.load_state_dict(state)
        empty = torch.zeros((0, ep.tokens.shape[1]), dtype=ep.tokens.dtype)
        none = torch.zeros((0, ep.mask.shape[1]), dtype=ep.mask.dtype)
        st = Policy(model, c, torch.device("cpu")).update(empty, none, torch.zeros(none.shape), torch.zeros(none.shape))
        out.append((st["loss"], st["grad_norm"], st["tokens"]))
    assert out[0] == out[1] == (0.0, 0.0, 0)


def test_a_silent_last_partial_micro_batch_is_skipped(batch):
    """5 rows in micro-batches of 3: the last (2 rows, both advantage 0) is silent. Its padding
    was once counted as live rows, so a partial last micro-batch never skipped its backward."""
    cfg, state, ep = batch
    c = config.load("tiny", None, {"train.sft_steps": 0, "algo.micro_batch": 3})
    model, _, _ = load_policy(c, torch.device("cpu"))
    policy = Policy(model, c, torch.device("cpu"))
    mask = torch.ones(5, 6, dtype=torch.bool)
    adv = torch.zeros(5, 6)
    adv[:3] = 1.0
    assert policy._silent(adv, mask[:, 1:], None, 2) == [False, True]
    assert policy._silent(torch.zeros(5, 6), mask[:, 1:], None, 2) == [True, False]  # the last one still runs

"""fp16 compute with dynamic loss scaling (trainer/model/loss_scale.py, Policy.update)."""
import copy

import pytest
import torch

from freshper.trainer import config
from freshper.trainer.model.load import load_policy
from freshper.trainer.model.loss_scale import SMALLEST, LossScale
from freshper.trainer.model.policy import Policy
from freshper.trainer.model.precision import keep_masters

CPU = torch.device("cpu")


def _cfg(**over):
    return config.load("tiny", None, {"train.sft_steps": 0, "algo.warmup_steps": 0, "algo.lr_schedule": "constant",
                                      "algo.kl_coef": 0.0, **over})


def _rows(vocab: int, seed: int = 0, size: float = 1.0):
    """Four rows of 24 tokens, the last 10 of each a reply, advantages +-`size`."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (4, 24), generator=g)
    mask = torch.zeros(4, 24, dtype=torch.bool)
    mask[:, 14:] = True
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None] * mask.float() * size
    return tokens, mask, adv


def _grads(model, cfg, rows, scale=None) -> torch.Tensor:
    """The update's gradient (masters, after unscaling), flattened in float64; `scale` fixes the
    fp16 loss scale for this one update."""
    policy = Policy(model, cfg, CPU)
    if scale is not None:
        policy.loss_scale.scale = scale
    policy.update(*rows[:2], None, rows[2])
    return torch.cat([p.grad.double().flatten() for p in policy.model.parameters()])


def test_fp16_with_loss_scaling_keeps_the_gradient_that_underflows_without_it():
    """Small advantages (1e-3) put d loss / d logits near 1e-8, under fp16's smallest subnormal.
    With the loss scale, the fp16 update's gradient is no farther from float64's than bf16
    autocast's (the honest baseline: bf16 has float32's range, 8x fp16's spacing); with the
    scale held at 1 it is farther (the underflow), which is what this test exists to catch."""
    cfg = _cfg()
    model, _, _ = load_policy(cfg, CPU)
    rows = _rows(model.get_input_embeddings().num_embeddings, seed=1, size=1e-3)
    ref = _grads(copy.deepcopy(model).double(), cfg, rows)
    err = lambda g: float((g - ref).norm() / ref.norm())  # noqa: E731
    bf16 = err(_grads(keep_masters(copy.deepcopy(model), torch.bfloat16), cfg, rows))
    fp16 = err(_grads(keep_masters(copy.deepcopy(model), torch.float16), cfg, rows))
    unscaled = err(_grads(keep_masters(copy.deepcopy(model), torch.float16), cfg, rows, scale=1.0))
    assert bf16 > 1e-4, "the baseline is not low precision: the bound would be meaningless"
    assert fp16 <= bf16, f"fp16 with loss scaling {fp16:.2e} against bf16 {bf16:.2e}"
    assert unscaled > bf16, f"fp16 without loss scaling {unscaled:.2e} did not lose gradient (bf16 {bf16:.2e})"


def test_an_overflow_skips_the_step_and_halves_the_scale():
    cfg = _cfg()
    model, _, _ = load_policy(cfg, CPU)
    policy = Policy(keep_masters(model, torch.float16), cfg, CPU)
    before = [p.detach().clone() for p in policy.model.parameters()]
    policy.loss_scale.scale = 2.0 ** 60  # S x loss overflows fp16's 65,504 in the backward
    policy.update(*_rows(model.get_input_embeddings().num_embeddings)[:2], None,
                  _rows(model.get_input_embeddings().num_embeddings)[2])
    assert policy.loss_scale.scale == 2.0 ** 59 and policy.scale_stats()["skipped_updates"] == 1
    assert all(torch.equal(a, p) for a, p in zip(before, policy.model.parameters())), "a skipped step moved weights"
    assert policy.sched.last_epoch == 0


def test_loss_scale_grows_backs_off_and_round_trips():
    s = LossScale(init=8.0, interval=2)
    assert s.update(True) and s.scale == 8.0
    assert s.update(True) and s.scale == 16.0  # two finite steps in a row
    assert not s.update(False) and s.scale == 8.0 and s.skipped == 1
    t = LossScale()
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict()
    tiny = LossScale(init=SMALLEST)
    with pytest.raises(FloatingPointError, match="loss scale fell below"):
        tiny.update(False)
    with pytest.raises(ValueError, match="LossScale needs"):
        LossScale(backoff=1.5)


def test_an_overflow_restarts_the_count_of_finite_steps_before_growth():
    """After a skipped step S grows only after `interval` finite steps counted from the skip:
    finite steps before it do not carry over (an overflow says S was just too large)."""
    s = LossScale(init=8.0, interval=3)
    assert s.update(True) and s.update(True) and s.scale == 8.0
    assert not s.update(False) and s.scale == 4.0
    assert s.update(True) and s.update(True) and s.scale == 4.0, "grew on finite steps from before the overflow"
    assert s.update(True) and s.scale == 8.0


def test_fp16_refusals():
    with pytest.raises(ValueError, match="model.dtype=float16: the warm starts"):
        config.load("tiny", None, {"model.dtype": "float16", "train.sft_steps": 2})
    from freshper.trainer.dist import check_world

    with pytest.raises(ValueError, match="fp16's loss scaling runs on one process"):
        check_world(_cfg(**{"model.dtype": "float16", "rollout.episodes": 8, "rollout.group_size": 2}), 2)


def test_the_fp16_refusal_reads_the_resolved_warm_start_steps():
    """Issue 77, defect 5: train.sft_steps -1 (auto) means no warm start for a pretrained model,
    so fp16 on the default preset is not refused; on the tiny model auto means 60 steps."""
    cfg = config.load("smollm2-135m-math", None, {"model.dtype": "float16"})
    assert cfg.train.sft_steps == -1 and cfg.model.dtype == "float16"
    with pytest.raises(ValueError, match=r"train.sft_steps=60,"):
        config.load("tiny", None, {"model.dtype": "float16"})


def test_a_checkpoint_keeps_the_scale_it_had_found(tmp_path):
    """A resumed fp16 run starts from the saved scale, not from 2^16 again (which would skip
    steps to find it anew); a bf16 run's checkpoint has none to keep."""
    from freshper.trainer.train import checkpoint

    cfg = _cfg()
    model, _, _ = load_policy(cfg, CPU)
    policy = Policy(keep_masters(copy.deepcopy(model), torch.float16), cfg, CPU)
    policy.loss_scale.load_state_dict({"scale": 512.0, "good": 7, "skipped": 3})
    path = checkpoint.save(tmp_path / "ckpt", 1, policy, None, {"iteration": 1}, keep=2)
    fresh = Policy(keep_masters(copy.deepcopy(model), torch.float16), cfg, CPU)
    checkpoint.load(path, fresh, CPU, 0.4)
    assert fresh.loss_scale.state_dict() == {"scale": 512.0, "good": 7, "skipped": 3}
    plain = Policy(keep_masters(copy.deepcopy(model), torch.bfloat16), cfg, CPU)
    assert plain.loss_scale is None and plain.scale_stats() == {}
    checkpoint.load(checkpoint.save(tmp_path / "bf16", 1, plain, None, {"iteration": 1}, keep=2), plain, CPU, 0.4)


def _warm_fp16_policy():
    cfg = _cfg()
    model, _, _ = load_policy(cfg, CPU)
    policy = Policy(keep_masters(model, torch.float16), cfg, CPU)
    rows = _rows(model.get_input_embeddings().num_embeddings)
    for _ in range(8):  # until a step is taken (the first scales may overflow): AdamW's moments exist
        policy.update(*rows[:2], None, rows[2])
        if policy.opt.state:
            return policy, rows
    raise AssertionError("no fp16 step was taken in 8 updates")


def test_a_batch_weight_is_taken_from_the_unscaled_gradient():
    """fp16: the weight moves AdamW's first moment by the gradient after unscaling (and clipping),
    so a batch at weight 0 leaves m = b1 * m; taking it from the scaled gradient (S = 65,536 times
    larger) is off by that factor."""
    policy, rows = _warm_fp16_policy()
    before = {q: policy.opt.state[q]["exp_avg"].clone() for q in policy.opt.state}
    policy.update(*rows[:2], None, rows[2], batch_weight=0.0)
    b1 = policy.opt.param_groups[0]["betas"][0]
    top = max(float(m.abs().max()) for m in before.values())
    for q, m in before.items():
        assert torch.allclose(policy.opt.state[q]["exp_avg"], b1 * m, rtol=0, atol=1e-6 * top)


def test_a_skipped_step_leaves_the_momentum_alone_whatever_the_batch_weight():
    policy, rows = _warm_fp16_policy()
    before = {q: policy.opt.state[q]["exp_avg"].clone() for q in policy.opt.state}
    skipped = policy.scale_stats()["skipped_updates"]
    policy.loss_scale.scale = 2.0 ** 60  # the backward overflows: the step is skipped
    policy.update(*rows[:2], None, rows[2], batch_weight=0.5)
    assert policy.scale_stats()["skipped_updates"] == skipped + 1
    assert all(torch.equal(policy.opt.state[q]["exp_avg"], m) for q, m in before.items())

"""TRL settings a user meets with FreshPERGRPOTrainer: no args, pad_to_multiple_of, long prompts with
replay off, and the replay loss following loss_type and beta (or refusing clearly)."""
import pytest
import torch

trl = pytest.importorskip("trl")

from freshper.integrations.trl import FreshPERGRPOConfig, FreshPERGRPOTrainer  # noqa: E402

from .test_trl_integration import length_reward, make  # noqa: E402


def test_no_args_gives_the_replay_defaults(tmp_path, tiny_model_dir, monkeypatch):  # noqa: F811
    import transformers.training_args as ta
    from datasets import Dataset

    monkeypatch.chdir(tmp_path)  # TRL names the output folder after the model, in the working folder
    monkeypatch.setattr(ta, "is_torch_bf16_gpu_available", lambda: True)  # GRPOConfig's default bf16, on CPU
    ds = Dataset.from_list([{"prompt": "What is 1 + 2?"}] * 4)
    tr = FreshPERGRPOTrainer(model=tiny_model_dir, reward_funcs=length_reward, train_dataset=ds)
    assert isinstance(tr.args, FreshPERGRPOConfig) and tr.args.output_dir.endswith("-GRPO")
    assert tr.args.replay_updates == 1 and len(tr.replay_buffer) == 0
    with pytest.raises(TypeError, match="FreshPERGRPOConfig"):
        FreshPERGRPOTrainer(model=tiny_model_dir, reward_funcs=length_reward, train_dataset=ds,
                            args=trl.GRPOConfig(str(tmp_path / "o"), use_cpu=True, report_to=[]))


def test_pad_to_multiple_of_wider_than_max_completion_length(tmp_path, tiny_model_dir):  # noqa: F811
    tr = make(tmp_path, tiny_model_dir, max_completion_length=10, pad_to_multiple_of=8, max_steps=2)
    tr.train()
    assert len(tr.replay_buffer) == 8 and tr.replay_buffer._fields["completion_ids"].shape[1] == 10


def test_long_prompts_train_with_replay_off_and_are_named_with_it_on(tmp_path, tiny_model_dir):  # noqa: F811
    tr = make(tmp_path, tiny_model_dir, replay_updates=0, replay_max_prompt_length=4, max_steps=1)
    tr.train()
    assert len(tr.replay_buffer) == 0, "replay off stores nothing"
    tr = make(tmp_path, tiny_model_dir, replay_max_prompt_length=4, max_steps=1)
    with pytest.raises(ValueError, match="raise replay_max_prompt_length"):
        tr.train()


# Every GRPOTrainer loss setting a user can pick, each tried on its own over TRL's grpo loss.
SETTINGS = {
    "grpo": {}, "bnpo": {"loss_type": "bnpo"}, "dr_grpo": {"loss_type": "dr_grpo"}, "dapo": {"loss_type": "dapo"},
    "cispo": {"loss_type": "cispo"}, "sapo": {"loss_type": "sapo"},
    "luspo": {"loss_type": "luspo", "importance_sampling_level": "sequence"}, "vespo": {"loss_type": "vespo"},
    "delta": {"delta": 1.05}, "gspo": {"importance_sampling_level": "sequence"},
    "entropy-filter": {"top_entropy_quantile": 0.5}, "off-policy-mask": {"off_policy_mask_threshold": 0.01},
    "entropy-bonus": {"entropy_coef": 0.5}, "kl": {"beta": 0.2},
    "kl-bias-corrected": {"beta": 0.2, "use_bias_correction_kl": True},
}
BASE = {"loss_type": "grpo", "beta": 0.0}


def trl_twin(tr, **over):
    """TRL's own GRPOTrainer on the same model object, with the same GRPOConfig fields."""
    from dataclasses import fields

    from datasets import Dataset

    cfg = {f.name: getattr(tr.args, f.name) for f in fields(trl.GRPOConfig) if f.init}
    cfg.update(output_dir=tr.args.output_dir + "-trl", **over)
    cfg.pop("generation_batch_size")  # derived from steps_per_generation in __post_init__
    twin = trl.GRPOTrainer(model=tr.model, reward_funcs=length_reward, args=trl.GRPOConfig(**cfg),
                           train_dataset=Dataset.from_list([{"prompt": "x"}] * 4), processing_class=tr.processing_class)
    twin.current_gradient_accumulation_steps = 1
    return twin


def trl_inputs(tr, ids, att, c1, b, weights=None):
    """The replayed rows as TRL's compute_loss takes a generation batch, built from the buffer's
    columns here (not by the integration): behaviour log-probs as the old policy."""
    p = ids.size(1) - c1
    adv = b.adv.float() * (weights if weights is not None else 1.0)
    inputs = {"prompt_ids": ids[:, :p], "prompt_mask": att[:, :p], "completion_ids": ids[:, p:],
              "completion_mask": att[:, p:], "advantages": adv, "old_per_token_logps": b.logp[:, :c1],
              "num_items_in_batch": b.completion_mask[:, :c1].sum().float()}
    if tr.beta:
        with torch.no_grad():
            inputs["ref_per_token_logps"] = tr._get_per_token_logps_and_entropies(tr.ref_model, ids, att, c1)[0]
    return inputs


def loss_and_grads(loss, model):
    params = [q for q in model.parameters() if q.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return loss.detach(), [g for g in grads if g is not None]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory, tiny_model_dir):  # noqa: F811
    """One trained trainer per setting (built lazily), its buffer holding completions the
    policy has since moved away from (lr 1e-2), and 6 replayed rows of unequal lengths."""
    made = {}

    def get(name):
        if name not in made:
            tmp = tmp_path_factory.mktemp(name)
            tr = make(tmp, tiny_model_dir, replay_tau=1.0, replay_is_weights=False, learning_rate=1e-2,
                      max_steps=3, replay_updates=1, **{**BASE, **SETTINGS[name]})
            tr.train()
            b = tr.replay_buffer.sample(6, step=tr.state.global_step)
            cm = b.fields["completion_mask"].clone()
            for i, keep in enumerate([8, 2, 5, 1, 8, 3]):
                cm[i, keep:] = 0
            b.fields["completion_mask"] = cm
            made[name] = (tr, *tr._replay_batch(0, batch=b))
        return made[name]
    return get


@pytest.mark.parametrize("name", SETTINGS)
def test_a_replay_step_computes_trls_own_loss(replayed, name):
    """Policy fixed, no IS weight: the replay loss and its gradients equal what TRL's own
    GRPOTrainer.compute_loss gives on the same rows; and the setting changes TRL's loss on these
    rows, so a replay that ignored it would fail here."""
    tr, ids, att, c1, b = replayed(name)
    twin = trl_twin(tr)
    num_items = b.completion_mask[:, :c1].sum().float()
    ours = loss_and_grads(tr.replay_loss(tr.replay_inputs(ids, att, c1, b, num_items))[0], tr.model)
    theirs = loss_and_grads(twin.compute_loss(tr.model, trl_inputs(tr, ids, att, c1, b)), tr.model)
    torch.testing.assert_close(ours[0], theirs[0])
    for g, h in zip(ours[1], theirs[1]):
        torch.testing.assert_close(g, h)
    if SETTINGS[name]:
        defaults = {k: trl.GRPOConfig.__dataclass_fields__[k].default for k in SETTINGS[name]}
        plain = trl_twin(tr, **{**defaults, **BASE})
        ignored = plain.compute_loss(tr.model, trl_inputs(tr, ids, att, c1, b))
        assert not torch.allclose(ignored.detach(), theirs[0], rtol=1e-4, atol=1e-7), f"{name} matters on these rows"


def test_is_weights_scale_each_completions_policy_term(replayed):
    """With replay_is_weights, a replayed completion's loss is TRL's times its IS weight."""
    tr, ids, att, c1, b = replayed("grpo")
    assert not torch.allclose(b.weights, torch.ones_like(b.weights)), "a case where the weights matter"
    tr.args.replay_is_weights = True
    try:
        num_items = b.completion_mask[:, :c1].sum().float()
        ours = loss_and_grads(tr.replay_loss(tr.replay_inputs(ids, att, c1, b, num_items))[0], tr.model)
    finally:
        tr.args.replay_is_weights = False
    twin = trl_twin(tr)
    w = b.weights.float()
    want = loss_and_grads(twin.compute_loss(tr.model, trl_inputs(tr, ids, att, c1, b, weights=w)), tr.model)
    flat = loss_and_grads(twin.compute_loss(tr.model, trl_inputs(tr, ids, att, c1, b)), tr.model)
    torch.testing.assert_close(ours[0], want[0])
    for g, h in zip(ours[1], want[1]):
        torch.testing.assert_close(g, h)
    assert not torch.allclose(want[0], flat[0], rtol=1e-4, atol=1e-7), "the weights change the loss"


def test_replay_metrics_go_to_trls_log_under_replay(replayed):
    tr, *_ = replayed("grpo")
    tr._metrics["train"].clear()
    tr.replay_steps()
    m = tr._metrics["train"]
    assert {"replay/loss", "replay/entropy", "replay/clip_ratio/region_mean", "replay/age_mean"} <= set(m)
    assert "entropy" not in m, "a replay step's metrics are not TRL's own step's"


def per_row_sum(twin, tr, ids, att, c1, b, w):
    """sum_i w_i * loss_i, loss_i TRL's loss with only row i's advantage kept: the IS-weighted loss
    by definition, built without the integration's substitution of A_i by w_i * A_i."""
    total = 0.0
    for i in range(ids.size(0)):
        inputs = trl_inputs(tr, ids, att, c1, b)
        keep = torch.zeros_like(inputs["advantages"])
        keep[i] = inputs["advantages"][i]
        inputs["advantages"] = keep
        total = total + w[i] * twin.compute_loss(tr.model, inputs)
    return total


@pytest.mark.parametrize("name", ["grpo", "sapo", "vespo", "off-policy-mask", "dapo"])
def test_is_weights_weigh_each_completions_loss(replayed, name):
    """With replay_is_weights and mixed-sign advantages, the replay loss and its gradients are the
    weighted sum of per-row losses. sapo, vespo and the off-policy mask read an advantage's sign,
    not only its scale, so a weighting that flipped or dropped a sign would fail here."""
    tr, ids, att, c1, b = replayed(name)
    saved = b.fields["adv"]
    b.fields["adv"] = torch.tensor([0.9, -1.3, 0.4, -0.7, 1.1, -0.2], dtype=saved.dtype)
    w = torch.tensor([1.0, 0.35, 0.8, 0.55, 0.2, 0.9])  # fixed here to differ row by row
    weights, b.weights = b.weights, w
    tr.args.replay_is_weights = True
    try:
        num_items = b.completion_mask[:, :c1].sum().float()
        ours = loss_and_grads(tr.replay_loss(tr.replay_inputs(ids, att, c1, b, num_items))[0], tr.model)
        twin = trl_twin(tr)
        want = loss_and_grads(per_row_sum(twin, tr, ids, att, c1, b, w), tr.model)
        flat = twin.compute_loss(tr.model, trl_inputs(tr, ids, att, c1, b)).detach()
    finally:
        tr.args.replay_is_weights = False
        b.weights = weights
        b.fields["adv"] = saved
    torch.testing.assert_close(ours[0], want[0])
    for g, h in zip(ours[1], want[1]):
        torch.testing.assert_close(g, h)
    assert not torch.allclose(want[0], flat, rtol=1e-4, atol=1e-7), "the weights change the loss"


def test_vllm_ratios_and_sampling_logps_reach_the_replay_loss(replayed):
    """docs/trl.md's vLLM row: a stored completion's IS ratios (vLLM against the trainer) and
    vLLM's log-probs are the ones its replay step's loss uses, as TRL's own loss would on them."""
    tr, ids, att, c1, b = replayed("off-policy-mask")
    g = torch.Generator().manual_seed(0)
    b.fields["is_ratio"] = 0.5 + torch.rand(b.logp.shape, generator=g)
    b.fields["sampling_logp"] = b.logp - 0.3 * torch.rand(b.logp.shape, generator=g)
    twins = []
    try:
        for t in (tr, trl_twin(tr)):
            t.use_vllm, t.vllm_importance_sampling_correction = True, True
            twins.append(t)
        num_items = b.completion_mask[:, :c1].sum().float()
        ours = tr.replay_loss(tr.replay_inputs(ids, att, c1, b, num_items))[0].detach()
        inputs = trl_inputs(tr, ids, att, c1, b)
        inputs.update(importance_sampling_ratio=b.is_ratio[:, :c1], sampling_per_token_logps=b.sampling_logp[:, :c1])
        theirs = twins[1].compute_loss(tr.model, inputs).detach()
        inputs["importance_sampling_ratio"] = torch.ones_like(inputs["importance_sampling_ratio"])
        unratioed = twins[1].compute_loss(tr.model, inputs).detach()
    finally:
        for t in twins:
            t.use_vllm = False
        del b.fields["is_ratio"], b.fields["sampling_logp"]
    torch.testing.assert_close(ours, theirs)
    assert not torch.allclose(ours, unratioed, rtol=1e-4, atol=1e-7), "the injected ratios matter"

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


def reference_loss(tr, ids, att, c1, b, loss_type, beta=0.0):
    """TRL's clipped loss of GRPOTrainer._compute_loss for the replayed batch, written out."""
    logits = tr.model(input_ids=ids, attention_mask=att).logits[:, -c1 - 1:-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, -c1:, None])[..., 0]
    mask = b.completion_mask[:, :c1].float()
    old = b.logp[:, :c1]
    r = torch.exp(logp - old)
    a = b.adv[:, None]
    tok = -torch.minimum(r * a, r.clamp(1 - tr.epsilon_low, 1 + tr.epsilon_high) * a) * b.weights.float()[:, None]
    if beta:
        with torch.no_grad():
            rl = tr.ref_model(input_ids=ids, attention_mask=att).logits[:, -c1 - 1:-1].float()
            ref = torch.log_softmax(rl, -1).gather(-1, ids[:, -c1:, None])[..., 0]
        tok = tok + beta * (torch.exp(ref - logp) - (ref - logp) - 1) * r.detach()
    if loss_type == "grpo":
        return ((tok * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if loss_type == "dr_grpo":
        return (tok * mask).sum() / (tok.size(0) * tr.args.max_completion_length)
    return (tok * mask).sum() / mask.sum()


@pytest.mark.parametrize("loss_type,beta", [("grpo", 0.0), ("dr_grpo", 0.0), ("bnpo", 0.0), ("dapo", 0.2)])
def test_replay_loss_follows_loss_type_and_beta(tmp_path, tiny_model_dir, loss_type, beta):  # noqa: F811
    tr = make(tmp_path, tiny_model_dir, loss_type=loss_type, beta=beta, replay_tau=1.0, max_steps=2)
    tr.train()
    ids, att, c1, b = tr._replay_batch(6)
    cm = b.fields["completion_mask"]
    for row, keep in ((0, 2), (3, 5)):  # rows of different lengths, where the aggregations differ
        cm[row, keep:] = 0
    got, _ = tr.replay_loss(ids, att, c1, b)
    want = reference_loss(tr, ids, att, c1, b, loss_type, beta)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    if beta:  # the KL term is there and matters
        assert not torch.allclose(want, reference_loss(tr, ids, att, c1, b, loss_type, 0.0), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("over,name", [({"loss_type": "sapo"}, "loss_type"), ({"delta": 2.0}, "delta"),
                                       ({"importance_sampling_level": "sequence", "loss_type": "grpo"},
                                        "importance_sampling_level")])
def test_settings_replay_cannot_reproduce_are_refused(tmp_path, over, name):
    with pytest.raises(ValueError, match=name):
        FreshPERGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **over)
    FreshPERGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], replay_updates=0, **over)

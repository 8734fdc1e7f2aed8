"""FreshPER inside TRL's GRPOTrainer, on CPU with a tiny random local model and a toy reward."""
import pytest
import torch

trl = pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from freshper.integrations.trl import FreshPERGRPOConfig, FreshPERGRPOTrainer  # noqa: E402


def length_reward(completions, **kw):
    return [len(c) / 10.0 for c in completions]


def constant_reward(completions, **kw):
    return [1.0 for _ in completions]


def make(tmp_path, path, reward=length_reward, peft_config=None, **over):
    kw = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
              max_completion_length=8, max_steps=2, learning_rate=1e-3, logging_steps=1, report_to=[],
              use_cpu=True, bf16=False, save_strategy="no", replay_updates=1, replay_tau=10.0, seed=0)
    kw.update(over)
    args = FreshPERGRPOConfig(**kw)
    ds = Dataset.from_list([{"prompt": f"What is {i} + {i + 1}?"} for i in range(16)])
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    return FreshPERGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok,
                               peft_config=peft_config)


def test_training_fills_the_buffer_and_a_replay_step_changes_the_parameters(tmp_path, tiny_model_dir):
    tr = make(tmp_path, tiny_model_dir, lr_scheduler_type="constant")  # linear decay ends at lr 0
    tr.train()
    assert len(tr.replay_buffer) == 8  # 2 steps x 4 completions
    logged = [h for h in tr.state.log_history if "replay/loss" in h]
    assert logged and all(0 < h["replay/is_ess"] <= 1 for h in logged)
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.replay_steps()
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))


def test_save_and_resume_keep_the_buffer(tmp_path, tiny_model_dir):
    tr = make(tmp_path, tiny_model_dir, save_strategy="steps", save_steps=2)
    tr.train()
    ckpt = tmp_path / "out" / "checkpoint-2"
    assert (ckpt / "freshper_buffer.safetensors").exists()
    saved = tr.replay_buffer.probabilities()
    again = make(tmp_path, tiny_model_dir, save_strategy="steps", save_steps=2)
    assert len(again.replay_buffer) == 0
    again.create_optimizer_and_scheduler(num_training_steps=2)
    again._load_optimizer_and_scheduler(str(ckpt))  # what train(resume_from_checkpoint=...) calls
    assert len(again.replay_buffer) == len(tr.replay_buffer) == 8
    torch.testing.assert_close(again.replay_buffer.probabilities(), saved)
    a, b = again.replay_buffer.sample(4, step=2), tr.replay_buffer.sample(4, step=2)
    assert torch.equal(a.indices, b.indices), "the sampling stream continues where it was saved"


def test_a_checkpoint_without_a_buffer_says_so(tmp_path, tiny_model_dir, caplog):
    tr = make(tmp_path, tiny_model_dir, save_strategy="steps", save_steps=2)
    tr.train()
    ckpt = tmp_path / "out" / "checkpoint-2"
    (ckpt / "freshper_buffer.safetensors").unlink()  # as saved by TRL's own GRPOTrainer
    again = make(tmp_path, tiny_model_dir)
    again.create_optimizer_and_scheduler(num_training_steps=2)
    with caplog.at_level("WARNING", logger="freshper"):
        again._load_optimizer_and_scheduler(str(ckpt))
    assert len(again.replay_buffer) == 0 and "holds no replay buffer" in caplog.text


def test_a_replay_update_accumulates_gradients_as_the_hf_loop_does(tmp_path, tiny_model_dir):
    """gradient_accumulation_steps=2: each replay update draws two micro-batches, each loss scaled
    by TRL for a window of two (grpo divides by it), and steps the optimizer once."""
    tr = make(tmp_path, tiny_model_dir, loss_type="grpo", gradient_accumulation_steps=2, replay_updates=2,
              max_steps=1)
    tr.train()
    steps, seen, backwards = [], [], []
    tr.optimizer.step = lambda *a, **k: steps.append(1)
    backward = tr.accelerator.backward
    tr.accelerator.backward = lambda loss, **k: (backwards.append(float(loss)), backward(loss, **k))
    compute = tr.compute_loss
    tr.compute_loss = lambda model, inputs: (seen.append(tr.current_gradient_accumulation_steps),
                                             compute(model, inputs))[1]
    tr._metrics["train"].clear()
    tr.replay_steps()
    losses = tr._metrics["train"]["replay/loss"]
    assert len(steps) == 2 and len(backwards) == 4 and seen == [2, 2, 2, 2]  # 2 updates x 2 micro-batches
    assert losses == pytest.approx([backwards[0] + backwards[1], backwards[2] + backwards[3]])


def test_replay_refuses_optimizer_wrappers_it_cannot_drive(tmp_path):
    with pytest.raises(ValueError, match="drive the optimizer directly"):
        FreshPERGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], replay_updates=1,
                           fsdp="full_shard")


def test_zero_variance_groups_are_filled_from_the_buffer(tmp_path, tiny_model_dir):
    tr = make(tmp_path, tiny_model_dir, reward=constant_reward, replay_fill_zero_variance=True, replay_updates=0,
              max_steps=3)
    tr.train()
    filled = [h["replay/filled_rows"] for h in tr.state.log_history if "replay/filled_rows" in h]
    assert filled and max(filled) == 4


def test_bad_replay_options_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="replay_mode"):
        FreshPERGRPOConfig(output_dir=str(tmp_path), replay_mode="lifo", use_cpu=True, report_to=[])


def test_a_filled_row_keeps_nothing_of_the_row_it_replaced(tmp_path, tiny_model_dir):
    """replay_fill_zero_variance with beta > 0, vLLM's ratios and log-probs and a tool mask: every
    per-token input of a filled row is its stored row's, and its reference log-probs are
    recomputed; the rows of groups with signal are untouched."""
    tr = make(tmp_path, tiny_model_dir, beta=0.2, replay_fill_zero_variance=True, replay_updates=0)
    g = torch.Generator().manual_seed(0)

    def batch(n, p, c, base):
        ids = torch.randint(5, 60, (n, p + c), generator=g)
        return {"prompt_ids": ids[:, :p], "prompt_mask": torch.ones(n, p, dtype=torch.long),
                "completion_ids": ids[:, p:], "completion_mask": torch.ones(n, c, dtype=torch.long),
                "advantages": torch.zeros(n), "ref_per_token_logps": torch.full((n, c), -99.0),
                "importance_sampling_ratio": base + torch.rand(n, c, generator=g),
                "sampling_per_token_logps": -base - torch.rand(n, c, generator=g),
                "tool_mask": (torch.rand(n, c, generator=g) > 0.3).long()}

    stored = batch(4, 5, 6, 1.0)
    stored["advantages"] = torch.tensor([0.5, -0.5, 1.0, -1.0])
    tr._rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    tr._store(stored, -torch.rand(4, 6, generator=g), tr._rewards)
    assert {"is_ratio", "sampling_logp", "tool_mask"} <= set(tr.replay_buffer.field_names)
    fresh = batch(4, 5, 6, 5.0)  # values no stored row has
    fresh["advantages"] = torch.tensor([0.0, 0.0, 0.7, -0.7])  # group 0 flat, group 1 has signal
    out = tr._fill_zero_variance(fresh, -torch.rand(4, 6, generator=g))
    for r in (0, 1):  # filled: each per-token input is one stored row's, found by its completion
        j = next(i for i in range(4) if torch.equal(out["completion_ids"][r, :6], stored["completion_ids"][i]))
        for key in ("importance_sampling_ratio", "sampling_per_token_logps", "tool_mask"):
            torch.testing.assert_close(out[key][r, :6], stored[key][j].to(out[key].dtype), msg=key)
        assert out["advantages"][r] == stored["advantages"][j]
        ids = torch.cat([out["prompt_ids"][r:r + 1], out["completion_ids"][r:r + 1]], 1)
        att = torch.cat([out["prompt_mask"][r:r + 1], out["completion_mask"][r:r + 1]], 1)
        with torch.no_grad():
            ref = tr._get_per_token_logps_and_entropies(tr.ref_model, ids, att, out["completion_ids"].size(1))[0]
        torch.testing.assert_close(out["ref_per_token_logps"][r], ref[0], atol=1e-5, rtol=1e-5)
    for key in ("importance_sampling_ratio", "sampling_per_token_logps", "tool_mask", "ref_per_token_logps"):
        torch.testing.assert_close(out[key][2:, :6], fresh[key][2:].to(out[key].dtype), msg=key)


def test_a_replayed_tool_completion_keeps_its_tool_mask(tmp_path, tiny_model_dir):
    """TRL's loss masks tool-output tokens with completion_mask * tool_mask: a replayed
    tool-calling completion must bring its tool mask back, or it trains on the tool's tokens."""
    tr = make(tmp_path, tiny_model_dir, replay_updates=1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 60, (2, 9), generator=g)
    out = {"prompt_ids": ids[:, :4], "prompt_mask": torch.ones(2, 4, dtype=torch.long),
           "completion_ids": ids[:, 4:], "completion_mask": torch.ones(2, 5, dtype=torch.long),
           "advantages": torch.tensor([1.0, -1.0]), "tool_mask": torch.tensor([[1, 0, 0, 1, 1], [1, 1, 1, 1, 1]])}
    tr._store(out, -torch.rand(2, 5, generator=g), torch.tensor([1.0, 0.0]))
    b = tr.replay_buffer.sample(2, step=0)
    inputs = tr.replay_inputs(*tr._replay_batch(0, batch=b)[:3], b, torch.tensor(10.0))
    for r in range(2):
        j = 0 if torch.equal(inputs["completion_ids"][r], out["completion_ids"][0]) else 1
        assert torch.equal(inputs["tool_mask"][r].long(), out["tool_mask"][j])


def test_peft_with_a_kl_term_fills_and_replays_against_the_base_weights(tmp_path, tiny_model_dir):
    """With a PEFT model TRL makes no reference model; the fill (and a replay step) then take the
    reference log-probs under the policy with its adapters disabled, as TRL does. The adapters are
    made non-zero first, so the adapted policy's log-probs differ from the base's: a reference taken
    with the adapters on would fail the comparison."""
    peft = pytest.importorskip("peft")
    tr = make(tmp_path, tiny_model_dir, peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj",
              "v_proj"]), beta=0.2, replay_fill_zero_variance=True, replay_updates=0)
    assert tr.ref_model is None
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in tr.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g))
    n, P, C = 4, 5, 6
    ids = torch.randint(5, 60, (n, P + C), generator=g)
    stored = {"prompt_ids": ids[:, :P], "prompt_mask": torch.ones(n, P, dtype=torch.long),
              "completion_ids": ids[:, P:], "completion_mask": torch.ones(n, C, dtype=torch.long),
              "advantages": torch.tensor([0.5, -0.5, 1.0, -1.0]), "ref_per_token_logps": torch.zeros(n, C)}
    tr._rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    tr._store(stored, -torch.rand(n, C, generator=g), tr._rewards)
    fresh = {k: v.clone() for k, v in stored.items()}
    fresh["advantages"] = torch.zeros(n)  # every group flat: all rows filled
    out = tr._fill_zero_variance(fresh, -torch.rand(n, C, generator=g))
    x = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    att = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    with torch.no_grad():
        adapted = tr._get_per_token_logps_and_entropies(tr.model, x, att, C)[0]
        with tr.model.disable_adapter():
            base = tr._get_per_token_logps_and_entropies(tr.model, x, att, C)[0]
    assert (adapted - base).abs().max() > 1e-3
    torch.testing.assert_close(out["ref_per_token_logps"][:, :C], base, atol=1e-5, rtol=1e-5)
    ids_, att_, c1, b = tr._replay_batch(2)
    assert tr.replay_inputs(ids_, att_, c1, b, torch.tensor(2.0))["ref_per_token_logps"].shape == (2, c1)

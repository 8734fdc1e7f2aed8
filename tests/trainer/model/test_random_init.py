"""`--model.init random` (a preset's architecture with random weights, built offline) and the
refusals a GPU node without vLLM or the hub meets at start-up."""
import importlib.util
import json

import pytest
import torch
import yaml

from freshper.trainer import config
from freshper.trainer.cli import main
from freshper.trainer.model.random_init import ARCHITECTURES, byte_tokenizer, random_model_dir

PAPER = "qwen2.5-0.5b-sokoban-simple"


def test_byte_tokenizer_covers_the_vocabulary():
    tok = byte_tokenizer(1000)
    assert len(tok) == 1000
    text = "Sokoban: push the box ☐ onto ◎, then <answer>Up</answer>"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([999]) == "<|extra_740|>"  # 256 bytes + 3 chat tokens before the fillers
    assert tok.eos_token == "<|im_end|>" and tok.convert_tokens_to_ids("<|im_start|>") < 300
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError, match="vocab_size"):
        byte_tokenizer(100)


def test_shipped_architecture_builds_offline_at_its_size(tmp_path, monkeypatch):
    """Qwen2.5-0.5B's numbers: 494M parameters (the published count), a tokenizer of its 151,936
    ids; built on the meta device, so no memory is spent on weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path))
    folder = random_model_dir("Qwen/Qwen2.5-0.5B-Instruct")
    cfg = AutoConfig.from_pretrained(folder)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.tie_word_embeddings) == (896, 24, 151936, True)
    assert json.loads((folder / "config.json").read_text())["num_key_value_heads"] == 2
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert round(model.num_parameters() / 1e6) == 494
    from transformers import AutoTokenizer

    assert len(AutoTokenizer.from_pretrained(folder)) == 151936
    assert random_model_dir("Qwen/Qwen2.5-0.5B-Instruct") == folder  # built once
    assert set(ARCHITECTURES) >= {config.PRESETS[p]["model.path"] for p in config.PRESETS
                                  if p.startswith("qwen2.5-") and "-vl-" not in p}


def _small_architecture(folder):
    """A local folder with only a Qwen2 config.json (no tokenizer), as model.init=random takes."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 300, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1}))
    return folder


def test_a_run_building_the_folder_at_the_same_time_does_not_crash_this_one(tmp_path, monkeypatch):
    """Issue 77, defect 6: two first runs build the random-init folder at once. Here the other run
    builds and renames it into place while this one is building: this one takes the finished folder,
    and neither leaves a temporary folder behind (both wrote to one fixed `.tmp` name, and the
    second rename crashed)."""
    import freshper.trainer.model.random_init as R

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    arch = str(_small_architecture(tmp_path / "arch"))
    real, calls = R.byte_tokenizer, []

    def racing(vocab):
        calls.append(vocab)
        if len(calls) == 1:  # mid-build: the other run finishes first
            assert (R.random_model_dir(arch) / "config.json").exists()
        return real(vocab)

    monkeypatch.setattr(R, "byte_tokenizer", racing)
    folder = R.random_model_dir(arch)
    assert len(calls) == 2 and (folder / "config.json").exists() and (folder / "tokenizer.json").exists()
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_random_weights_are_drawn_under_train_seed(tmp_path, monkeypatch):
    """The same seed draws the same weights, another seed other ones, whatever the caller's RNG."""
    from freshper.trainer.model.load import load_policy

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    tiny = {"train.iterations": 1, "train.sft_steps": 0}
    _, _, folder = load_policy(config.load("tiny", None, tiny), torch.device("cpu"))

    calls = []

    def weights(seed: int) -> torch.Tensor:
        calls.append(seed)
        torch.manual_seed(1000 + len(calls))  # the caller's stream differs each time: only train.seed may decide
        cfg = config.load("tiny", None, {**tiny, "model.path": folder, "model.init": "random", "train.seed": seed})
        model, _, _ = load_policy(cfg, torch.device("cpu"))
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    first = weights(0)
    assert torch.equal(first, weights(0))
    assert not torch.equal(first, weights(1))


def test_random_init_refuses_what_it_cannot_build():
    with pytest.raises(ValueError, match="model.init=random needs model.path"):
        config.load(PAPER, None, {"model.init": "random", "model.path": "someone/unknown-model"})


def test_missing_engine_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    """The paper's preset asks for vLLM: where it is not installed, one line names the way out,
    and nothing is built (no model load, no run folder)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    import freshper.trainer.model.load as load

    monkeypatch.setattr(load, "load_policy", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(SystemExit) as e:
        main(["train", "--preset", PAPER, "--model.init", "random", "--train.device", "cpu",
              "--train.run_dir", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--rollout.engine hf" in err[-1] and ".[vllm]" in err[-1]
    assert not any(tmp_path.iterdir())


@pytest.mark.slow(90)
def test_the_paper_preset_runs_an_iteration_with_random_weights(tmp_path):
    """Qwen2.5-0.5B-shaped, random weights, the HF engine, one iteration on the CPU (LoRA, a small
    batch and buffer, one turn: the architecture is the preset's, the batch is not)."""
    run = tmp_path / "r"
    assert main(["train", "--preset", PAPER, "--model.init", "random", "--rollout.engine", "hf",
                 "--train.device", "cpu", "--rollout.episodes", "2", "--rollout.group_size", "2",
                 "--rollout.max_new_tokens", "2", "--env.max_turns", "1", "--model.lora_rank", "4",
                 "--model.gradient_checkpointing", "false", "--eval.every", "0", "--algo.replay_batch", "2",
                 "--algo.micro_batch", "2", "--algo.capacity", "8", "--train.iterations", "1",
                 "--train.run_dir", str(tmp_path), "--train.name", "r",
                 "--train.progress", "false", "--train.threads", "1"]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["init"] == "random" and saved["model"]["path"] == "Qwen/Qwen2.5-0.5B-Instruct"
    log = (run / "train.log").read_text()
    assert "RANDOM weights" in log and "attention: sdpa" in log
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and metrics[0]["env_steps"] == 2

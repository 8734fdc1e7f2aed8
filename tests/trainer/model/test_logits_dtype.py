"""model.logits_dtype float32 against compute, with SmolLM2 in bf16: the engine's recorded log-probs
against the trainer's recompute at the same weights (the mismatch an on-policy ratio sees)."""
import torch

from freshper.trainer import config
from freshper.trainer.config import env_kwargs
from freshper.trainer.engines.base import Sampling
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.model.load import load_policy
from freshper.trainer.model.policy import Policy
from freshper.trainer.train.rollout import rollout

from .smollm2 import require_smollm2

require_smollm2()
CPU = torch.device("cpu")


def _mismatch(logits: str) -> tuple[float, set]:
    """Mean |engine - trainer| log-prob over the reply tokens of 16 replies at temperature 1, both
    sides with `model.logits_dtype` `logits`, and the dtypes the engine's LM head returned."""
    cfg = config.load("smollm2-135m-math", None, {"model.dtype": "bfloat16", "model.logits_dtype": logits,
                                                   "rollout.temperature": 1.0, "rollout.top_p": 1.0,
                                                   "rollout.top_k": 0, "rollout.max_new_tokens": 24})
    torch.manual_seed(0)
    model, tok, _ = load_policy(cfg, CPU)
    head = model.get_output_embeddings()
    seen = []
    hook = head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    r = cfg.rollout
    ep = rollout(HFEngine(model, tok, logits32=logits == "float32"), tok, cfg.env.name, env_kwargs(cfg), [0, 1],
                 8, r.max_new_tokens, r.max_len, Sampling(1.0, 1.0, 0))
    hook.remove()
    assert "forward" not in vars(head), "the engine left its float32 head in place"
    m = ep.mask.clone()
    m[:, 0] = False  # the first position predicts nothing
    trainer = Policy(model, cfg, CPU).logprobs(ep.tokens, ep.mask)
    return float((trainer - ep.engine_logp)[m].abs().mean()), set(seen)


def test_float32_logits_bring_engine_and_trainer_closer_in_bf16():
    """The engine samples from, and the trainer takes log-probs from, the same float32 logits: the
    mean mismatch shrinks (to 0.54x over 32 replies: results/benchmarks/
    mismatch-sources-cpu-2026-12-06/). An engine left on bf16 logits fails the dtype check, and
    a trainer left on them the comparison."""
    rounded, seen16 = _mismatch("compute")
    kept, seen32 = _mismatch("float32")
    assert seen16 == {torch.bfloat16} and seen32 == {torch.float32}
    assert kept < 0.75 * rounded, (kept, rounded)

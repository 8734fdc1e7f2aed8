"""Two HF engine set-ups playing the same multi-turn FrozenLake rollouts, greedy: what the engine's
cache and attention changes (turn cache, room cache, grouped heads) are each held to. They agree
when the replies are equal and the recorded log-probs lie within 4x float32's own error, measured
as the reference set-up in float32 against the same in float64."""
import torch

from freshper.trainer import config
from freshper.trainer.config import env_kwargs
from freshper.trainer.engines.base import Sampling
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.model.load import load_policy
from freshper.trainer.train.rollout import rollout

GREEDY = Sampling(0.0, 1.0, 0)


def tiny_frozenlake():
    """(cfg, model, tokenizer): the tiny model for FrozenLake, 2 layers, up to 4 turns."""
    cfg = config.load("tiny", None, {"train.sft_steps": 0, "model.tiny_layers": 2, "env.max_turns": 4,
                                     "rollout.max_len": 900})
    torch.manual_seed(0)
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    return cfg, model, tok


def play(cfg, model, tok, engine: dict, dtype=torch.float32):
    """Six episodes in three groups of two, with HFEngine(model, tok, **engine) in `dtype`; prompts
    of different lengths, so rows' caches differ. The model is left in float32."""
    gen = HFEngine(model.to(dtype), tok, **engine)
    ep = rollout(gen, tok, "frozenlake", env_kwargs(cfg), [11, 12, 13], 2, 10, cfg.rollout.max_len, GREEDY)
    model.float()
    assert gen.turns is None or len(gen.turns) == 0, "every episode's cache is released at its end"
    return ep


def agree(cfg, model, tok, ours: dict, ref: dict) -> tuple[bool, str]:
    """Whether the set-up `ours` agrees with `ref` (HFEngine keyword arguments); and why not."""
    mine, want, want64 = play(cfg, model, tok, ours), play(cfg, model, tok, ref), play(cfg, model, tok, ref,
                                                                                        torch.float64)
    assert int(want.turns.min()) >= 3, "the test needs episodes of several turns"
    if not torch.equal(mine.tokens, want.tokens):
        return False, "the replies differ"
    m = want.mask
    err = (mine.engine_logp[m].double() - want.engine_logp[m].double()).abs().max().item()
    base = (want.engine_logp[m].double() - want64.engine_logp[m].double()).abs().max().item()
    return err <= 4 * base + 1e-9, f"{ours} against {ref}: {err:.3g}, float32's own error {base:.3g}"

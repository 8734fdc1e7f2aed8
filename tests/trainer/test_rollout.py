"""Rollout bookkeeping on the tiny model: masks, tokens and log-probs line up."""
import torch

from freshper.trainer import config
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.loop import _rows
from freshper.trainer.model import env_kwargs, load_policy
from freshper.trainer.policy import Policy, row_lengths
from freshper.trainer.rollout import rollout


def setup(preset="tiny", **over):
    cfg = config.load(preset, None, {"train.sft_steps": 0, **over})
    torch.manual_seed(0)
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    return cfg, model, tok


def test_masks_and_logprobs_line_up_with_generated_tokens():
    cfg, model, tok = setup()
    engine = HFEngine(model, tok)
    traj = rollout(engine, tok, "frozenlake", env_kwargs(cfg), [11, 12], 2, cfg.rollout.max_new_tokens,
                   cfg.rollout.max_len, 1.0)
    E, T, L = traj.tokens.shape
    assert (E, T) == (4, cfg.env.max_turns)
    assert traj.env_steps == int(traj.turns.sum())
    assert traj.gen_tokens == int(traj.mask.sum())
    for e in range(E):
        for k in range(T):
            m = traj.mask[e, k]
            assert m.any() == (k < traj.turns[e])
            if not m.any():
                assert (traj.tokens[e, k] == tok.pad_token_id).all()
                continue
            idx = m.nonzero().squeeze(1)
            assert (idx.diff() == 1).all(), "a response is one contiguous span"
            start, end = int(idx[0]), int(idx[-1]) + 1
            assert (traj.tokens[e, k, end:] == tok.pad_token_id).all()
            assert (traj.tokens[e, k, :start] != tok.pad_token_id).all()
            assert (traj.engine_logp[e, k][~m] == 0).all() and (traj.engine_logp[e, k][m] < 0).all()
    # the episodes of one group start from the same state
    assert torch.equal(traj.tokens[0, 0, :20], traj.tokens[1, 0, :20])
    policy = Policy(model, cfg, torch.device("cpu"))
    tokens, mask, elogp = _rows(traj.tokens, traj.mask, traj.engine_logp)
    recomputed = policy.logprobs(tokens, mask)
    # kv-cached sampling vs one full forward: float32 rounding only
    torch.testing.assert_close(recomputed[mask], elogp[mask], atol=1e-4, rtol=1e-4)
    assert (recomputed[~mask] == 0).all()
    assert (row_lengths(mask) == torch.tensor([int(m.nonzero().max()) + 1 for m in mask])).all()


def test_rollout_is_seeded():
    cfg, model, tok = setup()
    engine = HFEngine(model, tok)
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        runs.append(rollout(engine, tok, "sokoban", {"max_turns": 2, "size": 6, "boxes": 1}, [5], 2,
                            cfg.rollout.max_new_tokens, 600, 1.0))
    assert torch.equal(runs[0].tokens, runs[1].tokens) and torch.equal(runs[0].reward, runs[1].reward)


def test_max_len_too_small_is_a_clear_error():
    cfg, model, tok = setup()
    import pytest

    with pytest.raises(ValueError, match="rollout.max_len"):
        rollout(HFEngine(model, tok), tok, "frozenlake", env_kwargs(cfg), [1], 1, 8, 20, 1.0)

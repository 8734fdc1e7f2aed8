"""Rollout bookkeeping on the tiny model: one chat per episode; masks, tokens and log-probs line up."""
import pytest
import torch

from freshper.trainer import config
from freshper.trainer.config import env_kwargs
from freshper.trainer.engines.base import Sampling
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.envs.prompts import game_feedback, game_opening
from freshper.trainer.model.chat import Episode
from freshper.trainer.model.load import load_policy
from freshper.trainer.model.policy import Policy, row_lengths
from freshper.trainer.train.rollout import rollout

RESULT_ONLY = "tests.trainer.train.result_only_env:ResultOnly"  # its StepResult says done; it never sets .done
FULL = Sampling(1.0, 1.0, 0)  # the untruncated distribution: engine and trainer log-probs agree


def setup(preset="tiny", **over):
    cfg = config.load(preset, None, {"train.sft_steps": 0, **over})
    torch.manual_seed(0)
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    return cfg, model, tok


def test_one_chat_per_episode_with_masks_and_logprobs_in_line():
    cfg, model, tok = setup()
    engine = HFEngine(model, tok)
    ep = rollout(engine, tok, "frozenlake", env_kwargs(cfg), [11, 12], 2, cfg.rollout.max_new_tokens,
                 cfg.rollout.max_len, FULL)
    E, L = ep.tokens.shape
    assert (E, L) == (4, cfg.rollout.max_len)
    assert ep.env_steps == int(ep.turns.sum()) and ep.gen_tokens == int(ep.mask.sum())
    for e in range(E):
        m = ep.mask[e]
        n = int(row_lengths(m[None])[0])
        assert (ep.tokens[e, n:] == tok.pad_token_id).all()
        # one contiguous span of assistant tokens per turn taken
        starts = int((m[1:] & ~m[:-1]).sum()) + int(m[0])
        assert starts == int(ep.turns[e])
        assert (ep.engine_logp[e][~m] == 0).all() and (ep.engine_logp[e][m] < 0).all()
        text = tok.decode(ep.tokens[e, :n])
        assert text.startswith("<|im_start|>system\nYou're a helpful assistant.")
        assert "Turn 0:\nState:" in text and "You are solving the FrozenLake puzzle" in text
        if ep.turns[e] > 1:
            assert "Reward:\n" in text and "Turn 1:\nState:" in text
    first = [tok.decode(ep.tokens[e][~ep.mask[e]][:200]) for e in range(2)]
    assert first[0] == first[1], "the episodes of one group start from the same state"
    policy = Policy(model, cfg, torch.device("cpu"))
    recomputed = policy.logprobs(ep.tokens, ep.mask)
    # kv-cached sampling vs one full forward over the whole chat: float32 rounding only
    torch.testing.assert_close(recomputed[ep.mask], ep.engine_logp[ep.mask], atol=1e-4, rtol=1e-4)
    assert (recomputed[~ep.mask] == 0).all()
    assert (ep.score == ep.reward + ep.penalty).all() and (ep.penalty <= 0).all()


def test_episode_tokens_are_the_generated_ones_and_the_template_only_appends():
    cfg, model, tok = setup()
    ep = Episode(tok, game_opening("Rules.", "P_\n_G", 3, 8))
    reply = tok("<answer>Right</answer>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    n = len(ep)
    assert ep.add_reply(reply, [-0.5] * len(reply)) == "<answer>Right</answer>"
    assert ep.ids[n:] == reply and ep.mask[n:] == [True] * len(reply)
    assert ep.add_user(game_feedback(-0.1, 1, "_P\n_G", 2, 8))
    assert ep.ids[:n + len(reply)] == ep.ids[:n] + reply
    full = tok.apply_chat_template(ep.messages, tokenize=False, add_generation_prompt=True)
    assert tok.decode(ep.ids) == full and "Reward:\n-0.1\nTurn 1:" in full
    ep.add_reply(reply, [])
    before = list(ep.ids)
    assert not ep.add_user("x " * 50, limit=len(ep) + 5) and ep.messages[-1]["role"] == "assistant"
    assert ep.ids == before, "a refused message leaves the episode as it was"
    with pytest.raises(ValueError, match="log-probs"):
        ep.add_reply([1, 2], [0.0])


def test_rollout_is_seeded_and_top_k_logprobs_are_the_sampling_distributions():
    cfg, model, tok = setup()
    engine = HFEngine(model, tok)
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        runs.append(rollout(engine, tok, "sokoban", {"max_turns": 2, "size": 6, "boxes": 1}, [5], 2,
                            cfg.rollout.max_new_tokens, 900, Sampling(1.0, 1.0, 2)))
    assert torch.equal(runs[0].tokens, runs[1].tokens) and torch.equal(runs[0].reward, runs[1].reward)
    # top-k 2: each sampled token had probability >= 1/2 under the processed distribution of the top 2
    lp = runs[0].engine_logp[runs[0].mask]
    assert (lp >= torch.log(torch.tensor(0.5)) - 1e-5).sum() >= len(lp) / 2


def test_a_full_context_ends_the_episode_and_never_cuts_tokens():
    cfg, model, tok = setup()
    engine = HFEngine(model, tok)
    probe = rollout(engine, tok, "frozenlake", env_kwargs(cfg), [1], 1, 8, 640, FULL)
    first = int(row_lengths(probe.mask)[0]) - int(probe.mask[0].sum()) // max(int(probe.turns[0]), 1)
    small = first + 8 + 20  # room for the first turn only
    ep = rollout(engine, tok, "frozenlake", {**env_kwargs(cfg), "max_turns": 10}, [1, 2], 1, 8, small, FULL)
    ended = ep.context_ended
    assert ended.any() and (ep.turns[ended] >= 1).all()
    assert (row_lengths(ep.mask) <= small).all()
    with pytest.raises(ValueError, match="rollout.max_len"):
        rollout(engine, tok, "frozenlake", env_kwargs(cfg), [1], 1, 8, 20, FULL)


def test_the_rollout_reads_reward_penalty_and_done_from_the_step_result():
    """Issue 77's surviving mutants: a rollout that ignored the StepResult's penalty, or its done."""
    cfg, model, tok = setup()
    ep = rollout(HFEngine(model, tok), tok, RESULT_ONLY, env_kwargs(cfg), [5, 6], 2, cfg.rollout.max_new_tokens,
                 cfg.rollout.max_len, FULL)
    assert ep.turns.tolist() == [2] * 4 and ep.env_steps == 8, "the StepResult's done ends the episode"
    assert not ep.context_ended.any() and ep.success.all()
    torch.testing.assert_close(ep.reward, torch.full((4,), 0.5))
    torch.testing.assert_close(ep.penalty, torch.full((4,), -0.6))
    torch.testing.assert_close(ep.score, torch.full((4,), -0.1))


def check_stop_strings(engine, tok, prompts):
    """A reply ends at the token that completes a stop string, even one spanning tokens: replies
    sampled with `stop` are the replies sampled (same seed) without it, cut there (log-probs
    too), in a batch where other rows run on. Shared by the hf and vllm engine tests."""
    from freshper.trainer.engines.base import cut_at_stop

    torch.manual_seed(3)
    free = engine.generate(prompts, 12, FULL)
    ids0 = free.token_ids[0]
    assert len(ids0) >= 6, "the untrained model's reply should run on"
    stop = tok.decode(ids0[3:5], skip_special_tokens=False)
    torch.manual_seed(3)
    cut = engine.generate(prompts, 12, FULL, (stop,))
    cuts = [cut_at_stop(tok, ids, (stop,)) for ids in free.token_ids]
    assert cuts[0] <= 5 and max(len(i) for i in free.token_ids) > cuts[0], "row 0 stops while another runs on"
    for ids, lp, got, got_lp, n in zip(free.token_ids, free.logprobs, cut.token_ids, cut.logprobs, cuts):
        assert got == ids[:n]
        assert stop in tok.decode(got, skip_special_tokens=False) or n == len(ids)
        torch.testing.assert_close(torch.tensor(got_lp), torch.tensor(lp[:n]), atol=1e-5, rtol=0)


def test_hf_replies_end_at_stop_strings():
    cfg, model, tok = setup()
    env = __import__("freshper.trainer.envs", fromlist=["make_env"]).make_env("frozenlake", **env_kwargs(cfg))
    prompts = [Episode(tok, env.opening(env.reset(s), 8)).ids for s in range(3)]
    check_stop_strings(HFEngine(model, tok), tok, prompts)


def test_cut_at_stop_finds_strings_across_tokens():
    from freshper.trainer.engines.base import cut_at_stop

    class Chars:  # a tokenizer whose tokens are characters
        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(i) for i in ids)

    ids = [ord(c) for c in "ab</sea" + "rch>cd"]
    assert cut_at_stop(Chars(), ids, ("</search>",)) == len("ab</search>")
    assert cut_at_stop(Chars(), ids, ("zz",)) == len(ids) and cut_at_stop(Chars(), ids, ()) == len(ids)
    assert cut_at_stop(Chars(), ids, ("zz", "b<")) == 3, "the first occurrence of any"


def test_every_episodes_first_prompt_must_fit_not_only_the_first_ones():
    """Initial states' prompts differ in length. With a rollout.max_len that holds episode 0's
    first turn but not another's prompt and its reply, that reply used to run past its row:
    "The expanded size of the tensor (235) must match the existing size (237)" (seen once in a
    generation worker's first batch). Refused in one line naming the option instead."""
    from freshper.trainer.envs import make_env

    cfg, model, tok = setup()
    name, n = "tests.trainer.train.uneven_prompt_env:UnevenLake", cfg.rollout.max_new_tokens
    lengths = []
    for seed in (2, 3):
        env = make_env(name, **env_kwargs(cfg))
        lengths.append(len(Episode(tok, env.opening(env.reset(seed), n))))
    short, long = lengths
    assert short + n <= long, "the odd state's prompt alone is longer than the even one's first turn"
    with pytest.raises(ValueError, match=f"rollout.max_len={long} cannot hold even the first turn of the episode "
                                         f"from initial state 3: its prompt has {long} tokens"):
        rollout(HFEngine(model, tok), tok, name, env_kwargs(cfg), [2, 3], 2, n, long, FULL)

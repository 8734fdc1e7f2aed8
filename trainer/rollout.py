"""Roll out a batch of multi-turn episodes: engine.generate <-> env.step, with token bookkeeping.

A trajectory is up to `max_turns` rows; row k holds turn k's prompt followed by the response,
right-padded to `max_len`. `mask[k, i]` marks response tokens (the ones the loss trains), and
`engine_logp[k, i]` is the engine's log-prob of token i. Episodes of one group share an initial
state (seed), for GRPO.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .envs import make_env


@dataclass
class Trajectories:
    tokens: torch.Tensor  # (E, turns, L) int64, pad-filled
    mask: torch.Tensor  # (E, turns, L) bool, response tokens
    engine_logp: torch.Tensor  # (E, turns, L) float32, 0 outside responses
    turns: torch.Tensor  # (E,) int64, turns taken
    reward: torch.Tensor  # (E,) float32, episode reward (sum over turns)
    success: torch.Tensor  # (E,) bool
    valid_frac: torch.Tensor  # (E,) float32, share of turns with a parseable action
    group: torch.Tensor  # (E,) int64, episodes with the same initial state
    env_steps: int  # env.step calls in this batch
    gen_tokens: int  # response tokens generated

    def __len__(self):
        return self.tokens.shape[0]


def rollout(engine, tokenizer, env_name: str, env_kwargs: dict, seeds: list[int], group_size: int,
            max_new_tokens: int, max_len: int, temperature: float, nvtx=None) -> Trajectories:
    """Play len(seeds) * group_size episodes to the end; seeds[g] is group g's initial state."""
    envs = [make_env(env_name, **env_kwargs) for _ in range(len(seeds) * group_size)]
    for i, env in enumerate(envs):
        env.reset(seeds[i // group_size])
    E, T = len(envs), envs[0].max_turns
    pad = tokenizer.pad_token_id
    tokens = torch.full((E, T, max_len), pad, dtype=torch.long)
    mask = torch.zeros((E, T, max_len), dtype=torch.bool)
    elogp = torch.zeros((E, T, max_len), dtype=torch.float32)
    turns = torch.zeros(E, dtype=torch.long)
    valid = torch.zeros(E, dtype=torch.float32)
    steps = gen_tokens = 0
    for turn in range(T):
        active = [i for i, env in enumerate(envs) if not env.done]
        if not active:
            break
        prompts = [tokenizer(envs[i].prompt(), add_special_tokens=False)["input_ids"] for i in active]
        longest = max(len(p) for p in prompts)
        if longest + max_new_tokens > max_len:
            raise ValueError(f"rollout.max_len={max_len} is too small: a prompt has {longest} tokens and "
                             f"responses up to {max_new_tokens}; "
                             f"raise rollout.max_len to >= {longest + max_new_tokens}")
        with nvtx.range("generate") if nvtx else _null():
            gen = engine.generate(prompts, max_new_tokens, temperature)
        with nvtx.range("env_step") if nvtx else _null():
            for j, i in enumerate(active):
                p, r, lp = prompts[j], gen.token_ids[j], gen.logprobs[j]
                n = len(p)
                tokens[i, turn, :n] = torch.tensor(p)
                tokens[i, turn, n:n + len(r)] = torch.tensor(r, dtype=torch.long)
                mask[i, turn, n:n + len(r)] = True
                elogp[i, turn, n:n + len(r)] = torch.tensor(lp, dtype=torch.float32)
                result = envs[i].step(tokenizer.decode(r, skip_special_tokens=False))
                turns[i] += 1
                valid[i] += result.valid
                gen_tokens += len(r)
        steps += len(active)
    reward = torch.tensor([env.total_reward for env in envs], dtype=torch.float32)
    success = torch.tensor([env.solved() for env in envs], dtype=torch.bool)
    group = torch.arange(E) // group_size
    return Trajectories(tokens, mask, elogp, turns, reward, success, valid / turns.clamp_min(1), group, steps,
                        gen_tokens)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

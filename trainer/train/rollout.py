"""Roll out a batch of multi-turn episodes as chats: engine.generate <-> env.step.

Each episode is one token sequence (trainer/model/chat.py): `tokens[e]` right-padded to `max_len`,
`mask[e]` marks the assistant's tokens (the ones the loss trains), `engine_logp[e]` the engine's
log-prob of each of them. An episode whose next turn (the user's message and a full reply of
`max_new_tokens`) would not fit in `max_len` ends after its last reply and is counted in
`context_ended`: nothing is ever cut from a sequence the loss trains on. Episodes of one group share an initial
state (seed), for GRPO.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, fields

import torch

from ..engines.base import Sampling
from ..envs import make_env
from ..envs.base import checked_step
from ..model.chat import Episode


@dataclass
class Episodes:
    tokens: torch.Tensor  # (E, L) int64, pad-filled
    mask: torch.Tensor  # (E, L) bool, assistant tokens
    engine_logp: torch.Tensor  # (E, L) float32, 0 outside assistant tokens
    turns: torch.Tensor  # (E,) int64, actions taken
    reward: torch.Tensor  # (E,) float32, environment reward summed over turns (format penalty excluded)
    penalty: torch.Tensor  # (E,) float32, format penalties summed over turns (<= 0)
    success: torch.Tensor  # (E,) bool
    valid_frac: torch.Tensor  # (E,) float32, share of turns with a parseable action
    group: torch.Tensor  # (E,) int64, episodes with the same initial state
    context_ended: torch.Tensor  # (E,) bool, ended because the context was full
    env_steps: int  # env.step calls in this batch
    gen_tokens: int  # assistant tokens generated
    extra: dict = field(default_factory=dict)  # env-specific per-episode means (env.metrics(), e.g. searches)
    pngs: list | None = None  # a VLM's episodes: per episode its images as PNG bytes, in placeholder order
    vision: object = None  # trainer.vision.VisionRows of those images (processed once, for the updates)

    @property
    def score(self) -> torch.Tensor:
        """(E,) the training return: environment reward plus format penalties."""
        return self.reward + self.penalty

    def __len__(self):
        return self.tokens.shape[0]

    def state(self) -> dict:
        """Tensors and plain values only (a checkpoint loads it with weights_only=True)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "vision"}
        v = self.vision
        out["vision"] = None if v is None else {"pixels": v.pixels, "grids": v.grids,
                                                "image_token_id": v.image_token_id}
        return out

    @classmethod
    def from_state(cls, s: dict) -> "Episodes":
        s = dict(s)
        if s["vision"] is not None:
            from ..model.vision import VisionRows

            s["vision"] = VisionRows(**s["vision"])
        return cls(**s)


def rollout(engine, tokenizer, env_name: str, env_kwargs: dict, seeds: list[int], group_size: int,
            max_new_tokens: int, max_len: int, sampling: Sampling, phase=None, processor=None) -> Episodes:
    """Play len(seeds) * group_size episodes to the end; seeds[g] is group g's initial state.
    `phase(name)`, if given, wraps generation and env steps (timing and trace ranges).
    `processor`: a VLM's image processor, needed by environments that show images."""
    phase = phase or (lambda name: nullcontext())
    envs = [make_env(env_name, **env_kwargs) for _ in range(len(seeds) * group_size)]
    vision, stop = envs[0].vision, envs[0].stop_strings
    if vision and processor is None:
        raise ValueError(f"env.name={env_name!r} shows images: it needs a vision-language model (one with an image "
                         "processor, e.g. Qwen2.5-VL); model.path names a text-only model")
    eps = []
    for i, env in enumerate(envs):
        state = env.reset(seeds[i // group_size])
        eps.append(Episode(tokenizer, env.opening(state, max_new_tokens), env.images(),
                           processor if vision else None))
    E = len(envs)
    # Every episode's, not the first's: initial states' prompts differ in length, and a reply past
    # max_len would not fit its row below ("the expanded size of the tensor (235) must match...").
    longest = max(range(E), key=lambda i: len(eps[i]))
    if len(eps[longest]) + max_new_tokens > max_len:
        raise ValueError(f"rollout.max_len={max_len} cannot hold even the first turn of the episode from initial state "
                         f"{seeds[longest // group_size]}: its prompt has {len(eps[longest])} tokens and a reply up to "
                         f"{max_new_tokens}; raise rollout.max_len to at least {len(eps[longest]) + max_new_tokens}")
    ended = torch.zeros(E, dtype=torch.bool)
    valid = torch.zeros(E, dtype=torch.float32)
    # what each episode earned, summed from the StepResults its env returned (the one source)
    reward, penalty = torch.zeros(E, dtype=torch.float32), torch.zeros(E, dtype=torch.float32)
    success = torch.zeros(E, dtype=torch.bool)
    done = [False] * E  # an episode ends where its StepResult says so, or where its context is full
    steps = gen_tokens = 0
    try:
        while True:
            active = [i for i in range(E) if not done[i]]
            if not active:
                break
            with phase("generate"):  # each episode is its own key: the engine may keep its cache for the next turn
                if vision:
                    ins = [eps[i].vision_inputs() for i in active]
                    gen = engine.generate([v.input_ids for v in ins], max_new_tokens, sampling, stop, images=ins)
                else:
                    gen = engine.generate([eps[i].ids for i in active], max_new_tokens, sampling, stop,
                                          keys=[eps[i] for i in active])
            with phase("env_step"):
                texts = [eps[i].add_reply(gen.token_ids[j], gen.logprobs[j]) for j, i in enumerate(active)]
                score_batch = getattr(type(envs[0]), "score_batch", None)
                if score_batch is not None:  # a scorer that takes the batch in one call (env.reward, TRL's form)
                    score_batch([envs[i] for i in active], texts)
                for j, i in enumerate(active):
                    result = checked_step(envs[i], texts[j])
                    valid[i] += result.valid
                    reward[i] += result.reward
                    penalty[i] += result.penalty
                    success[i] = bool(result.success)
                    done[i] = bool(result.done)  # the StepResult, not the env's own .done
                    gen_tokens += len(gen.token_ids[j])
                    if not result.done and not eps[i].add_user(envs[i].feedback(result, max_new_tokens),
                                                               limit=max_len - max_new_tokens,
                                                               images=envs[i].images() if vision else ()):
                        done[i] = ended[i] = True
                    if done[i]:
                        engine.release([eps[i]])
            steps += len(active)
    finally:  # an error mid-rollout leaves no episode's cache behind
        engine.release(eps)
    pad = tokenizer.pad_token_id
    tokens = torch.full((E, max_len), pad, dtype=torch.long)
    mask = torch.zeros((E, max_len), dtype=torch.bool)
    elogp = torch.zeros((E, max_len), dtype=torch.float32)
    for i, ep in enumerate(eps):
        n = len(ep)
        tokens[i, :n] = torch.tensor(ep.ids)
        mask[i, :n] = torch.tensor(ep.mask)
        elogp[i, :n] = torch.tensor(ep.logp)
    turns = torch.tensor([env.turn for env in envs], dtype=torch.long)
    per_env = [env.metrics() for env in envs if hasattr(env, "metrics")]
    extra = {k: sum(m[k] for m in per_env) / len(per_env) for k in per_env[0]} if per_env else {}
    pngs = rows = None
    if vision:
        from ..model.vision import VisionRows

        pngs = [ep.pngs for ep in eps]
        rows = VisionRows.of([ep.vision_inputs() for ep in eps])
        extra["image_bytes"] = sum(len(b) for ep_pngs in pngs for b in ep_pngs) / E  # PNG bytes per episode
    return Episodes(tokens, mask, elogp, turns,
                    reward, penalty, success,
                    valid / turns.clamp_min(1), torch.arange(E) // group_size, ended, steps, gen_tokens, extra,
                    pngs, rows)

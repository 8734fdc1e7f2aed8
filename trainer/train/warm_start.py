"""The format warm start: supervised steps on whole episodes whose replies are uniformly random
actions in the answer format, so a model that cannot write the format starts RL able to; it
teaches the format, not the task. With train.sft_replies solver the replies are a solver's moves
instead, and the warm start teaches a strategy too.

Its weights are cached (train.sft_cache), keyed on everything they depend on: the model folder
and model.init (the folder's weights, or random ones drawn under train.seed), the environment
section, the steps, learning rate, seed, reply and context lengths, micro-batch, the perception
warm start before it, LoRA settings and dtype. Every arm of a comparison on one
seed starts from the same warm-started weights, so the cache computes them once per seed (about
12 minutes for SmolLM2 on the Sokoban preset, one thread) instead of once per run.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from pathlib import Path

import torch

from ..envs.base import checked_step

log = logging.getLogger("freshper")


def supervised_step(model, opt, rows: list[tuple[list[int], list[int]]], pad_id: int, vision=None,
                    micro_batch: int = 0) -> float:
    """One optimizer step of next-token cross-entropy on token rows, each (ids, labels) with
    labels -100 where no loss is taken, right-padded into one batch; returns the loss (nats per
    loss token). The LM head runs only at the loss tokens (a game episode's replies are a few
    percent of its tokens: full logits of 16 SmolLM2 episodes would be gigabytes), in
    micro-batches of `micro_batch` rows (0: all) whose gradients sum to the whole batch's.
    `vision`: a VLM's trainer.vision.VisionRows of these rows."""
    from ..model.sharding import PolicyNet

    device = next(model.parameters()).device
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    for r, (x, y) in enumerate(rows):
        ids[r, :len(x)], labels[r, :len(y)] = torch.tensor(x), torch.tensor(y)
    ids, labels = ids.to(device), labels.to(device)
    lengths = torch.tensor([len(x) for x, _ in rows], device=device)
    total = int((labels[:, 1:] != -100).sum())
    net = PolicyNet(model)
    mb = micro_batch or len(rows)
    opt.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for i in range(0, len(rows), mb):
        sl = slice(i, i + mb)
        target = labels[sl, 1:]

        def ce(hidden, head, target=target):
            keep = target != -100
            dt = torch.promote_types(hidden.dtype, torch.float32)  # bf16 runs: the softmax in float32
            logits = hidden[keep].to(dt) @ head.to(dt).T
            return torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum")

        extra = vision.kwargs(sl, ids[sl]) if vision is not None else {}
        loss = net(ids[sl], lengths[sl], ce, **extra)
        (loss / total).backward()
        loss_sum += float(loss.detach())
    opt.step()
    return loss_sum / total


def warm_start(model, tokenizer, make_env, steps: int, lr: float, seed: int, max_words: int, max_len: int,
               batch: int = 16, processor=None, micro_batch: int = 0, replies: str = "random") -> list[float]:
    """Supervised steps on whole episodes (chats, as the rollout builds them, in the model's own
    chat template) of `batch` episodes each. A random-initialised model cannot emit the answer
    format at all, and SmolLM2 does not follow it on the games. `replies`: "random", uniformly
    random actions in the answer format, which teach the format only, not the task; "solver",
    the environment's solver's moves (env.solver_reply), which teach a strategy too. `processor`:
    a VLM's image processor, for environments that show images. `micro_batch`: rows per forward."""
    if steps == 0:
        return []
    from ..model.chat import Episode

    rng = random.Random(seed + 7919)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    env = make_env()
    choose = {"random": env.random_reply, "solver": env.solver_reply}[replies]
    proc = processor if env.vision else None
    losses = []
    for _ in range(steps):
        rows = []
        for _ in range(batch):
            ep = Episode(tokenizer, env.opening(env.reset(rng.randrange(2**31)), max_words), env.images(), proc)
            while True:  # until the StepResult says done (the one source) or the context is full
                reply = tokenizer(choose(rng), add_special_tokens=False)
                r = checked_step(env, ep.add_reply(reply["input_ids"] + [tokenizer.eos_token_id], []))
                if r.done or not ep.add_user(env.feedback(r, max_words), limit=max_len - max_words,
                                             images=env.images() if proc else ()):
                    break
            rows.append(ep)
        vision = None
        if proc is not None:
            from ..model.vision import VisionRows

            vision = VisionRows.of([ep.vision_inputs() for ep in rows])
        tokens = [(ep.ids, [t if m else -100 for t, m in zip(ep.ids, ep.mask)]) for ep in rows]
        losses.append(supervised_step(model, opt, tokens, tokenizer.pad_token_id, vision, micro_batch))
    return losses


def settings(cfg, model, steps: int) -> dict:
    """What a format warm start of `steps` steps on `model` depends on, besides the model folder:
    the weights it starts from (model.init, and for random weights the seed they are drawn under:
    the folder's files do not tell a random-init run from a pretrained one), the environment
    section (and a user environment's class), its replies, optimizer settings, seed, reply and
    context lengths, micro-batch, the perception warm start before it, LoRA, dtype."""
    from ..config import warm_start_seed
    from ..envs import env_class
    from ..model.lora import has_lora, lora_metadata
    from ..model.precision import compute_dtype

    cls, t, r = env_class(cfg.env.name), cfg.train, cfg.rollout
    init = {"init": cfg.model.init, **({"init_seed": cfg.train.seed} if cfg.model.init == "random" else {})}
    return {**init, "env": cfg.to_dict()["env"], "env_class": f"{cls.__module__}.{cls.__qualname__}", "steps": steps,
            "lr": t.sft_lr, "replies": t.sft_replies, "seed": warm_start_seed(cfg),
            "max_words": r.max_new_tokens, "max_len": r.max_len,
            "micro_batch": cfg.algo.micro_batch, "dtype": str(model.dtype),
            "perception": [t.perception_steps, t.perception_lr] if t.perception_steps else None,
            "lora": lora_metadata(model) if has_lora(model) else None,
            # float32 masters with low-precision compute (trainer/model/precision.py); absent for float32
            **({"compute": str(compute_dtype(model))} if compute_dtype(model) is not None else {})}


def folder_id(model_dir: str) -> list:
    """The model folder as a cache key: its resolved path and each weight file's name, size and
    modification time, so a folder retrained in place (or another of the same name) is not
    taken for the cached one."""
    p = Path(model_dir).resolve()
    files = sorted([*p.glob("*.safetensors"), *p.glob("*.bin")])
    return [str(p), *[[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]]


def cache_path(model_dir: str, settings: dict) -> Path:
    """Where the format warm start of `settings` (settings()) on the model in `model_dir` is
    cached."""
    from ..model.pretrained import cache_dir

    key = json.dumps({"model": folder_id(model_dir), **settings, "v": 1}, sort_keys=True, default=str)
    return cache_dir() / "warm-start" / (hashlib.sha1(key.encode()).hexdigest()[:12] + ".safetensors")


def cached_warm_start(path: Path | None, model, run) -> tuple[list[float], bool]:
    """`run()` (a warm start returning its losses) with its weights kept at `path`: loaded when
    there (strict: a file of other tensors fails), else computed and written atomically with the
    losses in the file's metadata. None: no cache. Returns (losses, whether they were loaded)."""
    from safetensors import safe_open
    from safetensors.torch import load_model, save_model

    if path is not None and path.exists():
        load_model(model, str(path))
        with safe_open(str(path), "pt") as f:
            return json.loads(f.metadata()["losses"]), True
    losses = run()
    if path is not None and losses:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # ranks or runs writing at once
        save_model(model, str(tmp), metadata={"losses": json.dumps(losses)})
        tmp.replace(path)
    return losses, False

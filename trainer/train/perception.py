"""A perception warm start for the game presets: supervised steps on questions about the game's
own observations, so a tiny model starts able to read the board, as an instruct model does.

The questions are about one state each and never show an action choice, a reward or an episode
outcome: "Where is the player?" (row, column), "What is at row 2, column 3?", "What is left of the
player?" (a symbol, or "edge"), and for Sokoban "How many boxes are not on a target?". Answers are
computed from the rendered state. It teaches reading, not playing; the states come from seeds
apart from training's and validation's, walked a few random steps so the player is not always at
its start.

The result is cached like the tiny model, keyed by the tiny model's folder and these settings, so
every arm and seed of a comparison starts from identical weights (`cache_dir()/perception/`).
`probe_accuracy` measures reading on held-out states (greedy answers).
"""
from __future__ import annotations

import hashlib
import json
import logging
import random
from pathlib import Path

import torch

from ..envs.prompts import SYSTEM
from ..model.precision import autocast, compute_dtype

log = logging.getLogger("freshper")
PLAYER = {"frozenlake": "PX√", "sokoban": "PS"}  # symbols that mark the player's cell
SEED_BASE = 1_500_000_000  # probe states: seeds no training group (< 2^31 - 1, hashed) is likely to reuse
HELD_OUT_BASE = 1_900_000_000
DIRECTIONS = {"left of": (0, -1), "right of": (0, 1), "above": (-1, 0), "below": (1, 0)}


def probes(env_name: str, grid: str, rng: random.Random) -> list[tuple[str, str]]:
    """(question, answer) pairs about one rendered state; rows and columns count from 1."""
    rows = [row.replace(" ", "") for row in grid.split("\n")]  # env.grid spaced: the spaces are not squares
    cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    player = next((rc for rc, ch in cells.items() if ch in PLAYER[env_name]), None)
    out = []
    r, c = rng.choice(sorted(cells))
    out.append((f"What is at row {r + 1}, column {c + 1}?", cells[(r, c)]))
    if player is not None:
        out.append(("Where is the player?", f"row {player[0] + 1}, column {player[1] + 1}"))
        word = rng.choice(sorted(DIRECTIONS))
        dr, dc = DIRECTIONS[word]
        out.append((f"What is {word} the player?", cells.get((player[0] + dr, player[1] + dc), "edge")))
    if env_name == "sokoban":
        out.append(("How many boxes are not on a target?", str(grid.count("X"))))
    return out


def probe_chat(env, grid: str, question: str) -> list[dict]:
    """The probe in the game's chat format: its system message, the rules, the state, a question."""
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{env.instruction}\nState:\n{grid}\nQuestion: {question}\n"
                                        f"Answer inside <answer> </answer>."}]


def _state(env, seed: int, rng: random.Random) -> str:
    env.reset(seed)
    for _ in range(rng.randrange(4)):  # a few random moves: the player is not always at its start
        if env.done:
            break
        env.step(env.random_reply(rng))
    return env.render()


def examples(env, seed_base: int, n: int, rng: random.Random) -> list[tuple[list[dict], str]]:
    out = []
    while len(out) < n:
        grid = _state(env, seed_base + len(out), rng)
        for q, a in probes(env.name, grid, rng):
            out.append((probe_chat(env, grid, q), a))
    return out[:n]


def cache_path(model_dir: str, steps: int, lr: float, seed: int, lora: dict | None = None,
               compute: str | None = None) -> Path:
    """Where the warm-started weights of these settings are cached; `lora`: the adapters' settings
    (lora.lora_metadata) of a LoRA model, whose warm start trains and saves other tensors;
    `compute`: the low-precision compute dtype over float32 masters (trainer/model/precision.py)."""
    from ..model.load import cache_dir

    key = json.dumps({"model": Path(model_dir).name, "steps": steps, "lr": lr, "seed": seed, "v": 1,
                      **({"lora": lora} if lora else {}), **({"compute": compute} if compute else {})},
                     sort_keys=True)
    return cache_dir() / "perception" / (hashlib.sha1(key.encode()).hexdigest()[:12] + ".safetensors")


def warm_start(model, tok, make_env, model_dir: str, steps: int, lr: float, seed: int, batch: int = 32) -> list[float]:
    """`steps` supervised steps on probe answers (cached); returns the losses ([] when loaded)."""
    from safetensors.torch import load_model, save_model

    from ..model.lora import has_lora, lora_metadata

    compute = compute_dtype(model)
    path = cache_path(model_dir, steps, lr, seed, lora_metadata(model) if has_lora(model) else None,
                      None if compute is None else str(compute))
    if path.exists():
        load_model(model, str(path))  # strict: a cache of other tensors fails here, not later
        log.info("perception warm start: loaded %s (cached; reading the board, not playing)", path)
        return []
    env, rng = make_env(), random.Random(seed + 104729)
    if env.name not in PLAYER:
        raise ValueError(f"train.perception_steps is for the games ({', '.join(PLAYER)}), not {env.name}")
    from .warm_start import supervised_step

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for step in range(steps):
        rows = examples(env, SEED_BASE + step * batch, batch, rng)
        tokens = []
        for chat, answer in rows:
            prompt = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            p = tok(prompt, add_special_tokens=False)["input_ids"]
            a = tok(f"<answer>{answer}</answer>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            tokens.append((p + a, [-100] * len(p) + a))
        losses.append(supervised_step(model, opt, tokens, tok.pad_token_id))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_model(model, str(tmp))
    tmp.replace(path)
    return losses


def kind(question: str) -> str:
    """The probe's type: cell, where (the player), neighbour, boxes."""
    if question.startswith("What is at row"):
        return "cell"
    if question.startswith("Where"):
        return "where"
    return "boxes" if question.startswith("How many") else "neighbour"


@torch.no_grad()
def probe_accuracy(model, tok, make_env, n: int = 64, seed: int = 0, by_kind: dict | None = None) -> float:
    """Share of held-out probe questions answered exactly (greedy, the answer inside the tags);
    `by_kind`, if given, collects {kind: [right, asked]}."""
    import re

    env, rng = make_env(), random.Random(seed + 7)
    rows = examples(env, HELD_OUT_BASE, n, rng)
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    right = 0
    for chat, answer in rows:
        prompt = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]], device=device)
        with autocast(model):
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                                 do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=False)
        m = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
        ok = m is not None and m.group(1).strip() == answer
        right += ok
        if by_kind is not None:
            k = by_kind.setdefault(kind(chat[1]["content"].split("Question: ")[1]), [0, 0])
            k[0], k[1] = k[0] + ok, k[1] + 1
    model.train(was)
    return right / len(rows)

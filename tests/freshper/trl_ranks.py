"""Run by tests/freshper/test_trl_distributed.py under torchrun (or as one process to resume):
FreshPERGRPOTrainer on the tiny model, then what each rank holds, as JSON in OUT/rank{r}.json.

    python trl_ranks.py MODEL_DIR OUT [resume]
"""
import json
import sys

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from freshper.integrations.trl import FreshPERGRPOConfig, FreshPERGRPOTrainer

path, out = sys.argv[1], sys.argv[2]
resume = len(sys.argv) > 3


def length_reward(completions, **kw):
    return [len(c) / 10.0 for c in completions]


torch.set_num_threads(1)
args = FreshPERGRPOConfig(output_dir=out, per_device_train_batch_size=4, num_generations=2, max_completion_length=8,
                          max_steps=3 if resume else 2, learning_rate=1e-3, logging_steps=1, report_to=[],
                          use_cpu=True, bf16=False, save_strategy="steps", save_steps=2, replay_updates=1,
                          replay_tau=10.0, replay_capacity=64, seed=0, lr_scheduler_type="constant")
ds = Dataset.from_list([{"prompt": f"What is {i} + {i + 1}?"} for i in range(16)])
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path)
tr = FreshPERGRPOTrainer(model=model, reward_funcs=length_reward, args=args, train_dataset=ds, processing_class=tok)
loaded = []
if resume:  # the buffer as the checkpoint left it, before the resumed steps add to it
    load = tr._load_optimizer_and_scheduler

    def _load(ck):
        load(ck)
        loaded.append(len(tr.replay_buffer))
    tr._load_optimizer_and_scheduler = _load
tr.train(resume_from_checkpoint=resume or None)
rank, world = tr.accelerator.process_index, tr.accelerator.num_processes
b = tr.replay_buffer
live = b._live.nonzero().squeeze(1)
prompts = sorted(tok.decode(b._fields["prompt_ids"][i][b._fields["prompt_mask"][i].bool()]) for i in live.tolist())
draws = []
for _ in range(3 if world > 1 else 0):
    ids, att, c1, batch, weight = tr._sharded_batch(4)
    draws.append([int(batch.counts.sum()), int(batch.counts[rank]), float(weight)])
checksum = float(sum(p.detach().double().sum() for p in tr.model.parameters()))
logged = [h for h in tr.state.log_history if "replay/loss" in h]
json.dump({"rank": rank, "world": world, "size": len(b), "prompts": prompts, "draws": draws, "checksum": checksum,
           "replay_logged": len(logged), "loaded": loaded}, open(f"{out}/rank{rank}.json", "w"))

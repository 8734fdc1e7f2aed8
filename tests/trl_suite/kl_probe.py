"""The case where replay diverged in tests/trl_suite/run.py, instrumented: TRL's test settings at
lr 0.1 (3 x 3 completions of 8 tokens, the stand-in tiny models), with or without the KL term;
at each replay step the largest ref - logp over the replayed tokens and the loss, and at the end
the largest weight. Run after run.py, whose work folder holds the stand-ins:

    python tests/trl_suite/kl_probe.py BETA SEED [--work /tmp/trl-suite]
"""
import argparse
import os

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("beta", type=float)
    ap.add_argument("seed", type=int)
    ap.add_argument("--work", default="/tmp/trl-suite")
    a = ap.parse_args()
    os.chdir(a.work)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import transformers.training_args as ta
    from datasets import load_dataset

    from freshper.integrations.trl import FreshPERGRPOConfig, FreshPERGRPOTrainer

    ta.is_torch_bf16_gpu_available = lambda *x, **k: True  # GRPOConfig's bf16 default, on the CPU
    ds = load_dataset("trl-internal-testing/zen", "standard_prompt_only", split="train")
    args = FreshPERGRPOConfig(output_dir=f"{a.work}/klprobe-{a.beta}-{a.seed}", beta=a.beta, learning_rate=0.1,
                              per_device_train_batch_size=3, num_generations=3, max_completion_length=8,
                              report_to="none", seed=a.seed, logging_steps=1)
    tr = FreshPERGRPOTrainer(model="trl-internal-testing/tiny-Qwen2ForCausalLM-2.5",
                             reward_funcs="trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5", args=args,
                             train_dataset=ds)
    replay_loss, steps = tr.replay_loss, []

    def spy(inputs, accumulate=1):
        loss, metrics = replay_loss(inputs, accumulate)
        gap = float("nan")
        if "ref_per_token_logps" in inputs:
            with torch.no_grad():
                ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
                att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
                logp = tr._get_per_token_logps_and_entropies(tr.model, ids, att, inputs["completion_ids"].size(1))[0]
            gap = float((inputs["ref_per_token_logps"] - logp)[inputs["completion_mask"].bool()].max())
        steps.append((gap, float(loss.detach())))
        return loss, metrics

    tr.replay_loss = spy
    try:
        tr.train()
        status = "trained"
    except RuntimeError as e:
        status = f"failed: {str(e)[:60]}"
    biggest = max(float(p.abs().max()) for p in tr.model.parameters())
    print(f"beta {a.beta} seed {a.seed}: {status}; {len(steps)} replay steps; max(ref - logp) per step "
          f"{[round(g, 1) for g, _ in steps]}; losses {[round(v, 2) for _, v in steps]}; "
          f"largest |weight| {biggest:.3g}")


if __name__ == "__main__":
    main()

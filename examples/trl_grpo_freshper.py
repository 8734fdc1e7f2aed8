"""GRPO with FreshPER replay in TRL: the one-class swap, on a toy arithmetic task.

    pip install -e ".[train,trl]"
    python examples/trl_grpo_freshper.py                     # CPU, a tiny model built offline, a few minutes
    python examples/trl_grpo_freshper.py --model Qwen/Qwen2.5-0.5B-Instruct --steps 200   # a GPU node

The reward: 1 when the first number in the completion is a + b. The tiny model, random but for
its tokenizer, gets it right by chance a few times in a hundred, which is enough signal for GRPO
to work with in a few minutes; with a real model, `--reward boxed` scores the last \\boxed{}
answer with math-verify (freshper.trainer.envs.math.score), the math task's reward. Compared with
a plain GRPOTrainer script, the only changes are the two class names and the replay_* options of
the config.
"""
import argparse
import os
import random
import re
import warnings

# TRL warns at import, once per module, about vLLM versions it was not tested with; this example
# generates with transformers, so the warning says nothing about it.
warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")

from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from freshper.integrations.trl import FreshPERGRPOConfig, FreshPERGRPOTrainer  # noqa: E402
from freshper.trainer.envs.math import INSTRUCTION, score  # noqa: E402


def problems(n: int, seed: int = 0) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}?\n{INSTRUCTION}"}],
                     "answer": str(a + b)})
    return Dataset.from_list(rows)


def _text(c) -> str:
    return c[-1]["content"] if isinstance(c, list) else c  # chat messages or plain text


def boxed(completions, answer, **kw):
    """1 for a right \\boxed{} answer, else 0."""
    return [score(_text(c), a) for c, a in zip(completions, answer)]


def first_number(completions, answer, **kw):
    """1 when the first number in the completion is the answer, else 0."""
    out = []
    for c, a in zip(completions, answer):
        m = re.search(r"-?\d+", _text(c))
        out.append(float(m is not None and m.group(0) == a))
    return out


def tiny_model() -> str:
    """The offline tiny model and chat tokenizer the trainer builds for its math task."""
    from freshper.trainer import config
    from freshper.trainer.model.load import build_tiny

    return str(build_tiny(config.load("math-cpu")))


def main():
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="a local folder or hub id; default: the tiny offline model")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--reward", default="first-number", choices=["first-number", "boxed"])
    ap.add_argument("--mode", default="freshper", choices=["freshper", "per", "uniform"])
    ap.add_argument("--output-dir", default="runs/trl-grpo-freshper")
    args = ap.parse_args()
    path = args.model or tiny_model()
    cfg = FreshPERGRPOConfig(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=32, num_generations=8,
        max_completion_length=8, learning_rate=1e-3 if not args.model else 1e-6, logging_steps=20, report_to=[],
        save_strategy="no", bf16=False, seed=0,
        replay_mode=args.mode, replay_updates=1, replay_tau=50.0, replay_priority="advantage", replay_is_weights=True)
    reward = first_number if args.reward == "first-number" else boxed
    trainer = FreshPERGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), reward_funcs=reward,
                                  args=cfg, train_dataset=problems(2000),
                                  processing_class=AutoTokenizer.from_pretrained(path))
    trainer.train()
    for h in trainer.state.log_history:
        if "reward" in h:
            ess, age = h.get("replay/is_ess", float("nan")), h.get("replay/age_mean", float("nan"))
            print(f"step {h['step']:>4}  reward {h['reward']:.3f}  loss {h.get('loss', float('nan')):+.4f}  "
                  f"grad_norm {h.get('grad_norm', float('nan')):.3f}  replay ESS {ess:.2f}  replay age {age:.1f}")


if __name__ == "__main__":
    main()

"""A reward function of your own for math data, as GRPO users bring one (TRL's reward_funcs,
verl's custom reward function):

    PYTHONPATH=examples freshper train --preset math-cpu --env.data examples/problems.jsonl \
        --env.eval_data examples/held_out.jsonl --env.reward rewards:exact_boxed

exact_boxed is called as f(reply, answer) -> float for every reply, in place of env.scorer;
exact_boxed_batch is the same reward in TRL's batched form, one call per batch.
"""
import re

BOX = re.compile(r"\\boxed\{([^{}]*)\}")


def exact_boxed(reply: str, answer: str) -> float:
    """1.0 when the last \\boxed{} of the reply holds the answer's text exactly, else 0.0."""
    found = BOX.findall(reply)
    return 1.0 if found and found[-1].strip() == answer.strip() else 0.0


def exact_boxed_batch(completions: list[str], answer: list[str], **columns) -> list[float]:
    """exact_boxed for a whole batch, as TRL's reward functions are written."""
    return [exact_boxed(c, a) for c, a in zip(completions, answer)]

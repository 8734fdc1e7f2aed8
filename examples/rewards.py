"""A reward function of your own for math data, as GRPO users bring one (TRL's reward_funcs,
verl's custom reward function):

    PYTHONPATH=examples freshper train --preset math-cpu --env.data problems.jsonl --env.reward rewards:exact_boxed

It is called as f(reply, answer) -> float for every reply, in place of env.scorer.
"""
import re

BOX = re.compile(r"\\boxed\{([^{}]*)\}")


def exact_boxed(reply: str, answer: str) -> float:
    """1.0 when the last \\boxed{} of the reply holds the answer's text exactly, else 0.0."""
    found = BOX.findall(reply)
    return 1.0 if found and found[-1].strip() == answer.strip() else 0.0

"""A task of your own, outside the package: spell a word backwards.

    PYTHONPATH=examples freshper train --preset tiny --env.name word_reverse:WordReverse --env.kwargs "{length: 4}"

`env.name` names the class by its import path; `env.kwargs` gives its constructor's keywords,
checked against the signature below (a wrong name or type stops the run before it starts).
OPTIONS maps built-in env.* fields it also takes (here the format penalty) to its keywords.
"""
import random

from freshper.trainer.envs import QuestionEnv, StepResult

LETTERS = "abcdefghijklmnopqrstuvwxyz"


class WordReverse(QuestionEnv):
    name = "word-reverse"
    instruction = "Write the word backwards, inside <answer></answer>."
    stop_strings = ("</answer>",)
    OPTIONS = {"format_penalty": "format_penalty"}

    def __init__(self, length: int = 5, format_penalty: float = -0.15):
        super().__init__(1, format_penalty)
        if not 1 <= length <= 20:
            raise ValueError(f"length must be in [1, 20], got {length!r}")
        self.length = length
        self.question, self.answer = "", ""

    def _reset(self, seed: int) -> None:
        # seeds at or above 2**31 are validation's: this task draws them from the same space
        word = "".join(random.Random(seed).choice(LETTERS) for _ in range(self.length))
        self.question, self.answer, self.correct = f"Spell '{word}' backwards.", word[::-1], False

    def opening(self, state: str, max_words: int) -> list[dict]:
        return [{"role": "user", "content": f"{self.question}\n{self.instruction}"}]

    def random_reply(self, rng: random.Random) -> str:
        return "<answer>" + "".join(rng.choice(LETTERS) for _ in range(self.length)) + "</answer>"

    def step(self, text: str) -> StepResult:
        self.turn, self.done = self.turn + 1, True
        inside = text.split("<answer>")[-1].split("</answer>")[0].strip() if "<answer>" in text else None
        self.correct = inside == self.answer
        penalty = 0.0 if inside is not None else self.format_penalty
        reward = 1.0 if self.correct else 0.0
        return StepResult(self.render(), reward, penalty, True, inside is not None, self.correct, {})

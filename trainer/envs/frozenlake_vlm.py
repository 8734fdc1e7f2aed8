"""FrozenLake-VLM: the FrozenLake game (trainer/envs/frozenlake.py, same maps and dynamics), with
the board shown as a picture instead of text, for a vision-language policy.

Each user message holds the rendered board as an image, worded as the authors' vision-language
env manager words it (VLTrajEnvManager of their code): the instruction, "Turn t:\\nState", the
image, then the next-step template ("You have n actions left ..."), and "Reward:\\n r" before the
next turn. Their image is the environment's rgb_array render; here the board is drawn with PIL
(trainer/vision.draw_board), `cell` pixels per square. At 28 pixels a square is exactly one
merged 2 x 2 patch of Qwen2-VL's 14-pixel patches, so each board cell is one image token.
"""
from __future__ import annotations

from ..chat import REWARD, SYSTEM, fmt_reward
from ..vision import IMAGE, draw_board
from .base import register
from .frozenlake import FrozenLake

# the authors' VL templates (their examples/config/vl_traj_envs.yaml): before and after the image
PRE_STEP = "\nTurn {turn}:\nState"
NEXT_STEP = ("You have {left} actions left. \nAlways output: <answer> [your answer] </answer> with no extra text. "
             "\nStrictly follow this format.\nMax response length: {max_words} words (tokens).\n"
             "Decide the next action:\n")
INSTRUCTION = ("You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may move to the "
               "unintended direction due to the slippery ice. The answer must be one of action in a turn, format "
               "is <answer>Right</answer>")
LEGEND = ("\nIn the picture: red is you, light blue is ice, dark blue is a hole, green is the goal. Your available "
          "actions are:\nLeft, Down, Right, Up")


@register
class FrozenLakeVLM(FrozenLake):
    name = "frozenlake-vlm"
    vision = True
    prompt_sets = ("roll",)

    def __init__(self, max_turns: int = 10, format_penalty: float = -0.15, size: int = 4, p: float = 0.8,
                 cell: int = 28):
        super().__init__(max_turns, format_penalty, size, p)
        if not 4 <= cell <= 256:
            raise ValueError(f"cell must lie in [4, 256] pixels, got {cell}")
        self.cell = cell

    def image(self):
        """The current board as an RGB picture (size * cell pixels square)."""
        return draw_board(self.render().splitlines(), self.cell)

    def images(self) -> list:
        return [self.image()]

    def _turn(self, left: int, max_words: int) -> str:
        return PRE_STEP.format(turn=self.turn) + IMAGE + NEXT_STEP.format(left=left, max_words=max_words)

    def opening(self, state: str, max_words: int) -> list[dict]:
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": INSTRUCTION + LEGEND + self._turn(self.max_turns - self.turn, max_words)}]

    def feedback(self, result, max_words: int) -> str:
        return REWARD.format(reward=fmt_reward(result.reward)) + self._turn(self.max_turns - self.turn, max_words)

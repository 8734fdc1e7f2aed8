"""The games shown as pictures, for a vision-language policy: FrozenLake-VLM and Sokoban-VLM.

Same maps, levels and dynamics as the text games (trainer/envs/frozenlake.py, sokoban.py); the
board is drawn as an RGB picture (draw_board below, `cell` pixels per square) instead of
printed. Each user message holds the picture between the authors' vision-language templates (the
VLTrajEnvManager of their code, examples/config/vl_traj_envs.yaml): the instruction,
"Turn t:\\nState", the image, then the next-step template ("You have n actions left ..."), and
"Reward:\\n r" before the next turn. Their image is the environment's rgb_array render; here the
squares are flat colours named in the instruction. At 28 pixels a square is exactly one merged
2 x 2 patch of Qwen2-VL's 14-pixel patches, so each board square is one image token.
"""
from __future__ import annotations

from .base import register
from .frozenlake import FrozenLake
from .prompts import IMAGE, REWARD, SYSTEM, fmt_reward
from .sokoban import Sokoban

# the authors' VL templates: before and after the image
PRE_STEP = "\nTurn {turn}:\nState"
NEXT_STEP = ("You have {left} actions left. \nAlways output: <answer> [your answer] </answer> with no extra text. "
             "\nStrictly follow this format.\nMax response length: {max_words} words (tokens).\n"
             "Decide the next action:\n")


class PictureGame:
    """Mixin over a text game: the board as a picture in every turn's message."""

    vision = True
    prompt_sets = ("roll",)
    picture_instruction = ""  # the game's VL instruction (the authors' env_instruction) and colour legend

    @classmethod
    def config_kwargs(cls, env) -> dict:
        """The text game's keywords, with the picture's side turned into pixels per cell."""
        kw = super().config_kwargs(env)
        kw["cell"] = kw.pop("image_pixels") // env.size
        return kw

    def _picture_init(self, cell: int) -> None:
        if not 4 <= cell <= 256:
            raise ValueError(f"cell must lie in [4, 256] pixels, got {cell}")
        self.cell = cell

    def image(self):
        """The current board as an RGB picture (size * cell pixels square)."""
        return draw_board(self.content().splitlines(), self.cell)

    def images(self) -> list:
        return [self.image()]

    def _turn(self, max_words: int) -> str:
        left = self.max_turns - self.turn
        return PRE_STEP.format(turn=self.turn) + IMAGE + NEXT_STEP.format(left=left, max_words=max_words)

    def opening(self, state: str, max_words: int) -> list[dict]:
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": self.picture_instruction + self._turn(max_words)}]

    def feedback(self, result, max_words: int) -> str:
        return REWARD.format(reward=fmt_reward(result.reward)) + self._turn(max_words)


COLOURS = {"_": (235, 245, 255), "O": (20, 40, 120), "G": (40, 170, 60), "P": (220, 40, 40), "X": (120, 20, 120),
           "√": (240, 200, 0), "#": (90, 90, 90), "S": (220, 120, 40)}


def draw_board(rows: list[str], cell: int = 16):
    """A grid of symbols (FrozenLake: P player, _ ice, O hole, G goal, X in a hole, √ on the goal;
    Sokoban: # wall, _ floor, O target, X box, √ box on target, P player, S player on target) as an
    RGB picture, `cell` pixels per square, thin grid lines: what a VLM sees of the board."""
    from PIL import Image, ImageDraw

    h, w = len(rows), max(len(r) for r in rows)
    img = Image.new("RGB", (w * cell, h * cell), (255, 255, 255))
    d = ImageDraw.Draw(img)
    for y, row in enumerate(rows):
        for x, ch in enumerate(row):
            if ch not in COLOURS:
                raise ValueError(f"draw_board: unknown symbol {ch!r} at row {y}, column {x}")
            d.rectangle([x * cell, y * cell, (x + 1) * cell - 1, (y + 1) * cell - 1], fill=COLOURS[ch],
                        outline=(160, 160, 160))
    return img


@register
class FrozenLakeVLM(PictureGame, FrozenLake):
    name = "frozenlake-vlm"
    picture_instruction = (
        "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may move to the "
        "unintended direction due to the slippery ice. The answer must be one of action in a turn, format is "
        "<answer>Right</answer>\nIn the picture: red is you, light blue is ice, dark blue is a hole, green is the "
        "goal. Your available actions are:\nLeft, Down, Right, Up")

    # a picture has no printed grid (env.grid) and one wording
    OPTIONS = {**{k: v for k, v in FrozenLake.OPTIONS.items() if k not in ("prompts", "grid")},
               "image_pixels": "image_pixels"}

    def __init__(self, max_turns: int = 10, format_penalty: float = -0.15, size: int = 4, p: float = 0.8,
                 cell: int = 28, held_out: float = 0.0, corners: bool = False):
        FrozenLake.__init__(self, max_turns, format_penalty, size, p, held_out=held_out, corners=corners)
        self._picture_init(cell)


@register
class SokobanVLM(PictureGame, Sokoban):
    name = "sokoban-vlm"
    picture_instruction = (
        "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. When "
        "you are right next to a box, you can push it by moving in the same direction. You cannot push a box "
        "through a wall, and you cannot pull a box. The answer must be one of action in a turn, format is "
        "<answer>Right</answer>\nIn the picture: red is you, orange is you on a target, grey is a wall, light blue "
        "is floor, dark blue is a target, purple is a box, yellow is a box on a target. Your available actions "
        "are:\nUp, Down, Left, Right")

    OPTIONS = {**{k: v for k, v in Sokoban.OPTIONS.items() if k != "grid"}, "image_pixels": "image_pixels"}

    def __init__(self, max_turns: int = 10, format_penalty: float = -0.15, size: int = 6, boxes: int = 1,
                 search_depth: int = 300, cell: int = 28, held_out: float = 0.0):
        Sokoban.__init__(self, max_turns, format_penalty, size, boxes, search_depth, held_out=held_out)
        self._picture_init(cell)

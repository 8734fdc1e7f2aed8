"""The paper's game prompts: the messages a game episode's chat is made of.

The game conversation (as in the paper's code, agentic env managers of ROLL): a system message; a
first user message holding the environment's instruction followed by the turn template for the
initial state; then per turn the assistant's reply and a user message with "Reward: r" and the
next turn's template (`game_opening`, `game_feedback`). Environments choose their own messages
(a math problem is a single user turn). `IMAGE` is the placeholder a VLM environment's message
holds once per picture it shows (model/vision.py expands it into image tokens).
"""
from __future__ import annotations

SYSTEM = "You're a helpful assistant. You are a good game player. You are aiming to get high reward in the game.\n"
TURN = ("Turn {turn}:\nState:\n{state}\nYou have {left} actions left. \n"
        "Always output: <answer> [your answer] </answer> with no extra text. Strictly follow this format.\n"
        "Max response length: {max_words} words (tokens).\nDecide the next action:\n")
REWARD = "Reward:\n{reward}\n"
# The FrozenLake prompts of the authors' replay configs (examples/replay_buffer/*.yaml of their
# code), which differ from ROLL's agentic examples above; "Forbid the whole" is verbatim.
REPLAY_SYSTEM = "You are an agent solving the FrozenLake puzzle. Output must be wrapped as <answer>Action</answer>."
REPLAY_TURN = ("Current turn: {turn}\nGrid state:\n{state}\nActions left: {left}\n"
               "Respond with one action token only, within {max_words} tokens.\n")
REPLAY_REWARD = "Feedback: Your previous action received reward {reward}. Revise your plan if needed."
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"  # Qwen2-VL's image placeholder
PROMPTS = ("roll", "replay")  # env.prompts: ROLL's agentic examples | the authors' replay configs (FrozenLake)


def fmt_reward(r: float) -> str:
    """Rewards as the model reads them: 0, 1, -0.1, 10.9 (no float noise)."""
    return f"{round(r, 6):g}"


def turn_text(turn: int, state: str, left: int, max_words: int, prompts: str = "roll") -> str:
    return (TURN if prompts == "roll" else REPLAY_TURN).format(turn=turn, state=state, left=left, max_words=max_words)


def game_opening(instruction: str, state: str, left: int, max_words: int, prompts: str = "roll") -> list[dict]:
    """The system message and the first user message of a game episode."""
    return [{"role": "system", "content": SYSTEM if prompts == "roll" else REPLAY_SYSTEM},
            {"role": "user", "content": instruction + turn_text(0, state, left, max_words, prompts)}]


def game_feedback(reward: float, turn: int, state: str, left: int, max_words: int, prompts: str = "roll") -> str:
    """The user message after a game turn: the reward of the last action, then the next turn.
    The replay configs' reward prints as Python prints a float (0.0, 1.0), with no line break."""
    if prompts == "roll":
        return REWARD.format(reward=fmt_reward(reward)) + turn_text(turn, state, left, max_words)
    return REPLAY_REWARD.format(reward=repr(float(reward))) + turn_text(turn, state, left, max_words, prompts)

"""A FrozenLake whose opening is much longer for odd initial states: prompts of one batch that
differ in length, as a user's environment's often do, for tests/trainer/train/test_rollout.py."""
from freshper.trainer.envs import FrozenLake

FILLER = " Think about the board." * 40


class UnevenLake(FrozenLake):
    def reset(self, seed: int) -> str:
        self.seed = seed
        return super().reset(seed)

    def opening(self, state: str, max_words: int) -> list[dict]:
        messages = super().opening(state, max_words)
        if self.seed % 2:
            messages[-1] = {**messages[-1], "content": messages[-1]["content"] + FILLER}
        return messages

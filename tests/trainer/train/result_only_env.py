"""A FrozenLake whose StepResult alone says what a turn earned and when the episode ends: 0.25
reward and a -0.3 format penalty every turn, done at the second turn; its step never sets the
env's own `.done`. For the tests that the rollout and the warm start read the StepResult (the one
source) and nothing else: a loop that missed its `done` would step it again, which fails."""
from freshper.trainer.envs import FrozenLake, StepResult


class ResultOnly(FrozenLake):
    def step(self, text):
        assert self.turn < 2, "stepped after its StepResult said done"  # a loop that missed it would never end
        self.turn += 1
        end = self.turn >= 2
        return StepResult(self.render(), 0.25, -0.3, end, True, end, {})

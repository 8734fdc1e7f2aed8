"""A FrozenLake whose reset raises for the initial states named in FRESHPER_TEST_FAIL_SEEDS
(comma-separated): a user's environment failing inside the generation worker, for
tests/trainer/train/test_async.py. The variable reaches the worker through its environment."""
import os

from freshper.trainer.envs import FrozenLake


class FailingLake(FrozenLake):
    def reset(self, seed: int) -> str:
        if str(seed) in os.environ.get("FRESHPER_TEST_FAIL_SEEDS", "").split(","):
            raise ValueError(f"FailingLake has no initial state {seed} (the test's own error)")
        return super().reset(seed)

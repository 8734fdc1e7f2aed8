"""A FrozenLake whose reset hangs (in Python, as the held-out redraw loop did) once the file named
by FRESHPER_TEST_STUCK exists: a stuck iteration for tests/trainer/train/test_interrupt.py."""
import os
import time
from pathlib import Path

from freshper.trainer.envs import FrozenLake


class StuckLake(FrozenLake):
    def reset(self, seed: int) -> str:
        flag = os.environ.get("FRESHPER_TEST_STUCK")
        while flag and Path(flag).exists():
            time.sleep(0.05)
        return super().reset(seed)

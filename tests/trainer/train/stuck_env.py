"""A FrozenLake whose reset hangs (in Python, as the held-out redraw loop did) once the file named
by FRESHPER_TEST_STUCK exists: a stuck iteration for tests/trainer/train/test_interrupt.py.

The first reset that hangs creates `<flag>.hanging`. The test waits for that file, not for a log
line: the run may have drawn the next iteration's resets before the test creates the flag (a
loaded CI machine did), and then the hang begins an iteration later than the log suggests."""
import os
import time
from pathlib import Path

from freshper.trainer.envs import FrozenLake


class StuckLake(FrozenLake):
    def reset(self, seed: int) -> str:
        flag = os.environ.get("FRESHPER_TEST_STUCK")
        if flag and Path(flag).exists():
            Path(flag + ".hanging").touch()
            while Path(flag).exists():
                time.sleep(0.05)
        return super().reset(seed)

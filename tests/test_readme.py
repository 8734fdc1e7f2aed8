"""Every Python block in README.md runs as printed, on this CPU machine, in a fresh process with
its own cache and working folder (it must not write into the checkout)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_block_runs(i, tmp_path):
    env = {**os.environ, "FRESHPER_CACHE": str(tmp_path / "cache"), "TRITON_INTERPRET": "0",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", BLOCKS[i]], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, f"README python block {i}:\n{BLOCKS[i]}\n--- stderr:\n{out.stderr[-3000:]}"

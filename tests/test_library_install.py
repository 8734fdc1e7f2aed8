"""docs/library.md's install lines as far as they run offline: freshper is not on PyPI, so the page
installs it from the checkout (`pip install .`, or a wheel built there for another environment).
The wheel is built from a copy of the checkout's sources (setuptools writes build/ and egg-info
beside them), installed without its dependencies into a fresh venv that borrows this
environment's packages (no index here), and the library imports and samples from it with the
trainer's extra blocked: it runs without `train`."""
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from freshper.trainer.entry import TRAIN_MODULES

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("freshper", "kernels", "trainer", "profiling", "setup.py", "pyproject.toml", "README.md")
INSTALL = "pip install ."
WHEEL = "pip wheel --no-deps . -w dist"
WHEEL_FILE = "dist/freshper-0.1.0-py3-none-any.whl"


def install_section() -> str:
    text = (ROOT / "docs" / "library.md").read_text(encoding="utf-8")
    start = text.index("## Install and imports")
    end = text.find("\n## ", start)
    return " ".join(text[start:end if end > 0 else None].split())  # code spans may wrap


def test_the_page_installs_from_the_checkout_with_the_tested_lines():
    spans = re.findall(r"`([^`]+)`", install_section())
    assert INSTALL in spans and WHEEL in spans and WHEEL_FILE in spans
    assert not [s for s in spans if re.match(r"pip install '?freshper", s)], "freshper is not on PyPI"


def test_the_wheel_builds_installs_and_runs_without_the_train_extra(tmp_path):
    src = tmp_path / "checkout"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    # the page's line, offline: this environment's setuptools, no index
    build = [sys.executable, "-m", *WHEEL.split(), "--no-build-isolation", "--no-index"]
    out = subprocess.run(build, cwd=src, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    wheel = src / WHEEL_FILE
    assert sorted((src / "dist").iterdir()) == [wheel]
    with zipfile.ZipFile(wheel) as z:
        meta = z.read("freshper-0.1.0.dist-info/METADATA").decode()
    needs = re.findall(r"^Requires-Dist: ([\w-]+)[^;\n]*$", meta, flags=re.M)  # those without an extra's marker
    assert sorted(needs) == sorted(["torch", "numpy", "numba", "safetensors"]
                                   + (["triton"] if sys.platform.startswith("linux") else []))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    out = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                          str(wheel)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    # the dependencies from this environment, after the venv's own site-packages (a .pth line
    # adds a path without running that folder's .pth files, so this checkout's editable install
    # stays out)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    blocked = sorted(TRAIN_MODULES)
    code = (f"import sys\nfor m in {blocked!r}:\n    sys.modules[m] = None  # the train extra: absent\n"
            "import torch\nimport freshper, freshper.kernels\n"
            "buf = freshper.ReplayBuffer(16, mode='freshper', tau=10.0, device='cpu', seed=0)\n"
            "buf.add(torch.ones(4), step=0, x=torch.arange(4))\n"
            "print(freshper.__file__, buf.sample(2, step=1).x.shape[0])\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([str(python), "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    where, drawn = out.stdout.split()
    assert Path(where).is_relative_to(site) and drawn == "2"

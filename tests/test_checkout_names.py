"""From the checkout's root, the top-level folders never stand in for installed distributions of
the same name (freshper/_checkout.py): transformers 5.25 imports Hugging Face's `kernels`, and
setuptools loads `kernels._internals.locking` from it, with the root first on sys.path."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("kernels", "trainer", "profiling")


def _run(code: str, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    """`python -c code` from the checkout's root, which puts the root first on sys.path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if extra_path is not None:
        env["PYTHONPATH"] = str(extra_path)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A site folder holding distributions named like the checkout's folders, with a submodule each."""
    site = tmp_path_factory.mktemp("site")
    for name in NAMES:
        (site / name / "_internals").mkdir(parents=True)
        (site / name / "__init__.py").write_text(f"WHO = 'installed {name}'\n")
        (site / name / "_internals" / "__init__.py").write_text("")
        (site / name / "_internals" / "locking.py").write_text("LOCK = 1\n")
    return site


@pytest.mark.parametrize("name", NAMES)
def test_an_installed_distribution_takes_its_name_from_the_root(installed, name):
    r = _run(f"""
        import {name}, {name}._internals.locking
        assert {name}.WHO == 'installed {name}', {name}.__file__
        assert {name}._internals.locking.LOCK == 1
        import freshper.{name}
        assert freshper.{name}.__file__.startswith({str(ROOT)!r}), freshper.{name}.__file__
    """, installed)
    assert r.returncode == 0, r.stderr


def test_the_kernels_api_is_unchanged_beside_an_installed_kernels(installed):
    r = _run("""
        import kernels
        from freshper.kernels import policy_loss, sample
        assert kernels.WHO == 'installed kernels'
        assert callable(policy_loss) and callable(sample)
    """, installed)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", NAMES)
def test_the_bare_name_is_never_the_folder(name):
    """Here, as in a user's venv: the bare import gives the installed distribution where there is
    one (HF's kernels beside transformers 5.25), else an empty module: transformers 5.19 imports
    whatever find_spec finds and must not fail on it."""
    r = _run(f"""
        import importlib.machinery, os, sys
        rest = [p for p in sys.path if os.path.abspath(p or '.') != {str(ROOT)!r}]
        print(importlib.machinery.PathFinder.find_spec({name!r}, rest) is not None)
        import {name}
        print({name}.__file__)
        print(sorted(k for k in vars({name}) if not k.startswith("__")))
    """)
    assert r.returncode == 0, r.stderr
    installed, where, names = r.stdout.splitlines()
    if installed == "True":  # (a venv may live inside the checkout: compare with the folder itself)
        assert not Path(where).resolve().is_relative_to(ROOT / name), where
    else:
        assert names == "[]", names  # the folder's own names stay under freshper.{name}

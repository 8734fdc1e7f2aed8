"""Test-wide setup. Triton kernels run in its CPU interpreter, which must be chosen before
triton is first imported; tests that compare against the kernels call `*_triton` directly."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# A test run must write only under its temporary folders: files that appear in the checkout
# (untracked and not ignored) during the session fail it.
def _untracked(root):
    import subprocess

    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root, capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None  # not a git checkout
    return {line[3:] for line in out.stdout.splitlines() if line.startswith("??")}


def pytest_sessionstart(session):
    session.config._untracked_before = _untracked(session.config.rootpath)


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_untracked_before", None)
    after = _untracked(session.config.rootpath)
    if before is None or after is None:
        return
    new = sorted(after - before)
    if new:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"FAILED: the tests wrote into the checkout: {new[:10]}", red=True)
        session.exitstatus = 1

"""Test-wide setup. Triton kernels run in its CPU interpreter, which must be chosen before
triton is first imported; tests that compare against the kernels call `*_triton` directly."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `--model.dtype auto` is bf16 on CPUs with AVX512-BF16 (trainer/model/precision.py): tests read
# as float32 on every machine that runs them, and test the rule itself with both answers.
os.environ.setdefault("FRESHPER_CPU_BF16", "0")


def pytest_collection_modifyitems(config, items):
    """Files marked slow first, the longest first; the sort is stable, so every file keeps its
    tests' order. Under tests/run.sh this does not yet decide the order: pytest-xdist's loadfile
    hands out files by their number of tests (most first) unless given --no-loadscope-reorder,
    so the one-test learning file started 17 minutes into the 23-minute rehearsal of 2026-12-03.
    Adding that flag is the next cut, not yet rehearsed."""
    seconds = {}
    for item in items:
        mark = item.get_closest_marker("slow")
        if mark is not None:
            seconds[item.path] = mark.args[0]
    items.sort(key=lambda item: -seconds.get(item.path, 0))


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


def _is_worker(config):
    return hasattr(config, "workerinput")  # a pytest-xdist worker: the controller checks for all of them


def pytest_sessionstart(session):
    if not _is_worker(session.config):
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

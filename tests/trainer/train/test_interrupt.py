"""Ctrl-C (SIGINT) or SIGTERM during `freshper train`: the iteration in progress finishes, a
checkpoint is written, one line says how to resume, and the resumed run goes on from there."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# `spawned` (tests/trainer/conftest.py) kills each trainer process a test started, whatever happens.
# A run that never stops fails its test by name after this many seconds (each test's own waits
# for its runs add up to at most about 600 s).
pytestmark = pytest.mark.timeout(900)


def test_sigint_checkpoints_and_says_how_to_resume(tmp_path, spawned):
    run = tmp_path / "runs" / "int"
    cmd = [sys.executable, "-m", "freshper.trainer.cli", "train", "--preset", "tiny", "--train.iterations", "40",
           "--train.run_dir", str(tmp_path / "runs"), "--train.name", "int", "--train.checkpoint_every", "100"]
    env = {**os.environ, "FRESHPER_CACHE": os.environ.get("FRESHPER_CACHE", str(tmp_path / "cache"))}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    spawned.append(proc)
    metrics = run / "metrics.jsonl"
    seen = []
    for line in proc.stderr:  # the event: the log line of iteration 1 (its metrics row is written by then)
        seen.append(line)
        if " INFO iter 1 " in line:
            break
    assert seen and " INFO iter 1 " in seen[-1], "".join(seen)[-2000:]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    err = "".join(seen) + err
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    n = len(rows)
    assert 2 <= n < 40
    assert f"interrupted at iteration {n}; resume with: freshper train --resume {run}" in err
    assert (run / "checkpoints" / f"iter_{n:06d}").is_dir(), "a checkpoint at the interruption"
    done = subprocess.run([sys.executable, "-m", "freshper.trainer.cli", "train", "--resume", str(run),
                           "--train.iterations", str(n + 1)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [json.loads(line)["iteration"] for line in metrics.read_text().splitlines()] == list(range(n + 1))
    assert "done: " in done.stderr and "outputs: " in done.stderr


def _stuck_run(tmp_path, grace: str, spawned: list):
    """A run whose environment hangs from iteration 2 or later (once the flag file exists).
    Returns the process, the file its stderr goes to and the iteration that hangs: the number of
    metrics rows written when the hang began (iterations count from 0). The tiny preset runs 40
    iterations in seconds and logs each one, so the run is made too long to finish first, and
    stderr goes to a file that cannot fill up and block it as an unread pipe would."""
    flag, metrics, err = tmp_path / "stuck", tmp_path / "runs" / "stuck" / "metrics.jsonl", tmp_path / "stderr.txt"
    cmd = [sys.executable, "-m", "freshper.trainer.cli", "train", "--preset", "tiny", "--train.iterations", "100000",
           "--env.name", "tests.trainer.train.stuck_env:StuckLake", "--train.run_dir", str(tmp_path / "runs"),
           "--train.name", "stuck", "--train.checkpoint_every", "100000", "--train.stop_grace", grace]
    env = {**os.environ, "FRESHPER_CACHE": os.environ.get("FRESHPER_CACHE", str(tmp_path / "cache")),
           "FRESHPER_TEST_STUCK": str(flag)}
    with err.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=f, text=True, env=env,
                                cwd=Path(__file__).resolve().parents[3])
    spawned.append(proc)

    def wait_for(done, what):
        deadline = time.monotonic() + 300
        while not done():
            assert proc.poll() is None and time.monotonic() < deadline, f"{what}: {err.read_text()[-2000:]}"
            time.sleep(0.05)

    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2, "iterations 0 and 1 never ended")
    flag.touch()  # from here on every reset hangs
    wait_for((tmp_path / "stuck.hanging").exists, "the run never reached a reset that hangs")
    stuck = len(metrics.read_text().splitlines())
    time.sleep(1.0)
    return proc, err, stuck


def test_sigterm_stops_a_stuck_run(tmp_path, spawned):
    """One SIGTERM: the stuck iteration is aborted after train.stop_grace, in one line, with exit 130
    (before, the run ignored SIGTERM for good and stopped only at a second SIGINT)."""
    proc, log, stuck = _stuck_run(tmp_path, "3", spawned)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    err = log.read_text()
    assert proc.returncode == 130, err[-2000:]
    assert time.monotonic() - t0 < 60
    assert f"iteration {stuck} still running 3 s after the stop signal" in err
    assert f"aborted in iteration {stuck} without a checkpoint" in err
    assert "Traceback" not in err


def test_a_second_sigterm_aborts_at_once(tmp_path, spawned):
    proc, log, stuck = _stuck_run(tmp_path, "0", spawned)  # no watchdog: only the second signal ends it
    proc.send_signal(signal.SIGTERM)
    time.sleep(2.0)
    assert proc.poll() is None, "one SIGTERM with no grace waits for the iteration"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    err = log.read_text()
    assert proc.returncode == 130, err[-2000:]
    assert f"aborted in iteration {stuck} without a checkpoint" in err and "Traceback" not in err


def test_the_checkpoint_after_a_stop_is_not_timed_by_the_watchdog(tmp_path, monkeypatch):
    """Issue 77, defect 4: SIGTERM in iteration 1, checkpoint_every 1 and a save slower than
    train.stop_grace: the stopped iteration's checkpoint is written (the watchdog used to count
    the save against the grace and abort it: "aborted in iteration 2 without a checkpoint")."""
    from contextlib import contextmanager

    from freshper.trainer import config
    from freshper.trainer.train import checkpoint as ckpt
    from freshper.trainer.train.loop import Trainer

    grace = 1.0
    tr = Trainer(config.load("tiny", None, {"train.iterations": 5, "train.sft_steps": 0, "train.checkpoint_every": 1,
                                            "train.stop_grace": grace}), tmp_path / "r")
    real = ckpt.save

    def slow_save(*a, **k):  # a large model on a slow disk; Python code, which the watchdog's interrupt reaches
        end = time.monotonic() + 2.5 * grace
        while time.monotonic() < end:
            time.sleep(0.01)
        return real(*a, **k)

    monkeypatch.setattr(ckpt, "save", slow_save)

    @contextmanager
    def sigterm_in_iteration_1(i):
        yield
        if i == 1:  # at the iteration's end: the save follows within the grace
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        tr.run(on_iteration=sigterm_in_iteration_1)
    except KeyboardInterrupt:  # caught here: pytest would end the whole session on it
        pytest.fail("the watchdog aborted the checkpoint after the stop")
    assert tr.interrupted and tr.iteration == 2
    assert (tmp_path / "r" / "checkpoints" / "iter_000002").is_dir()
    assert ckpt.latest(tmp_path / "r" / "checkpoints").name == "iter_000002"

"""Ctrl-C (SIGINT) or SIGTERM during `freshper train`: the iteration in progress finishes, a
checkpoint is written, one line says how to resume, and the resumed run goes on from there."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def test_sigint_checkpoints_and_says_how_to_resume(tmp_path):
    run = tmp_path / "runs" / "int"
    cmd = [sys.executable, "-m", "freshper.trainer.cli", "train", "--preset", "tiny", "--train.iterations", "40",
           "--train.run_dir", str(tmp_path / "runs"), "--train.name", "int", "--train.checkpoint_every", "100"]
    env = {**os.environ, "FRESHPER_CACHE": os.environ.get("FRESHPER_CACHE", str(tmp_path / "cache"))}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
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


def _stuck_run(tmp_path, grace: str):
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


def test_sigterm_stops_a_stuck_run(tmp_path):
    """One SIGTERM: the stuck iteration is aborted after train.stop_grace, in one line, with exit 130
    (before, the run ignored SIGTERM for good and stopped only at a second SIGINT)."""
    proc, log, stuck = _stuck_run(tmp_path, "3")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    err = log.read_text()
    assert proc.returncode == 130, err[-2000:]
    assert time.monotonic() - t0 < 60
    assert f"iteration {stuck} still running 3 s after the stop signal" in err
    assert f"aborted in iteration {stuck} without a checkpoint" in err
    assert "Traceback" not in err


def test_a_second_sigterm_aborts_at_once(tmp_path):
    proc, log, stuck = _stuck_run(tmp_path, "0")  # no watchdog: only the second signal ends it
    proc.send_signal(signal.SIGTERM)
    time.sleep(2.0)
    assert proc.poll() is None, "one SIGTERM with no grace waits for the iteration"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    err = log.read_text()
    assert proc.returncode == 130, err[-2000:]
    assert f"aborted in iteration {stuck} without a checkpoint" in err and "Traceback" not in err

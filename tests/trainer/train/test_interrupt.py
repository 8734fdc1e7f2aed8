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
    """A run whose environment hangs from iteration 2 on (once the flag file exists)."""
    flag = tmp_path / "stuck"
    cmd = [sys.executable, "-m", "freshper.trainer.cli", "train", "--preset", "tiny", "--train.iterations", "40",
           "--env.name", "tests.trainer.train.stuck_env:StuckLake", "--train.run_dir", str(tmp_path / "runs"),
           "--train.name", "stuck", "--train.checkpoint_every", "100", "--train.stop_grace", grace]
    env = {**os.environ, "FRESHPER_CACHE": os.environ.get("FRESHPER_CACHE", str(tmp_path / "cache")),
           "FRESHPER_TEST_STUCK": str(flag)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=Path(__file__).resolve().parents[3])
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if " INFO iter 1 " in line:
            break
    assert seen and " INFO iter 1 " in seen[-1], "".join(seen)[-2000:]
    flag.touch()  # the next reset hangs: iteration 2 never ends
    time.sleep(1.0)
    return proc, seen


def test_sigterm_stops_a_stuck_run(tmp_path):
    """One SIGTERM: the stuck iteration is aborted after train.stop_grace, in one line, with exit 130
    (before, the run ignored SIGTERM for good and stopped only at a second SIGINT)."""
    proc, seen = _stuck_run(tmp_path, "3")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    err = "".join(seen) + err
    assert proc.returncode == 130, err[-2000:]
    assert time.monotonic() - t0 < 60
    assert "still running 3 s after the stop signal" in err and "aborted in iteration 2 without a checkpoint" in err
    assert "Traceback" not in err


def test_a_second_sigterm_aborts_at_once(tmp_path):
    proc, seen = _stuck_run(tmp_path, "0")  # no watchdog: only the second signal ends it
    proc.send_signal(signal.SIGTERM)
    time.sleep(2.0)
    assert proc.poll() is None, "one SIGTERM with no grace waits for the iteration"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "aborted in iteration 2 without a checkpoint" in err and "Traceback" not in err

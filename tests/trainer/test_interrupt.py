"""Ctrl-C (SIGINT) or SIGTERM during `freshper train`: the iteration in progress finishes, a
checkpoint is written, one line says how to resume, and the resumed run goes on from there."""
import json
import os
import signal
import subprocess
import sys


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

"""rollout.asynchronous: a worker process generates beside the trainer. Every episode is
accounted for, each batch's age is the versions since the weights that really generated it, the
lag stays within rollout.max_lag, and no process outlives the run however it stops."""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from freshper.trainer import config
from freshper.trainer.train import async_worker
from freshper.trainer.train.async_worker import GenerationWorkerDied
from freshper.trainer.train.loop import Trainer

from .premise import assert_updates

OVER = {"rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0, "train.iterations": 6,
        "rollout.episodes": 8, "algo.mode": "freshper", "algo.replay_updates": 1, "algo.lr": 3e-3,
        "rollout.asynchronous": True, "rollout.max_lag": 2, "rollout.worker_threads": 1, "train.threads": 1}


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_ages_are_exact_and_every_episode_is_counted(tmp_path, monkeypatch):
    taken = []
    take = async_worker.AsyncBatches.take

    def recording(self, t):
        b = take(self, t)
        taken.append(b)
        return b

    monkeypatch.setattr(async_worker.AsyncBatches, "take", recording)
    tr = Trainer(config.load("tiny", None, OVER), tmp_path / "run")
    versions = {}

    def snapshot(i):  # entering iteration i, the trainer holds version i
        versions[i] = {k: v.clone() for k, v in tr.model.state_dict().items()}
        return contextlib.nullcontext()

    rows = tr.run(on_iteration=snapshot)
    assert_updates(rows)
    assert [b.iteration for b in taken] == list(range(6))
    assert [r["batch_age"] for r in rows] == [b.iteration - b.version for b in taken]
    assert all(0 <= r["batch_age"] <= 2 for r in rows)
    assert any(r["batch_age"] > 0 for r in rows), "the worker ran ahead at least once"
    assert sum(r["episodes_generated"] for r in rows) == 48 and rows[-1]["episodes_in_flight"] == 0
    # each batch's recorded log-probs are those of the version it names, not its neighbours'
    for b in taken:
        ep = b.episodes
        tr.model.load_state_dict(versions[b.version])
        gap = (tr.policy.logprobs(ep.tokens, ep.mask) - ep.engine_logp)[ep.mask].abs().max()
        assert gap < 1e-4, (b.iteration, b.version, float(gap))
        for other in (b.version - 1, b.version + 1):
            if other in versions:
                tr.model.load_state_dict(versions[other])
                off = (tr.policy.logprobs(ep.tokens, ep.mask) - ep.engine_logp)[ep.mask].abs().max()
                assert off > 1e-3, (b.iteration, b.version, other, float(off))


def test_a_worker_that_fails_stops_the_run_after_a_checkpoint(tmp_path):
    tr = Trainer(config.load("tiny", None, {**OVER, "rollout.worker_device": "cuda:7"}), tmp_path / "run")
    t0 = time.monotonic()
    with pytest.raises(GenerationWorkerDied, match="the generation worker failed: .*(CUDA|cuda)"):
        tr.run()
    assert time.monotonic() - t0 < 60
    assert (tmp_path / "run" / "checkpoints" / "iter_000000").is_dir()
    assert not tr.batches.proc.is_alive()


def test_a_killed_worker_is_seen_within_seconds(tmp_path):
    tr = Trainer(config.load("tiny", None, {**OVER, "train.iterations": 50, "train.checkpoint_every": 1000}),
                 tmp_path / "run")

    def kill_at_2(i):
        if i == 2:
            os.kill(tr.batches.proc.pid, signal.SIGKILL)
            kill_at_2.t = time.monotonic()
        return contextlib.nullcontext()

    with pytest.raises(GenerationWorkerDied, match="died .*exit code -9"):
        tr.run(on_iteration=kill_at_2)
    assert time.monotonic() - kill_at_2.t < 10
    saved = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("iter_*"))
    assert saved and int(saved[-1][5:]) >= 2, saved


def test_a_worker_done_before_the_trainer_is_not_a_death(tmp_path):
    """Generation faster than training (what asynchronous generation is for): the worker has made
    its last batch while the trainer still trains; the run ends normally."""
    tr = Trainer(config.load("tiny", None, {**OVER, "train.iterations": 4}), tmp_path / "run")

    def slow(i):
        time.sleep(2.0)
        return contextlib.nullcontext()

    rows = tr.run(on_iteration=slow)
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert not tr.batches.proc.is_alive()


def _start(tmp_path, name, *extra):
    cmd = [sys.executable, "-m", "freshper.trainer.cli", "train", "--preset", "tiny", "--train.iterations", "400",
           "--train.run_dir", str(tmp_path / "runs"), "--train.name", name, "--train.checkpoint_every", "1000",
           "--rollout.asynchronous", "true", "--rollout.worker_threads", "1", "--train.threads", "1", *extra]
    env = {**os.environ, "FRESHPER_CACHE": os.environ.get("FRESHPER_CACHE", str(tmp_path / "cache"))}
    log = open(tmp_path / f"{name}.err", "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True, env=env)
    return proc, tmp_path / f"{name}.err", env


def _wait_for(path, pattern, proc, seconds=240):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = re.search(pattern, path.read_text())
        if m:
            return m
        assert proc.poll() is None, path.read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} not seen: " + path.read_text()[-3000:])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_stops_both_processes_and_the_run_resumes(tmp_path, spawned, sig):
    proc, err, env = _start(tmp_path, "run")
    spawned.append(proc)
    pid = int(_wait_for(err, r"generation worker started \(pid (\d+)\)", proc).group(1))
    _wait_for(err, r" INFO iter 2 ", proc)
    proc.send_signal(sig)
    proc.wait(timeout=120)
    text = err.read_text()
    assert proc.returncode == 130, text[-2000:]
    assert "Traceback" not in text
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), "the generation worker outlived the trainer"
    m = re.search(r"(\d+) episodes generated, (\d+) of them in flight and discarded", text)
    run = tmp_path / "runs" / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = sum(r.get("episodes_generated", 0) for r in rows)
    assert m and int(m.group(1)) - int(m.group(2)) <= trained <= int(m.group(1)), "every episode accounted for"
    n = len(rows)
    done = subprocess.run([sys.executable, "-m", "freshper.trainer.cli", "train", "--resume", str(run),
                           "--train.iterations", str(n + 2)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()] == \
        list(range(n + 2))


def test_a_killed_trainer_takes_its_worker_with_it(tmp_path, spawned):
    proc, err, _ = _start(tmp_path, "run")
    spawned.append(proc)
    pid = int(_wait_for(err, r"generation worker started \(pid (\d+)\)", proc).group(1))
    proc.kill()
    proc.wait(timeout=60)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), "an orphaned generation worker"


def test_asynchronous_generation_is_refused_on_several_ranks():
    from freshper.trainer.dist import check_world

    with pytest.raises(ValueError, match="rollout.asynchronous runs one generation worker"):
        check_world(config.load("tiny", None, {"rollout.asynchronous": True}), 2)

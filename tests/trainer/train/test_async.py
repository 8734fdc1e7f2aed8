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
import threading
import time

import pytest
import torch

from freshper.trainer import config
from freshper.trainer.train import async_worker
from freshper.trainer.train.async_worker import AsyncBatches, GenerationWorkerDied
from freshper.trainer.train.loop import Trainer
from freshper.trainer.train.seeding import group_seeds

from .premise import assert_updates

# Every test here starts a worker process: a hang (a trainer waiting for a dead worker) fails the
# test by its name within this many seconds instead of stalling the suite; the slowest took 70 s
# on a 2-core machine shared with three other test runs. The command-line tests have their own.
pytestmark = pytest.mark.timeout(240)

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


def wait_until(done, what: str, seconds: float = 120) -> None:
    """Poll `done()` until it holds; a condition that never comes fails here, naming it."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_worker_that_fails_with_its_queue_full_stops_the_run_with_its_error(tmp_path, monkeypatch):
    """The worker's error reaches the user even while its queue is full (the trainer in a long
    validation or checkpoint): at max_lag 1 batch 0 fills the queue and batch 1's environment
    raises while the trainer is held before its first take."""
    over = {**OVER, "rollout.max_lag": 1, "env.name": "tests.trainer.train.failing_env:FailingLake"}
    cfg = config.load("tiny", None, over)
    batch_1 = group_seeds(cfg.train.seed, 1, cfg.rollout.episodes // cfg.rollout.group_size)
    monkeypatch.setenv("FRESHPER_TEST_FAIL_SEEDS", ",".join(map(str, batch_1)))
    tr = Trainer(cfg, tmp_path / "run")

    def held_until_the_worker_is_gone(i):
        if i == 0:
            wait_until(lambda: not tr.batches.proc.is_alive(), "the worker never failed")
        return contextlib.nullcontext()

    with pytest.raises(GenerationWorkerDied, match="the generation worker failed: ValueError: FailingLake has no "
                                                   f"initial state {batch_1[0]}"):
        tr.run(on_iteration=held_until_the_worker_is_gone)
    assert (tmp_path / "run" / "checkpoints" / "iter_000001").is_dir(), "batch 0 trained, then the checkpoint"
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


@pytest.mark.timeout(120)
def test_a_worker_killed_holding_the_weights_lock_stops_the_run(tmp_path):
    """A worker killed while it copies the weights never releases their lock: the trainer's next
    publish must see it dead instead of waiting for the lock forever (the lock is held here by a
    thread of this process, as the dead worker would hold it, and the worker is killed)."""
    tr = Trainer(config.load("tiny", None, {**OVER, "train.iterations": 50, "train.checkpoint_every": 1000}),
                 tmp_path / "run")
    release = threading.Event()

    def hold(lock, held):
        with lock:
            held.set()
            release.wait()

    def kill_holding_the_lock_at_2(i):
        if i == 2:  # with batches 2 and 3 made: iteration 2 trains, and publishes with the lock held
            wait_until(lambda: tr.batches.counts.made >= 4 * 8, "batch 3 never made")
            held = threading.Event()
            threading.Thread(target=hold, args=(tr.batches.weights._version.get_lock(), held), daemon=True).start()
            held.wait()
            os.kill(tr.batches.proc.pid, signal.SIGKILL)
            tr.batches.proc.join()
        return contextlib.nullcontext()

    try:
        with pytest.raises(GenerationWorkerDied, match="died .*exit code -9"):
            tr.run(on_iteration=kill_holding_the_lock_at_2)
    finally:
        release.set()
    saved = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("iter_*"))
    assert saved and int(saved[-1][5:]) >= 3, saved


def test_every_episode_generated_is_trained_or_counted_discarded(tmp_path, caplog):
    """A run stopped with batches in flight: the episodes the log says were generated are those
    trained plus those it says were discarded, and the last row's in-flight count has the
    batches the worker made ahead (spooled before they reached the trainer)."""
    tr = Trainer(config.load("tiny", None, {**OVER, "train.iterations": 50, "train.checkpoint_every": 1000}),
                 tmp_path / "run")

    def two_ahead_at_2(i):  # batch 4 needs the weights iteration 1 published: made ahead of take(2)
        if i == 2:
            wait_until(lambda: (tmp_path / "run" / ".batches" / "batch-0000004.pt").exists(), "batch 4 never made")
        return contextlib.nullcontext()

    with caplog.at_level("INFO", logger="freshper"):
        rows = tr.run(iterations=3, on_iteration=two_ahead_at_2)
    m = re.search(r"(\d+) episodes generated, (\d+) of them in flight and discarded", caplog.text)
    generated, discarded = int(m.group(1)), int(m.group(2))
    assert generated == rows[-1]["episodes"] + discarded and discarded >= 16
    assert rows[-1]["episodes_in_flight"] >= 16
    assert sum(r["episodes_generated"] for r in rows) == rows[-1]["episodes"] + rows[-1]["episodes_in_flight"]


def test_the_counts_at_close_include_what_a_dead_worker_left_in_its_queue(tmp_path):
    from freshper.trainer.model.load import load_policy

    cfg = config.load("tiny", None, {**OVER, "train.iterations": 2})
    model, _, _ = load_policy(cfg, torch.device("cpu"))
    b = AsyncBatches(cfg, model, 0, torch.device("cpu"), tmp_path / "spool")
    wait_until(lambda: b.out.qsize() == 2, "the worker never queued both batches")
    os.kill(b.proc.pid, signal.SIGKILL)
    b.proc.join()
    assert b.close() == 16 and b.generated == 16, "both batches generated, neither trained"


def test_the_workers_idle_time_counts_its_waits_for_room_in_its_queue(tmp_path):
    tr = Trainer(config.load("tiny", None, {**OVER, "train.iterations": 3}), tmp_path / "run")

    def full_queue_for_3_s(i):  # batches 0 and 1 fill it; batch 2 is made and waits for room
        if i == 0:
            wait_until(lambda: (tmp_path / "run" / ".batches" / "batch-0000002.pt").exists(), "batch 2 never made")
            time.sleep(3.0)
        return contextlib.nullcontext()

    rows = tr.run(on_iteration=full_queue_for_3_s)
    assert sum(r["worker_idle_s"] for r in rows) >= 2.9, [r["worker_idle_s"] for r in rows]


def test_the_trainers_engine_is_woken_and_synced_only_for_validation(tmp_path):
    """In an asynchronous run the trainer's own engine serves validation alone: no wake around
    each take, and its weights brought up to date before a validation, not after every update."""
    tr = Trainer(config.load("tiny", None, {**OVER, "eval.every": 2, "train.iterations": 4}), tmp_path / "run")
    calls = {"wake": 0, "sleep": 0, "sync_weights": 0}
    for name in calls:
        real = getattr(tr.engine, name)

        def counted(*a, _real=real, _name=name):
            calls[_name] += 1
            return _real(*a)

        setattr(tr.engine, name, counted)
    rows = tr.run()
    assert [r["iteration"] for r in rows if "eval_success" in r] == [0, 2] and "final_eval_success" in rows[-1]
    assert calls == {"wake": 3, "sleep": 4, "sync_weights": 2}, calls  # sleep: once as the worker starts


def test_the_workers_engine_stays_awake_between_batches(tmp_path, monkeypatch):
    """The worker (here its generating function, run in a thread of this process) never puts its
    engine to sleep between batches: that moves its weights to the host and back per batch."""
    import freshper.trainer.engines as engines
    from freshper.trainer.model.load import load_policy
    from freshper.trainer.train.shared_weights import SharedWeights

    made = []

    def make_engine(*a, **k):
        e = real_make(*a, **k)
        real_sleep = e.sleep
        e.sleep = lambda: (made.append("sleep"), real_sleep())
        return e

    real_make = engines.make_engine
    monkeypatch.setattr(engines, "make_engine", make_engine)
    cfg = config.load("tiny", None, {**OVER, "train.iterations": 2})
    ctx = torch.multiprocessing.get_context("spawn")
    model = load_policy(cfg, torch.device("cpu"))[0]
    weights = SharedWeights(model, ctx)
    weights.publish(model, 0)
    out, stop = ctx.Queue(2), ctx.Event()
    (tmp_path / "spool").mkdir()
    worker = threading.Thread(target=async_worker._generate, args=(
        cfg, weights, async_worker.WorkerCounts(ctx), out, str(tmp_path / "spool"), stop, 0, 2, torch.device("cpu")))
    worker.start()
    try:
        assert [out.get(timeout=120)[1] for _ in range(2)] == [0, 1]
    finally:
        stop.set()
        worker.join()
    assert made == [], "the engine slept between batches"


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
    """`freshper train` of the tiny preset, asynchronous, in a process group of its own (as a
    scheduler or a terminal starts it: a stop signal reaches the group)."""
    cmd = [sys.executable, "-m", "freshper.trainer.cli", "train", "--preset", "tiny", "--train.iterations", "400",
           "--train.run_dir", str(tmp_path / "runs"), "--train.name", name, "--train.checkpoint_every", "1000",
           "--rollout.asynchronous", "true", "--rollout.worker_threads", "1", "--train.threads", "1", *extra]
    env = {**os.environ, "FRESHPER_CACHE": os.environ.get("FRESHPER_CACHE", str(tmp_path / "cache"))}
    log = open(tmp_path / f"{name}.err", "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True, env=env, start_new_session=True)
    return proc, tmp_path / f"{name}.err", env


def _wait_for(path, pattern, proc, seconds=240):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = re.search(pattern, path.read_text())
        if m:
            return m
        assert proc.poll() is None, path.read_text()[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"{pattern!r} not seen: " + path.read_text()[-3000:])


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


def _clean(text: str) -> None:
    """What a run's stderr never holds: a traceback, the worker's loading bars (they would fill a
    scheduler's log), a semaphore the worker left registered."""
    assert "Traceback" not in text and "Loading weights" not in text and "leaked" not in text, text[-3000:]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_to_the_group_stops_both_processes_and_the_run_resumes(tmp_path, spawned, sig):
    proc, err, env = _start(tmp_path, "run")
    spawned.append(proc)
    pid = int(_wait_for(err, r"generation worker started \(pid (\d+)\)", proc).group(1))
    _wait_for(err, r" INFO iter 2 ", proc)
    os.killpg(proc.pid, sig)  # the trainer, its worker, and the resource tracker
    proc.wait(timeout=120)
    text = err.read_text()
    assert proc.returncode == 130, text[-2000:]
    _clean(text)
    # the worker ignored the signal and was stopped by the trainer (one that died of it, or raised
    # KeyboardInterrupt, would be reported even though the run stopped anyway)
    assert "generation worker died" not in text and "generation worker failed" not in text, text[-2000:]
    assert _gone(pid), "the generation worker outlived the trainer"
    m = re.search(r"(\d+) episodes generated, (\d+) of them in flight and discarded", text)
    run = tmp_path / "runs" / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = rows[-1]["episodes"]
    assert m and int(m.group(1)) == trained + int(m.group(2)), "every episode accounted for"
    n = len(rows)
    done = subprocess.run([sys.executable, "-m", "freshper.trainer.cli", "train", "--resume", str(run),
                           "--train.iterations", str(n + 2)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()] == \
        list(range(n + 2))
    again = subprocess.run([sys.executable, "-m", "freshper.trainer.cli", "train", "--resume", str(run)] +
                           ["--train.iterations", str(n + 2)], capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0 and "nothing to do" in again.stderr, again.stderr[-2000:]
    assert "generation worker started" not in again.stderr, "a finished run starts no worker"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_the_worker_starts_stops_the_run_as_mid_run(tmp_path, spawned, sig):
    """A scheduler's stop signal to the group in the worker's first second (it is still importing):
    the run stops as it does mid-run, after its first iteration, with exit 130."""
    proc, err, _ = _start(tmp_path, "run")
    spawned.append(proc)
    pid = int(_wait_for(err, r"generation worker started \(pid (\d+)\)", proc).group(1))
    os.killpg(proc.pid, sig)
    proc.wait(timeout=240)
    text = err.read_text()
    assert proc.returncode == 130 and "died" not in text, text[-2000:]
    _clean(text)
    assert _gone(pid), "the generation worker outlived the trainer"
    assert (tmp_path / "runs" / "run" / "checkpoints" / "iter_000001").is_dir()


@pytest.mark.timeout(300)
def test_a_killed_worker_ends_the_command_in_one_line(tmp_path, spawned):
    proc, err, _ = _start(tmp_path, "run")
    spawned.append(proc)
    pid = int(_wait_for(err, r"generation worker started \(pid (\d+)\)", proc).group(1))
    _wait_for(err, r" INFO iter 1 ", proc)
    os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=120)
    text = err.read_text()
    assert proc.returncode == 3, text[-2000:]
    _clean(text)
    assert re.search(r"ERROR freshper train: stopped in iteration \d+: the generation worker died \(exit code -9\) "
                     r"without a word: killed, or out of memory; resume with: .*\n$", text), text[-2000:]


@pytest.mark.timeout(300)
def test_a_killed_trainer_takes_its_worker_with_it(tmp_path, spawned):
    proc, err, _ = _start(tmp_path, "run")
    spawned.append(proc)
    pid = int(_wait_for(err, r"generation worker started \(pid (\d+)\)", proc).group(1))
    proc.kill()
    proc.wait(timeout=60)
    assert _gone(pid), "an orphaned generation worker"


def test_a_worker_device_this_machine_lacks_is_refused_before_anything_is_written(tmp_path):
    proc, err, _ = _start(tmp_path, "run", "--rollout.worker_device", "cuda:7")
    proc.wait(timeout=120)
    text = err.read_text()
    assert proc.returncode == 2 and "rollout.worker_device='cuda:7': this machine has" in text, text[-2000:]
    assert not (tmp_path / "runs").exists()


def test_asynchronous_generation_is_refused_on_several_ranks():
    from freshper.trainer.dist import check_world

    with pytest.raises(ValueError, match="rollout.asynchronous runs one generation worker"):
        check_world(config.load("tiny", None, {"rollout.asynchronous": True}), 2)

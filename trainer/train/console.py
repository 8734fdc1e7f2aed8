"""What a run prints and how it stops: the progress lines of train.log (and whether a bar is
drawn), the closing summary, and the SIGINT/SIGTERM handler that finishes the iteration in
progress before a checkpoint."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("freshper")


def on_terminal() -> bool:
    """Whether stderr, where the log and the progress bar go, is a terminal: in a file
    (`freshper train > log 2>&1`) a bar's redraws would interleave with every log line."""
    import sys

    return sys.stderr.isatty()


def progress_line(row: dict) -> str:
    """One line of a run's progress for train.log."""
    line = (f"iter {row['iteration']}  env_steps {row['env_steps']}  reward {row['reward']:.3f}  "
            f"success {row['success']:.3f}  " + (f"loss {row['loss']:.4f}" if "loss" in row else  # gated
                                                  f"batch dropped (age {row.get('batch_age')})"))
    if "replay_singleton_frac" in row:
        line += f"  replay age {row['replay_age_mean']:.1f}  singletons {row['replay_singleton_frac']:.2f}"
    for key in ("eval_success", "final_eval_success"):
        if key in row:
            line += f"  {key} {row[key]:.3f}"
    return line


def summary(rows: list[dict], iterations: int, env_steps: int, seconds: float, run_dir: Path, png, n_eval: int) -> str:
    """The closing lines of a run: what was trained, the first, final and best validation (95%
    intervals over the validation states, as evaluate() measured them), where things are. The
    best ranks every validation, the final one (after the last iteration) too; it is left out
    when there is only one validation to rank."""
    wall = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
    lines = [f"done: {iterations} iterations, {env_steps} env steps, {wall} wall"]
    evals = [(f"before iteration {r['iteration']}", r["eval_success"], r["eval_success_ci95"])
             for r in rows if "eval_success" in r]
    if evals and "eval_success" in rows[0] and rows[0]["iteration"] == 0:
        lines.append(f"eval success before training {evals[0][1]:.3f} ± {evals[0][2]:.3f} (95%, {n_eval} replies)")
    final = rows[-1].get("final_eval_success")
    if final is not None:
        half = rows[-1]["final_eval_success_ci95"]
        lines.append(f"final eval success {final:.3f} ± {half:.3f} (95%, {n_eval} replies)")
        evals.append(("the final validation", final, half))
    if len(evals) > 1:
        when, best, half = max(evals, key=lambda e: e[1])
        lines.append(f"best eval success {best:.3f} ± {half:.3f} ({when})")
    lines.append(f"outputs: {run_dir}/metrics.jsonl, {png or 'no plot'}, {run_dir}/checkpoints")
    return "\n  ".join(lines)


class stop_on_signals:
    """While training: the first SIGINT or SIGTERM asks the loop to stop after the iteration in
    progress (the state stays consistent, so the checkpoint resumes exactly); a second one of
    either raises KeyboardInterrupt (abort, no checkpoint), and so does a watchdog when the
    iteration is still running `grace` seconds after the first (a stuck iteration: a hung
    environment or engine): a process manager's SIGTERM then ends the run without waiting for
    its SIGKILL. The watchdog interrupts Python code; a wait inside C code ends when it returns.
    It times iterations only: a checkpoint written under `unwatched()` (the loop's, after the
    iteration a stop let finish) takes what it takes, since aborting it loses the very checkpoint
    the stop asked for. Only in the main thread, where Python delivers signals."""

    def __init__(self, trainer, grace: float | None = None):
        self.trainer = trainer
        self.grace = grace
        self.timer = None
        self.paused = False
        self.notice = None

    def __enter__(self):
        import signal
        import threading

        self.saved = {}
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.saved[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        import signal
        import threading

        if self.trainer.interrupted:
            raise KeyboardInterrupt
        self.trainer.interrupted = True
        # Not logged here: the signal may land inside a log line's write, and writing to the same
        # stream from within it fails ("reentrant call"; logging prints a traceback). A thread
        # waits for the handler's lock, so the line follows the one being written.
        notice = threading.Thread(target=log.warning, name="stop-notice", args=(
            "%s: finishing iteration %d, then writing a checkpoint (Ctrl-C or SIGTERM again to abort without one%s)",
            signal.Signals(signum).name, self.trainer.iteration,
            f"; aborted if still running in {self.grace:g} s" if self.grace else ""))
        notice.start()
        self.notice = notice  # only once started: a second signal inside start() leaves nothing to join
        if self.grace and not self.paused:
            self.timer = threading.Timer(self.grace, self._stuck, args=(self.trainer.iteration,))
            self.timer.daemon = True
            self.timer.start()

    def _stuck(self, iteration: int) -> None:
        import _thread

        log.error("iteration %d still running %g s after the stop signal: aborting without a checkpoint (the "
                  "latest one stays)", iteration, self.grace)
        _thread.interrupt_main()  # runs _handle in the main thread, which raises KeyboardInterrupt

    @contextmanager
    def unwatched(self):
        """A stretch the watchdog does not time (a checkpoint being written): a running watchdog
        is stopped, and a first stop signal within starts none; a second signal still aborts."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.paused = True
        try:
            yield
        finally:
            self.paused = False

    def __exit__(self, *exc):
        import signal

        if self.timer is not None:
            self.timer.cancel()
        try:
            if self.notice is not None:  # its line is written before the run's closing lines
                self.notice.join(timeout=10)
        finally:  # a signal during the join still leaves the caller's handlers in place
            for sig, handler in self.saved.items():
                signal.signal(sig, handler)
        return False

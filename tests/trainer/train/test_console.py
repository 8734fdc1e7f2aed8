"""What a run prints when it ends (trainer/train/console.py's summary) and where its progress goes
(a bar on a terminal, one line an iteration in a log file)."""
from pathlib import Path

from freshper.trainer.train.console import summary


def _rows(in_loop: dict[int, float], final: float | None, iterations: int) -> list[dict]:
    rows = []
    for it in range(iterations):
        row = {"iteration": it}
        if it in in_loop:
            row.update(eval_success=in_loop[it], eval_success_ci95=0.1)
        rows.append(row)
    if final is not None:
        rows[-1].update(final_eval_success=final, final_eval_success_ci95=0.134)
    return rows


def _lines(rows) -> list[str]:
    return summary(rows, len(rows), 100, 30.0, Path("runs/x"), None, 128).split("\n  ")


def test_the_best_validation_ranks_the_final_one_too():
    """Issue 77, defect 7: the default job validates before iteration 0 and after the last; its
    summary called the untrained model's 0.117 the best beside a final 0.805."""
    lines = _lines(_rows({0: 0.117}, 0.805, 15))
    assert "final eval success 0.805 ± 0.134 (95%, 128 replies)" in lines
    assert "best eval success 0.805 ± 0.134 (the final validation)" in lines
    assert not any(line.startswith("best eval success 0.117") for line in lines)


def test_an_in_loop_validation_above_the_final_one_is_the_best():
    lines = _lines(_rows({0: 0.1, 5: 0.9, 10: 0.4}, 0.5, 15))
    assert "best eval success 0.900 ± 0.100 (before iteration 5)" in lines


def test_one_validation_has_no_best_line():
    assert not any(line.startswith("best eval success") for line in _lines(_rows({0: 0.2}, None, 3)))
    assert not any(line.startswith("best eval success") for line in _lines(_rows({}, 0.6, 3)))


def _run(tmp_path, name: str):
    from freshper.trainer import config
    from freshper.trainer.train.loop import Trainer

    cfg = config.load("tiny", None, {"train.iterations": 3, "train.sft_steps": 0, "eval.every": 0,
                                     "train.progress": True})
    return Trainer(cfg, tmp_path / name)


def test_the_progress_bar_is_drawn_on_a_terminal_only(tmp_path, monkeypatch, capsys, caplog):
    """With stderr in a file (not a terminal) no bar is drawn and every iteration logs one line;
    on a terminal the bar is drawn. (A bar's redraws interleaved with the log lines of a file.)"""
    import logging

    import freshper.trainer.train.loop as L

    tr = _run(tmp_path, "run-logged-to-a-file")
    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger="freshper"):
        tr.run()
    err = capsys.readouterr().err
    assert "run-logged-to-a-file:" not in err, "the run's bar was drawn into a file"  # tqdm's "desc: 33%|..."
    assert [r.getMessage().split()[1] for r in caplog.records if r.getMessage().startswith("iter ")] == ["0", "1", "2"]
    monkeypatch.setattr(L, "on_terminal", lambda: True)
    bar = _run(tmp_path, "terminal")._progress_bar()
    assert bar is not None
    bar.close()


class _NonReentrantStream:
    """A stream that, like CPython's buffered stderr, fails when one thread enters its write twice,
    and that delivers a SIGINT during its first write: the signal handler then runs inside it."""

    def __init__(self):
        self.inside, self.text, self.signalled = False, [], False

    def write(self, s):
        import signal

        if self.inside:
            raise RuntimeError("reentrant call inside the stream")
        self.inside = True
        try:
            if not self.signalled:
                self.signalled = True
                signal.raise_signal(signal.SIGINT)  # Python runs the handler here, inside write
            self.text.append(s)
        finally:
            self.inside = False

    def flush(self):
        pass


def test_a_stop_signal_during_a_log_write_logs_without_reentering_the_stream(capsys):
    """A Ctrl-C that lands while a log line is being written must not make the handler write to
    the same stream from inside that write (logging would print a traceback to stderr)."""
    import logging

    from freshper.trainer.train.console import stop_on_signals

    class Owner:
        interrupted, iteration = False, 7

    stream = _NonReentrantStream()
    handler = logging.StreamHandler(stream)
    log = logging.getLogger("freshper")
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)  # setLevel, not .level: it also clears the logger's cached answers
    owner = Owner()
    try:
        with stop_on_signals(owner):
            log.info("a line being written")
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert owner.interrupted
    assert "Logging error" not in capsys.readouterr().err
    written = "".join(stream.text)
    assert "a line being written" in written
    assert "SIGINT: finishing iteration 7, then writing a checkpoint" in written

"""The console command without the trainer's extra: one line naming the extra, no traceback."""
from freshper.trainer import entry


def test_missing_extra_names_it(monkeypatch, capsys):
    real = entry.importlib.util.find_spec
    monkeypatch.setattr(entry.importlib.util, "find_spec", lambda m: None if m == "transformers" else real(m))
    assert entry.main(["train"]) == 2
    err = capsys.readouterr().err
    assert "missing: transformers" in err and "pip install 'freshper[train]'" in err


def test_with_the_extra_it_runs_the_cli(capsys):
    assert entry.main(["--help"]) == 0
    assert "freshper" in capsys.readouterr().out

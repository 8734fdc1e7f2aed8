"""`model.dtype auto` is resolved once, when a run starts, and recorded in its config.yaml: a
resume continues in that dtype on any machine, and a run folder that recorded only `auto` is
refused in one line (issue 77, defect 2)."""
import pytest
import torch
import yaml

from freshper.trainer import config
from freshper.trainer.model.load import record_dtype
from freshper.trainer.model.precision import CPU_BF16_ENV, compute_dtype
from freshper.trainer.train.loop import Trainer

CPU = torch.device("cpu")
TINY = {"train.iterations": 1, "train.sft_steps": 0}


@pytest.mark.parametrize("flag, name", [("0", "float32"), ("1", "bfloat16")])
def test_auto_resolves_to_the_machines_dtype_and_a_named_one_stays(monkeypatch, flag, name):
    monkeypatch.setenv(CPU_BF16_ENV, flag)
    assert record_dtype(config.load("tiny", None, TINY), CPU).model.dtype == name
    named = config.load("tiny", None, {**TINY, "model.dtype": "float32"})
    assert record_dtype(named, CPU) is named


def test_a_resume_keeps_the_recorded_dtype_on_a_bf16_cpu(tmp_path, monkeypatch):
    """The issue's case: a float32 run resumed where `auto` now means bf16 goes on in float32."""
    monkeypatch.setenv(CPU_BF16_ENV, "0")
    Trainer(config.load("tiny", None, TINY), tmp_path / "r").run()
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["model"]["dtype"] == "float32"
    monkeypatch.setenv(CPU_BF16_ENV, "1")  # the same run folder on an AVX512-BF16 CPU
    resumed = Trainer(config.load("tiny", None, {**TINY, "train.iterations": 2}), tmp_path / "r", resume=True)
    assert resumed.cfg.model.dtype == "float32" and compute_dtype(resumed.model) is None
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["model"]["dtype"] == "float32"


def test_a_run_that_recorded_only_auto_is_refused_in_one_line(tmp_path):
    run = tmp_path / "old"
    run.mkdir()
    (run / "config.yaml").write_text(config.to_yaml(config.load("tiny", None, TINY)))  # as runs before the record
    with pytest.raises(ValueError, match=r"^--resume .*model.dtype auto, which depends on the machine \(here "
                                         r"float32\) and was not recorded[^\n]*$"):
        record_dtype(config.load("tiny", None, TINY), CPU, run)

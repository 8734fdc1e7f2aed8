"""Shared by the TRL integration tests: the tiny math model, built once per session offline."""
import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    import os

    from freshper.trainer import config
    from freshper.trainer.model.load import build_tiny

    os.environ.setdefault("FRESHPER_CACHE", str(tmp_path_factory.mktemp("cache")))
    cfg = config.load("math-cpu", None, {"model.tiny_hidden": 64, "model.tiny_layers": 1, "model.tiny_vocab": 300})
    return str(build_tiny(cfg))

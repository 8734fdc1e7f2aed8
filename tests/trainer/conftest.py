"""Trainer tests build their tiny model and tokenizer once per session, in a temporary cache."""
import pytest


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("FRESHPER_CACHE", str(tmp_path_factory.mktemp("freshper-cache")))
    yield
    mp.undo()

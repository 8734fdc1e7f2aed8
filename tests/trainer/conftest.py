"""Trainer tests build their tiny model and tokenizer once per session, in a temporary cache."""
import pytest


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("FRESHPER_CACHE", str(tmp_path_factory.mktemp("freshper-cache")))
    yield
    mp.undo()


@pytest.fixture
def spawned():
    """The subprocesses a test starts (append each Popen): any still running when the test ends
    (an assertion failed before they stopped; test_interrupt's stuck runs are 100,000 iterations
    long) is killed, whatever happened."""
    procs = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)

"""Fixtures the tests share; the builders they share are in helpers.py."""
import pytest

from tracengine.trace.sinks import ListSink

# pytester runs user-style test files in temporary projects; tracengine.testing is the public plugin
pytest_plugins = ["pytester", "tracengine.testing"]


def pytest_collection_modifyitems(items):
    """A test that patches a core class or module (a scheduler change under test, a reference
    block manager swapped in) runs on the Python core only: the compiled core calls across its
    modules natively and never sees the patch. .ci/run runs them with TRACENGINE_PURE_PYTHON=1."""
    import tracengine.compiled as compiled
    if compiled.CORE != "yes":
        return
    skip = pytest.mark.skip(reason="patches the core: runs on the Python core (TRACENGINE_PURE_PYTHON=1)")
    for item in items:
        if item.get_closest_marker("patches_core"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def sweep_cache_dir(tmp_path_factory, monkeypatch):
    """Sweeps keep their rows in a result cache (sim/cache.py); a test's go to a directory of its
    own, never to the user's cache, and no test reads another's."""
    monkeypatch.setenv("TRACENGINE_CACHE_DIR", str(tmp_path_factory.mktemp("sweep-cache")))


@pytest.fixture
def sink():
    return ListSink()


@pytest.fixture(scope="module")
def one_torch_thread():
    # The tiny model's matmuls are too small to split: with other processes on
    # the same cores, a second OpenMP thread spin-waits and runs them 10x slower.
    import torch
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

"""Fixtures the tests share; the builders they share are in helpers.py."""
import pytest

from tracengine.trace.sinks import ListSink

# pytester runs user-style test files in temporary projects; tracengine.testing is the public plugin
pytest_plugins = ["pytester", "tracengine.testing"]


def pytest_collection_modifyitems(items):
    """SGLang's tests run last. Each SGLang scheduler a test builds stays alive in the process (its own
    components and watchdog thread hold it), and with it its gloo process groups' and ZMQ context's
    threads, hundreds by the end of those tests; their small periodic work keeps the process from
    looking idle, and Textual's pilot waits for an idle process at every pause (up to a second each),
    so TUI tests run after them take ten times as long.

    A test that patches a core class or module (a scheduler change under test, a reference
    block manager swapped in) runs on the Python core only: the compiled core calls across its
    modules natively and never sees the patch. .ci/run runs them with TRACENGINE_PURE_PYTHON=1."""
    items.sort(key=lambda item: item.path.name.startswith("test_sglang"))    # stable: the rest keep their order
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

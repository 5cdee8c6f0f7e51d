"""Fixtures the tests share; the builders they share are in helpers.py."""
import pytest

from tracengine.trace.events import ListSink

# pytester runs user-style test files in temporary projects; tracengine.testing is the public plugin
pytest_plugins = ["pytester", "tracengine.testing"]


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

"""The cycle collector paused around work that builds millions of long-lived objects that
make no reference cycle (a workload's prompts, a simulation's tokens): its passes over them,
triggered again and again as they grow, walk them all and free nothing. It is paused around
the batch commands in cli/main.py, and around a sweep's Ray tasks (sim/executors.py), which run
that work in processes of their own (a local sweep's workers are forked paused)."""
import gc
from contextlib import contextmanager


@contextmanager
def collector_paused():
    """The collector off inside, and on again after if it was on before (nesting is free)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()

"""Where a sweep's variants run: `local` worker processes (the default) or `ray` tasks,
on this machine or a cluster; `run_variants` puts the result cache in front of either.

Each variant travels as data (sim/spec.py: the sweep's spec, the variant, the source's
digest), never as a list of events, and returns its row. Ray gets the source's bytes once
per run (`ray.put`), each node fetches them once into its object store, and each worker
process reads them once, the first time it is sent the source, and keeps them. A variant
that runs past the timeout is stopped in its worker (an alarm, in the worker's main thread,
where local pools and Ray both run their tasks) and its row says so; the sweep goes on.
Each row is handed to `on_row` as it finishes (the cache keeps it at once), so a sweep
that is stopped keeps every row finished before."""
import multiprocessing
import os
import signal
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass

from tracengine.process.collector import collector_paused
from tracengine.errors import TracengineError
from tracengine.sim.cache import ResultCache, variant_key
from tracengine.sim.spec import PreparedSources, Source, SweepSpec, Variant, run_variant
from tracengine.sim.sweep import TIMED_OUT, is_timed_out

EXECUTORS = ("local", "ray")


class VariantTimeout(BaseException):
    """A variant ran past its limit. Not an Exception: no `except Exception` on the way may keep it."""


@contextmanager
def time_limit(seconds: float | None):
    if not seconds:
        yield
        return

    def on_alarm(signum, frame):
        raise VariantTimeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_one(spec: SweepSpec, source: Source, variant: Variant, timeout: float | None, prepared: PreparedSources,
            fetch=None) -> dict:
    """A variant's row, or {TIMED_OUT: timeout}. The source is read before the clock starts:
    the first variant of a worker is not charged for it."""
    prepared.runner(spec, source, fetch)
    try:
        with time_limit(timeout):
            return run_variant(spec, source, variant, prepared, fetch)
    except VariantTimeout:
        return {TIMED_OUT: timeout}


# -- local --------------------------------------------------------------------------------------

_LOCAL = None      # a local worker's (source, prepared), set by its initializer (forked: read already)
PR_SET_PDEATHSIG = 1     # linux/prctl.h


def _init_local(parent_pid: int, source: Source, prepared: PreparedSources):
    global _LOCAL
    _LOCAL = (source, prepared)
    _follow_parent(parent_pid)


def _follow_parent(parent_pid: int):
    """A worker stops with the process that started it. Ctrl-C reaches the whole process group:
    a worker ignores it and the parent stops its workers (a worker that took it would report
    the interrupt as its row and run the next variant). SIGTERM kills a worker, not the
    parent's handler a fork inherits. A parent that is killed takes its workers with it
    (Linux: the kernel's death signal; elsewhere a thread that watches the parent's pid)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            _watch_parent(parent_pid)
    else:
        _watch_parent(parent_pid)
    if os.getppid() != parent_pid:      # the parent died before the death signal was asked for
        os._exit(1)


def _watch_parent(parent_pid: int):
    def watch():
        while os.getppid() == parent_pid:
            threading.Event().wait(0.5)
        os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _stop_workers(pool: ProcessPoolExecutor):
    """Kills the pool's workers now, its running variants with them: their rows are not wanted
    any more. (No public handle on the processes before Python 3.14's `kill_workers`.)"""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        process.kill()
    for process in processes:
        process.join(1)
    pool.shutdown(wait=True, cancel_futures=True)


def _run_local(task) -> dict:
    spec, variant, timeout = task
    source, prepared = _LOCAL
    return run_one(spec, source, variant, timeout, prepared)


class LocalExecutor:
    """Worker processes on this machine, `jobs` of them (default one per core); one job runs
    the variants here, in order. Workers are forked from the process that read the source,
    so they read nothing again (where fork is missing, each reads the source's file once)."""
    name = "local"

    def __init__(self, jobs: int | None = None):
        self.jobs = jobs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def num_workers(self, num_variants: int) -> int:
        return max(1, min(self.jobs or os.cpu_count() or 1, num_variants))

    def run(self, spec: SweepSpec, source: Source, variants: list[Variant], timeout: float | None,
            prepared: PreparedSources, on_row=None) -> list[dict]:
        """Every variant's row, in order; `on_row(i, row)` as each finishes."""
        on_row = on_row or (lambda i, row: None)
        rows: list = [None] * len(variants)
        jobs = self.num_workers(len(variants))
        if jobs <= 1:
            for i, v in enumerate(variants):
                rows[i] = run_one(spec, source, v, timeout, prepared)
                on_row(i, rows[i])
            return rows
        fork = "fork" in multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if fork else "spawn")
        # forked, a worker has what this process read; spawned, it reads the source's file
        initargs = (os.getpid(), source, prepared if fork else PreparedSources())
        pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_local, initargs=initargs)
        try:
            pending = {pool.submit(_run_local, (spec, v, timeout)): i for i, v in enumerate(variants)}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    i = pending.pop(future)
                    rows[i] = future.result()
                    on_row(i, rows[i])
        except BaseException:        # Ctrl-C, SIGTERM, a variant's error: no worker runs on
            _stop_workers(pool)
            raise
        pool.shutdown()
        return rows


# -- ray ----------------------------------------------------------------------------------------


_RAY_WORKER = PreparedSources()     # a Ray worker process's: the last source it was sent


def _ray_task(spec: SweepSpec, source: Source, data_ref: list, variant: Variant, timeout: float | None) -> dict:
    """A variant in a Ray worker. `data_ref` holds the source bytes' ObjectRef in a list, so
    that Ray does not fetch them for every task: a worker that has read the source already
    never asks for them."""
    def fetch():
        import ray
        return ray.get(data_ref[0])
    with collector_paused():     # as around the command that sent it (process/collector.py)
        return run_one(spec, source, variant, timeout, _RAY_WORKER, fetch)


class RayExecutor:
    """Ray tasks, one CPU each: on the cluster at `address` (a head's host:port, or "auto" for
    the one this machine belongs to), or on a local one started for the run (`num_cpus`,
    default every core) and shut down after it. A process already connected keeps its cluster."""
    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None):
        self.address, self.num_cpus = address, num_cpus
        self.started = False
        self._refs: dict[str, object] = {}

    def __enter__(self):
        try:
            import ray
        except ImportError:
            raise TracengineError("--executor ray needs Ray: pip install 'tracengine[ray]'") from None
        if not ray.is_initialized():
            try:
                if self.address is None:    # "local": a new cluster, not one `ray start` left on this machine
                    ray.init(address="local", num_cpus=self.num_cpus, include_dashboard=False)
                else:
                    ray.init(address=self.address)
            except ConnectionError as exc:
                raise TracengineError(f"--ray-address {self.address}: {exc}") from None
            self.started = True
        return self

    def __exit__(self, *exc):
        if self.started:
            import ray
            ray.shutdown()
        self._refs.clear()

    def num_workers(self, num_variants: int) -> int:
        import ray
        return max(1, min(int(ray.cluster_resources().get("CPU", 1)), num_variants))

    def put(self, source: Source):
        """The source's bytes in the object store, once per run."""
        import ray
        if source.digest not in self._refs:
            self._refs[source.digest] = ray.put(source.read_bytes())
        return self._refs[source.digest]

    def run(self, spec: SweepSpec, source: Source, variants: list[Variant], timeout: float | None,
            prepared: PreparedSources, on_row=None) -> list[dict]:
        """`prepared`: this process's, which Ray workers do not share. `on_row`: as LocalExecutor's."""
        import ray
        task = ray.remote(_ray_task).options(num_cpus=1, max_retries=0)
        data_ref = [self.put(source)]
        refs = [task.remote(spec, source, data_ref, v, timeout) for v in variants]
        index = {ref: i for i, ref in enumerate(refs)}
        rows: list = [None] * len(variants)
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    rows[index[ref]] = ray.get(ref)
                    if on_row is not None:
                        on_row(index[ref], rows[index[ref]])
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, TracengineError):    # bad input, said as the local executor says it
                raise exc.cause from None
            raise
        return rows


def make_executor(name: str, jobs: int | None = None, address: str | None = None):
    if name == "local":
        if address is not None:
            raise TracengineError("--ray-address goes with --executor ray")
        return LocalExecutor(jobs)
    if name == "ray":
        return RayExecutor(address, jobs)
    raise TracengineError(f"--executor is one of {', '.join(EXECUTORS)}, got {name!r}")


# -- the cache in front -------------------------------------------------------------------------


@dataclass
class SweepRun:
    rows: list[dict]          # in the order of the variants
    num_cached: int           # rows read from the cache
    num_computed: int         # rows run now (timed-out ones included)


def run_variants(spec: SweepSpec, source: Source, variants: list[Variant], executor, prepared: PreparedSources,
                 cache: ResultCache | None = None, timeout: float | None = None) -> SweepRun:
    """Every variant's row: from `cache` where it has it, the rest run on `executor` and stored.
    `prepared`: the sweep's, with its source read (or read here). A variant that could never
    run is refused here, before any runs."""
    runner = prepared.runner(spec, source, None)
    for v in variants:
        runner.check(v.overrides)
    keys = [variant_key(spec, v) for v in variants] if cache is not None else [None] * len(variants)
    rows = [cache.get(k) if cache is not None else None for k in keys]
    todo = [i for i, row in enumerate(rows) if row is None]

    def keep(j: int, row: dict):      # as each row comes: a sweep stopped keeps what finished
        i = todo[j]
        rows[i] = row
        if cache is not None and not is_timed_out(row):
            cache.put(keys[i], spec, variants[i], row)
    if todo:
        executor.run(spec, source, [variants[i] for i in todo], timeout, prepared, keep)
    return SweepRun(rows, len(variants) - len(todo), len(todo))

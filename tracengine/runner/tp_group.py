"""Rank 0's side of a tensor-parallel group: it starts the worker processes
(ranks 1..N-1, with the spawn context), forms the process group with them,
hands each forward to them, watches them, and stops them.

The pipes are also the control and ack channel: a worker says hello once
it is up, and reports its exception before it exits. A worker waits for the
next step on its pipe, not inside a collective, so an idle engine times
nothing out; it exits when told, when the pipe closes, or when its parent
is gone."""
import atexit
import os
import signal
import threading
import time
from contextlib import contextmanager
from types import SimpleNamespace

import torch
import torch.multiprocessing as mp

from tracengine.engine.config import Config
from tracengine.errors import WorkerError
from tracengine.model.context import Context
from tracengine.runner.device import cpu_threads_per_rank
from tracengine.runner.tp_check import check_tensor_parallel
from tracengine.runner.tp_comm import COLLECTIVE_TIMEOUT_S, CollectiveError, Communicator, tcp_store
from tracengine.runner.tp_wire import EXIT_HEADER, encode_step
from tracengine.runner.tp_worker import worker_main

STARTUP_TIMEOUT_S = 300     # spawn, import torch, say hello
JOIN_S = 10                 # a worker's time to exit when told, before it is killed


class TensorParallelGroup:
    """Rank 0's side: the worker processes, their pipes and the process group.
    Built (and validated) before rank 0 builds its own model shard, so every
    rank loads at the same time; `close()` is idempotent and runs at exit."""

    def __init__(self, config: Config, hf_config, device: torch.device):
        check_tensor_parallel(config, hf_config, device)
        self.size = config.tensor_parallel_size
        self.device = device
        self.procs, self.conns = [], []
        self.failure: str | None = None   # set once a worker failed: the engine cannot go on
        self.activity = "start-up"        # what rank 0 is doing, for the failure message
        self.closed = False
        self.comm: Communicator | None = None
        self.said_hello: set[int] = set()   # workers (index into procs) whose hello has arrived
        # On the CPU the ranks share the cores: rank 0 takes its share, as each worker does, while
        # the group lives (all of them would leave its threads spinning against the workers').
        self.threads_before = torch.get_num_threads()
        if device.type == "cpu":
            torch.set_num_threads(cpu_threads_per_rank(self.size))
        atexit.register(self.close)
        try:
            self._start(config, hf_config)
        except BaseException:
            self.close()
            raise

    def _start(self, config: Config, hf_config):
        self.store = tcp_store(0, self.size, is_master=True)
        ctx = mp.get_context("spawn")
        for rank in range(1, self.size):
            parent_conn, child_conn = ctx.Pipe()
            proc = ctx.Process(target=worker_main, name=f"tracengine-tp-rank{rank}", daemon=True,
                               args=(config, _plain_config(hf_config), rank, self.store.port, child_conn,
                                     os.getpid()))
            proc.start()
            child_conn.close()
            self.procs.append(proc)
            self.conns.append(parent_conn)
        self._wait_for_hello()
        self.comm = self._join_group()

    def _wait_for_hello(self):
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while len(self.said_hello) < len(self.procs):
            failures = self._failures()   # reads the pipes: hellos are noted there
            if failures:
                raise WorkerError(f"{failures} during start-up (a script that starts the engine must do "
                                  f"so under `if __name__ == \"__main__\":`, as the workers import it)")
            if time.monotonic() > deadline:
                waiting = sorted(i + 1 for i in range(len(self.procs)) if i not in self.said_hello)
                raise WorkerError(f"tensor-parallel workers {waiting} did not start within {STARTUP_TIMEOUT_S} s")
            time.sleep(0.02)

    def _join_group(self) -> Communicator:
        """Rank 0's side of the process group's rendezvous. It blocks until
        every rank has joined, so it runs in a thread while this one watches
        the workers: a worker that dies before joining is a WorkerError at
        once, not a wait of COLLECTIVE_TIMEOUT_S."""
        built: dict = {}

        def build():
            try:
                built["comm"] = Communicator(self.store, 0, self.size, self.device)
            except Exception as exc:   # reported below, in the caller's thread
                built["error"] = exc

        thread = threading.Thread(target=build, name="tracengine-tp-rendezvous", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.05)
            failures = self._failures()
            if failures:
                raise WorkerError(f"{failures} while the ranks formed their process group")
        if "error" in built:
            error = built["error"]
            first_line = (str(error).strip().splitlines() or [""])[0][:300]
            raise WorkerError(f"the ranks could not form their process group: {type(error).__name__}: {first_line}")
        return built["comm"]

    def _receive(self, i: int):
        try:
            return self.conns[i].recv()
        except (EOFError, OSError):
            return None

    def _failures(self, wait_s: float = 0.0) -> str:
        """What went wrong with the workers, as one line; "" when all are well
        after `wait_s` (a dying worker takes a moment to be reaped). The one
        reader of the workers' pipes: a hello read here is noted in said_hello."""
        deadline = time.monotonic() + wait_s
        while True:
            found = []
            for i, (proc, conn) in enumerate(zip(self.procs, self.conns)):
                worker = f"tensor-parallel worker rank {i + 1} (pid {proc.pid})"
                message = None
                while not conn.closed and conn.poll():
                    received = self._receive(i)
                    if received is None:   # the pipe's end: the process exited
                        break
                    if received[0] == "hello":
                        self.said_hello.add(i)
                    else:
                        message = received
                if message and message[0] == "error":
                    found.append(f"{worker} failed: {message[1]}")
                elif proc.exitcode is not None:
                    found.append(f"{worker} {_describe_exit(proc.exitcode)}")
            if found or time.monotonic() >= deadline:
                # A worker killed outright is the cause; the others' errors are its echo.
                found.sort(key=lambda line: "failed:" in line)
                return "; ".join(found)
            time.sleep(0.05)

    def _fail(self, failures: str) -> WorkerError:
        self.failure = f"{failures} during {self.activity}; the engine must be closed"
        self._stop_workers(graceful=False)
        return WorkerError(self.failure)

    def send_step(self, input_ids: torch.Tensor, positions: torch.Tensor, context: Context):
        """Rank 0, before each forward: the workers run the same one."""
        if self.failure:
            raise WorkerError(self.failure)
        failures = self._failures()
        if failures:   # a worker gone while the engine was idle: never enter a collective without it
            raise self._fail(failures)
        header, payload = encode_step(input_ids, positions, context)
        try:
            for conn in self.conns:
                conn.send_bytes(header)
        except OSError:
            raise self._fail(self._failures(wait_s=2.0) or "a tensor-parallel worker closed its pipe") from None
        self.comm.forward_open = True
        self.comm.broadcast(payload)

    @contextmanager
    def guard(self, what: str):
        """Turn a collective that failed because a worker died (or hung past
        the timeout) into one WorkerError naming the worker and `what`."""
        if self.failure:
            raise WorkerError(self.failure)
        self.activity = what
        try:
            yield
        except WorkerError:
            raise
        except BaseException as exc:
            in_collective = isinstance(exc, CollectiveError)
            failures = self._failures(wait_s=2.0 if in_collective else 0.0)
            if failures:
                raise self._fail(failures) from exc
            if in_collective:
                first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                raise self._fail(f"a collective failed with every tensor-parallel worker alive "
                                 f"(one hung past {COLLECTIVE_TIMEOUT_S} s?): {first_line}") from exc
            if self.comm is not None and self.comm.forward_open:
                # The workers wait in a collective rank 0 will never join: this group is done.
                self._fail(f"rank 0 stopped mid-forward ({type(exc).__name__})")
            raise
        finally:
            self.activity = "a forward outside a step"

    def _stop_workers(self, graceful: bool):
        if graceful:
            for conn in self.conns:
                try:
                    conn.send_bytes(EXIT_HEADER)
                except OSError:
                    pass
            for proc in self.procs:
                proc.join(JOIN_S)
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
            proc.join()

    def close(self):
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        self._stop_workers(graceful=self.failure is None)
        for conn in self.conns:
            conn.close()
        if self.comm is not None:
            self.comm.close()
        self.store = None
        if self.device.type == "cpu":
            torch.set_num_threads(self.threads_before)


def _plain_config(hf_config):
    """The model config as plain attributes, which is all the model reads:
    unpickling a transformers config would import transformers in every
    worker, seconds of start-up."""
    to_dict = getattr(hf_config, "to_dict", None)
    if to_dict is None:
        return hf_config
    plain = SimpleNamespace(**to_dict())
    # and the other names the config answers to (Qwen3-MoE's num_experts is stored as num_local_experts)
    for alias, name in getattr(hf_config, "attribute_map", {}).items():
        setattr(plain, alias, getattr(hf_config, name))
    return plain


def _describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"

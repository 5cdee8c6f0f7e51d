"""Tensor parallelism over torch.distributed: rank 0 is the engine's own
process (scheduler, sampler, events); ranks 1..N-1 are worker processes,
started here with the spawn context, that hold their shard of the weights
and KV heads and run every forward in lockstep with rank 0.

Per step, rank 0 sends each worker a small header through its pipe (which
tensors, their dtypes and shapes; no pickle) and broadcasts the prepared
inputs (token ids, positions, cache slots, block tables) as one int64
tensor. The workers run the same forward; row-parallel layers all-reduce,
and the LM head gathers the logits to rank 0.

Each engine has its own process group object (`Communicator`), not
torch.distributed's process-wide default group: one process can hold several
engines, and a script's own torch.distributed setup is left alone.

The pipes are also the control and ack channel: a worker says hello once
it is up, and reports its exception before it exits. A worker waits for the
next step on its pipe, not inside a collective, so an idle engine times
nothing out; it exits when told, when the pipe closes, or when its parent
is gone. The rendezvous is a TCPStore on a port the OS picks at run time
(no fixed port, no shared-memory names): engines on one host never collide.
Backend: gloo on the CPU, NCCL on CUDA."""
import atexit
import os
import signal
import sys
import threading
import time
import traceback
from array import array
from contextlib import contextmanager
from dataclasses import fields
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tracengine.engine.config import Config
from tracengine.errors import ConfigError, WorkerError
from tracengine.runner.context import Context

# A collective waits at most this long for a rank that is alive but stuck;
# a rank that dies is noticed at once (its sockets close).
COLLECTIVE_TIMEOUT_S = 120
STARTUP_TIMEOUT_S = 300     # spawn, import torch, say hello
POLL_S = 0.5                # a worker's check that its parent lives, while idle
JOIN_S = 10                 # a worker's time to exit when told, before it is killed

OP_EXIT, OP_STEP = 0, 1
KIND_NONE, KIND_INT, KIND_TENSOR = 0, 1, 2
DTYPE_CODES = {torch.int64: 0, torch.int32: 1, torch.bool: 2}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
MAX_NDIM = 2
# Context fields sent to workers, in order; attention derives attn_metadata itself.
STEP_FIELDS = [f.name for f in fields(Context) if f.name != "attn_metadata"]


def check_tensor_parallel(config: Config, hf_config, device: torch.device):
    """Refuse, in one line, a layout this model or machine cannot run."""
    size = config.tensor_parallel_size
    if size == 1:
        return
    name = f"tensor_parallel_size={size}"
    num_heads, num_kv_heads = hf_config.num_attention_heads, hf_config.num_key_value_heads
    if num_heads % size:
        raise ConfigError(f"{name} does not divide the model's {num_heads} attention heads")
    if num_kv_heads % size and size % num_kv_heads:
        raise ConfigError(f"{name} and the model's {num_kv_heads} KV heads divide neither way "
                          f"(each rank needs whole KV heads, or a KV head replicated over whole ranks)")
    for what in ("intermediate_size", "vocab_size"):
        if getattr(hf_config, what) % size:
            raise ConfigError(f"{name} does not divide the model's {what} {getattr(hf_config, what)}")
    if not dist.is_available():
        raise ConfigError(f"{name} needs torch.distributed, which this torch build lacks")
    if device.type == "cuda":
        first, count = device.index or 0, torch.cuda.device_count()
        if first + size > count:
            raise ConfigError(f"{name} on {device} needs CUDA devices {first}..{first + size - 1}, "
                              f"but {count} exist")
        if not dist.is_nccl_available():
            raise ConfigError(f"{name} on CUDA needs NCCL, which this torch build lacks")
    elif device.type != "cpu":
        raise ConfigError(f"{name} runs on the CPU or CUDA, not {device}")
    elif not dist.is_gloo_available():
        raise ConfigError(f"{name} on the CPU needs gloo, which this torch build lacks")


def rank_device(device: torch.device, rank: int, size: int) -> torch.device:
    """Rank r runs on the r-th CUDA device from the configured one; the CPU is shared."""
    if device.type != "cuda" or size == 1:
        return device
    return torch.device("cuda", (device.index or 0) + rank)


class CollectiveError(RuntimeError):
    """A collective failed: a peer died, or one hung past the timeout."""


class Communicator:
    """This rank's collectives on the engine's own process group: gloo on
    the CPU, NCCL on CUDA. Rank 0 is the root of broadcast and gather."""

    def __init__(self, store, rank: int, size: int, device: torch.device):
        self.rank, self.size, self.device = rank, size, device
        self.forward_open = False   # rank 0: a step was sent and its logits not yet gathered
        timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(store, rank, size, options)
        else:
            self.pg = dist.ProcessGroupGloo(store, rank, size, timeout)

    def _wait(self, work):
        try:
            work.wait()
        except RuntimeError as exc:
            raise CollectiveError(str(exc)) from exc

    def all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM):
        options = dist.AllreduceOptions()
        options.reduceOp = op
        self._wait(self.pg.allreduce([t], options))

    def broadcast(self, t: torch.Tensor):
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self._wait(self.pg.broadcast([t], options))

    def gather(self, t: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's `t`, in rank order, on rank 0; None elsewhere."""
        options = dist.GatherOptions()
        options.rootRank = 0
        outputs = [[torch.empty_like(t) for _ in range(self.size)]] if self.rank == 0 else []
        self._wait(self.pg.gather(outputs, [t], options))
        self.forward_open = False   # the LM head's gather ends every forward
        return outputs[0] if outputs else None

    def min(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        self.all_reduce(t, dist.ReduceOp.MIN)
        return int(t.item())

    def close(self):
        try:
            self.pg.shutdown()
        except RuntimeError:   # a group whose peer is already gone
            pass
        self.pg = None


def cpu_threads_per_rank(size: int) -> int:
    return max(1, (os.cpu_count() or 1) // size)


def _store(port: int, size: int, is_master: bool) -> dist.TCPStore:
    # Port 0 on rank 0: the OS picks a free port, and the store listens on it
    # before any worker exists, so there is no race for it.
    return dist.TCPStore("127.0.0.1", port, size, is_master=is_master, wait_for_workers=False,
                         timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))


# --- the step, as a header and one int64 tensor ---------------------------

def encode_step(input_ids: torch.Tensor, positions: torch.Tensor, context: Context) -> tuple[bytes, torch.Tensor]:
    header = array("q", [OP_STEP])
    tensors = []
    for value in [input_ids, positions] + [getattr(context, name) for name in STEP_FIELDS]:
        if value is None:
            header.extend((KIND_NONE, 0, 0, 0, 0))
        elif isinstance(value, torch.Tensor):
            assert value.dtype in DTYPE_CODES and value.dim() <= MAX_NDIM, \
                f"cannot send {value.dtype}{tuple(value.shape)}"
            shape = list(value.shape) + [1] * (MAX_NDIM - value.dim())
            header.extend((KIND_TENSOR, DTYPE_CODES[value.dtype], value.dim(), *shape))
            tensors.append(value.reshape(-1).to(torch.int64))
        else:
            assert isinstance(value, int), f"cannot send a context field of type {type(value).__name__}"
            header.extend((KIND_INT, int(value), 0, 0, 0))
    return header.tobytes(), torch.cat(tensors)


def decode_step(header: bytes, comm: Communicator) -> tuple[torch.Tensor, torch.Tensor, Context]:
    """Receive the broadcast that follows `header` and rebuild the forward's inputs."""
    items = array("q", header)[1:]
    specs = [tuple(items[i:i + 5]) for i in range(0, len(items), 5)]
    numels = [d0 * d1 for kind, _, _, d0, d1 in specs if kind == KIND_TENSOR]
    payload = torch.empty(sum(numels), dtype=torch.int64, device=comm.device)
    comm.broadcast(payload)
    chunks = iter(payload.split(numels))
    values = []
    for kind, a, ndim, d0, d1 in specs:
        if kind == KIND_TENSOR:
            values.append(next(chunks).to(CODE_DTYPES[a]).view((d0, d1)[:ndim]))
        else:
            values.append(a if kind == KIND_INT else None)
    fields_ = dict(zip(STEP_FIELDS, values[2:]))
    fields_["is_prefill"] = bool(fields_["is_prefill"])
    return values[0], values[1], Context(**fields_)


# --- rank 0 ---------------------------------------------------------------

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
        self.store = _store(0, self.size, is_master=True)
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

    def _join_group(self) -> "Communicator":
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

    @property
    def pids(self) -> list[int]:
        """Worker pids, rank 1 first."""
        return [proc.pid for proc in self.procs]

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
            exit_header = array("q", [OP_EXIT]).tobytes()
            for conn in self.conns:
                try:
                    conn.send_bytes(exit_header)
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
    return SimpleNamespace(**to_dict()) if to_dict is not None else hf_config


def _describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


# --- ranks 1..N-1 ---------------------------------------------------------

def worker_main(config: Config, hf_config, rank: int, port: int, conn, parent_pid: int):
    """A worker process: join the group, build this rank's shard, then run
    each forward rank 0 sends until told to exit or rank 0 is gone."""
    conn.send(("hello",))
    try:
        from tracengine.runner.model_runner import ModelRunner, resolve_device
        size = config.tensor_parallel_size
        device = rank_device(resolve_device(config.device), rank, size)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:   # ranks share the cores
            torch.set_num_threads(cpu_threads_per_rank(size))
        comm = Communicator(_store(port, size, is_master=False), rank, size, device)
        runner = ModelRunner(config, hf_config, rank=rank, comm=comm)
        _serve(runner, comm, conn, parent_pid)
    except (EOFError, BrokenPipeError):   # rank 0 is gone: nobody to tell
        os._exit(0)
    except BaseException as exc:
        if os.getppid() != parent_pid:   # rank 0 died first: this is only the echo
            os._exit(0)
        traceback.print_exc()
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        try:
            conn.send(("error", f"{type(exc).__name__}: {first_line}".rstrip(": ")))
        except OSError:
            pass
        # No clean-up that could wait on a peer: the process exit closes every socket.
        sys.stderr.flush()
        os._exit(1)
    runner.exit()
    comm.close()
    conn.close()
    # Interpreter teardown of torch takes seconds and has nothing left to do.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _serve(runner, comm: Communicator, conn, parent_pid: int):
    while True:
        if not conn.poll(POLL_S):
            if os.getppid() != parent_pid:   # re-parented: rank 0 died without closing the pipe
                return
            continue
        header = conn.recv_bytes()
        if array("q", header[:8])[0] == OP_EXIT:
            return
        input_ids, positions, context = decode_step(header, comm)
        with torch.inference_mode():
            runner.run_model(input_ids, positions, context)

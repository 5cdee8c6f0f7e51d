"""A tensor-parallel worker process (ranks 1..N-1): it holds its shard of
the weights and KV heads and runs every forward rank 0 sends, in lockstep
with it, until told to exit or rank 0 is gone."""
import os
import sys
import traceback

import torch

from tracengine.engine.config import Config
from tracengine.runner.device import cpu_threads_per_rank, rank_device, resolve_device
from tracengine.runner.tp_comm import Communicator, tcp_store
from tracengine.runner.tp_wire import decode_step, is_exit

POLL_S = 0.5                # a worker's check that its parent lives, while idle


def worker_main(config: Config, hf_config, rank: int, port: int, conn, parent_pid: int):
    """The process's entry: join the group, build this rank's shard, then run
    each forward rank 0 sends until told to exit or rank 0 is gone."""
    conn.send(("hello",))
    try:
        # Imported here, after the hello: a model that fails to import is reported like any failure.
        from tracengine.runner.model_runner import ModelRunner
        size = config.tensor_parallel_size
        device = rank_device(resolve_device(config.device), rank, size)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:   # ranks share the cores
            torch.set_num_threads(cpu_threads_per_rank(size))
        comm = Communicator(tcp_store(port, size, is_master=False), rank, size, device)
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
        if is_exit(header):
            return
        input_ids, positions, context = decode_step(header, comm)
        with torch.inference_mode():
            runner.run_model(input_ids, positions, context)

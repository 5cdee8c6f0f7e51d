"""One rank's collectives on the engine's own process group (gloo on the
CPU, NCCL on CUDA), not torch.distributed's process-wide default group: one
process can hold several engines, and a script's own torch.distributed setup
is left alone. The rendezvous is a TCPStore on a port the OS picks at run
time (no fixed port, no shared-memory names): engines on one host never collide."""
from datetime import timedelta

import torch
import torch.distributed as dist

# A collective waits at most this long for a rank that is alive but stuck;
# a rank that dies is noticed at once (its sockets close).
COLLECTIVE_TIMEOUT_S = 120


class CollectiveError(RuntimeError):
    """A collective failed: a peer died, or one hung past the timeout."""


def tcp_store(port: int, size: int, is_master: bool) -> dist.TCPStore:
    # Port 0 on rank 0: the OS picks a free port, and the store listens on it
    # before any worker exists, so there is no race for it.
    return dist.TCPStore("127.0.0.1", port, size, is_master=is_master, wait_for_workers=False,
                         timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))


class Communicator:
    """This rank's collectives. Rank 0 is the root of broadcast and gather."""

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

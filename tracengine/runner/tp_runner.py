"""Tensor parallelism over torch.distributed: rank 0 is the engine's own
process (scheduler, sampler, events) and runs a TensorParallelRunner; ranks
1..N-1 are worker processes (tp_worker.py) that hold their shard of the
weights and KV heads and run every forward in lockstep with rank 0.

Per step, rank 0 sends each worker the prepared inputs (tp_wire.py: a pipe
header and one broadcast). The workers run the same forward; row-parallel
layers all-reduce, and the LM head gathers the logits to rank 0. The group
(tp_group.py) starts, watches and stops the workers; its collectives run on
the engine's own process group (tp_comm.py). Backend: gloo on the CPU, NCCL on CUDA."""
import torch

from tracengine.engine.config import Config
from tracengine.model.loader import load_hf_config, resolve_model_dir
from tracengine.model.context import Context
from tracengine.runner.device import resolve_device
from tracengine.runner.model_runner import ModelRunner
from tracengine.runner.tp_group import TensorParallelGroup


class TensorParallelRunner(ModelRunner):
    """Rank 0's runner: it owns the group, which is built (and the layout
    validated) before rank 0 builds its own shard, so every rank loads at the
    same time, and hands every forward to the workers before running it."""

    def __init__(self, config: Config, hf_config=None, use_cuda_graph: bool | None = None):
        if hf_config is None:
            hf_config = load_hf_config(resolve_model_dir(config.model))
        tp = TensorParallelGroup(config, hf_config, resolve_device(config.device))   # starts the workers
        try:
            with tp.guard("start-up"):   # in lockstep with the workers' own builds and warmups
                super().__init__(config, hf_config, use_cuda_graph, rank=0, comm=tp.comm)
        except BaseException:
            tp.close()
            raise
        self.tp = tp   # from here on, the workers run rank 0's forwards

    def run_model(self, input_ids: torch.Tensor, positions: torch.Tensor, context: Context) -> torch.Tensor:
        if self.tp is not None:
            self.tp.send_step(input_ids, positions, context)
        return super().run_model(input_ids, positions, context)

    def exit(self):
        super().exit()
        if self.tp is not None:
            self.tp.close()
            self.tp = self.comm = None

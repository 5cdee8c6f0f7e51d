"""Decode forwards replayed from CUDA graphs, one graph per batch-size bucket.

A decode batch is copied into static buffers, padded up to the next bucket
and replayed: padding rows write their K/V to the runner's scratch slot and
have context length 0. Block tables are as wide as max_model_len allows; a
batch that needs more columns, or more rows than the largest bucket, runs
eagerly instead. The LM head stays outside the graph (its output is
vocabulary-wide and only needed for the real rows).

On the CPU there is nothing to capture: the same buffers and buckets run
eagerly, which lets the tests check the padding on a machine without CUDA."""
import torch

from tracengine.model.context import Context, forward_context

MAX_GRAPH_BATCH_SIZE = 512


def graph_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16, and max_bs itself, so every
    batch size up to max_bs has a bucket."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_bs] + list(range(16, max_bs, 16))
    return sizes + [max_bs]


class CUDAGraphRunner:

    def __init__(self, model, max_num_seqs: int, max_num_blocks: int, hidden_size: int,
                 dtype: torch.dtype, device: torch.device, scratch_slot: int):
        self.model = model
        self.device = device
        self.max_bs = min(max_num_seqs, MAX_GRAPH_BATCH_SIZE)
        self.batch_sizes = graph_batch_sizes(self.max_bs)
        self.scratch_slot = scratch_slot
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((self.max_bs,), scratch_slot, dtype=torch.int64, device=device)
        self.context_lens = torch.zeros(self.max_bs, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(self.max_bs, max_num_blocks, dtype=torch.int32, device=device)
        self.outputs = torch.zeros(self.max_bs, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def _forward(self, bs: int):
        # A fresh Context each time: attention derives its mask inside the
        # forward, and under capture that derivation must be recorded too.
        context = Context(is_prefill=False, slot_mapping=self.slot_mapping[:bs],
                          context_lens=self.context_lens[:bs], block_tables=self.block_tables[:bs])
        with forward_context(context):
            self.outputs[:bs] = self.model(self.input_ids[:bs], self.positions[:bs])

    @torch.inference_mode()
    def capture(self):
        pool = None
        for bs in reversed(self.batch_sizes):   # largest first: the smaller graphs reuse its memory pool
            self._forward(bs)                   # warmup outside the capture (lazy allocations, kernel choice)
            if self.device.type != "cuda":
                continue
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool):
                self._forward(bs)
            if pool is None:
                pool = graph.pool()
            self.graphs[bs] = graph
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def can_run(self, num_seqs: int, num_blocks: int) -> bool:
        return num_seqs <= self.max_bs and num_blocks <= self.block_tables.size(1)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, context: Context) -> torch.Tensor:
        """Hidden states [num_seqs, hidden_size] of one decode batch."""
        bs = input_ids.size(0)
        padded_bs = next(b for b in self.batch_sizes if b >= bs)
        self.input_ids[:bs] = input_ids
        self.positions[:bs] = positions
        self.slot_mapping.fill_(self.scratch_slot)
        self.slot_mapping[:bs] = context.slot_mapping
        self.context_lens.zero_()
        self.context_lens[:bs] = context.context_lens
        # Columns past this batch's width keep stale block ids: valid indices,
        # and masked out by context_lens.
        self.block_tables[:bs, :context.block_tables.size(1)] = context.block_tables
        if self.device.type == "cuda":
            self.graphs[padded_bs].replay()
        else:
            self._forward(padded_bs)
        return self.outputs[:bs]

    def close(self):
        self.graphs.clear()

"""Linear and embedding layers laid out for tensor parallelism (Megatron
style): column-parallel layers keep their output sharded, row-parallel layers
all-reduce theirs, and the vocabulary is split across ranks. With one rank
every collective is skipped. Collectives go through the layout's
communicator (runner/tp_comm.py: `all_reduce(t)` in place, `gather(t)`
to rank 0), this engine's own process group, never torch.distributed's
default group: one process can hold several engines. Each parameter carries a `weight_loader` that
cuts its shard out of the full checkpoint tensor, so the loader stays generic.

A weight loader takes either a tensor or a safetensors slice (`get_slice`):
with a slice, a rank reads only the rows or columns of its shard."""
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

from tracengine.errors import ModelError

# (rank, size, communicator) of the layout a model is being built for; layers keep their own copy.
_TP_LAYOUT: ContextVar[tuple[int, int, object]] = ContextVar("tracengine_tp_layout", default=(0, 1, None))


def get_tp_rank_size() -> tuple[int, int]:
    """(rank, size) of the tensor-parallel layout being built; (0, 1) outside `tp_layout`."""
    return _TP_LAYOUT.get()[:2]


def get_tp_comm():
    """The communicator of the layout being built; None outside `tp_layout`."""
    return _TP_LAYOUT.get()[2]


@contextmanager
def tp_layout(rank: int, size: int, comm=None):
    """Layers constructed inside hold the shard of `rank` out of `size` and
    run their collectives on `comm` (required when size > 1)."""
    token = _TP_LAYOUT.set((rank, size, comm))
    try:
        yield
    finally:
        _TP_LAYOUT.reset(token)


def _layout(tp_rank: int | None, tp_size: int | None) -> tuple[int, int, object]:
    rank, size, comm = _TP_LAYOUT.get()
    return rank if tp_rank is None else tp_rank, size if tp_size is None else tp_size, comm


def divide(numerator: int, denominator: int) -> int:
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"
    return numerator // denominator


def local_num_kv_heads(total_num_kv_heads: int, tp_size: int) -> int:
    """KV heads per rank. With fewer KV heads than ranks each rank holds one,
    replicated over tp_size / total ranks (as vLLM does); the config check
    refuses counts that divide neither way."""
    if tp_size >= total_num_kv_heads:
        divide(tp_size, total_num_kv_heads)
        return 1
    return divide(total_num_kv_heads, tp_size)


def _shape(loaded) -> tuple[int, ...]:
    return tuple(loaded.shape) if isinstance(loaded, torch.Tensor) else tuple(loaded.get_shape())


def _narrow(loaded, dim: int, start: int, length: int):
    """loaded[start:start + length] along dim 0 or 1; a safetensors slice reads only those."""
    if isinstance(loaded, torch.Tensor):
        return loaded.narrow(dim, start, length)
    return loaded[start:start + length] if dim == 0 else loaded[:, start:start + length]


def copy_weight(param: torch.Tensor, loaded):
    # A checkpoint of another shape is a user's mistake, not a bug: say which shapes.
    if tuple(param.shape) != _shape(loaded):
        raise ModelError(f"weight of shape {_shape(loaded)} does not fit parameter of shape {tuple(param.shape)}")
    param.copy_(loaded if isinstance(loaded, torch.Tensor) else loaded[:])


def copy_shard(param: torch.Tensor, loaded, dim: int, start: int, full_size: int):
    """Copy rows (dim 0) or columns (dim 1) [start, start + param.size(dim)) of
    `loaded`, whose size along `dim` must be `full_size` (the unsharded layer's)."""
    full_shape = tuple(full_size if d == dim else n for d, n in enumerate(param.shape))
    if _shape(loaded) != full_shape:
        raise ModelError(f"weight of shape {_shape(loaded)} does not fit parameter of shape {full_shape}")
    param.copy_(_narrow(loaded, dim, start, param.size(dim)))


def default_weight_loader(param: nn.Parameter, loaded):
    copy_weight(param.data, loaded)


def _parameter(*shape: int) -> nn.Parameter:
    # Inference only: no gradients, and torch.empty because the loader fills every value.
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class LinearBase(nn.Module):
    """`input_size`/`output_size` are the full, unsharded sizes; `tp_dim` is
    the weight dimension split across ranks (0: outputs, 1: inputs, None:
    replicated), and the parameters hold this rank's shard."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, tp_dim: int | None = None,
                 tp_rank: int | None = None, tp_size: int | None = None):
        super().__init__()
        self.tp_rank, self.tp_size, self.comm = _layout(tp_rank, tp_size)
        self.tp_dim = tp_dim
        if tp_dim == 0:
            output_size = divide(output_size, self.tp_size)
        elif tp_dim == 1:
            input_size = divide(input_size, self.tp_size)
        self.weight = _parameter(output_size, input_size)
        self.weight.weight_loader = self.weight_loader
        if bias:
            # A row-parallel bias is not split: rank 0 adds it once, before the all-reduce.
            self.bias = _parameter(output_size)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor):
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ReplicatedLinear(LinearBase):
    """Every rank holds the whole weight (a MoE router: each rank routes alike)."""

    def weight_loader(self, param: nn.Parameter, loaded):
        copy_weight(param.data, loaded)


class ColumnParallelLinear(LinearBase):
    """Splits the output features; the output stays sharded (no gather)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, **tp):
        super().__init__(input_size, output_size, bias, tp_dim=0, **tp)

    def weight_loader(self, param: nn.Parameter, loaded):
        shard = param.size(0)
        copy_shard(param.data, loaded, 0, self.tp_rank * shard, shard * self.tp_size)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of one input in one matmul
    (gate_proj and up_proj -> gate_up_proj); `shard_id` indexes `output_sizes`."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False, **tp):
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, **tp)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: int):
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        copy_shard(param.data.narrow(0, offset, size), loaded, 0, self.tp_rank * size, self.output_sizes[shard_id])


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul. Each rank holds whole heads, laid
    out [q_local | k_local | v_local]; `shard_id` is "q", "k" or "v". With
    fewer KV heads than ranks, rank r holds KV head r * total_kv // tp_size:
    the one its query heads attend with."""

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: int | None = None, bias: bool = False, tp_rank: int | None = None,
                 tp_size: int | None = None):
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        tp_rank, tp_size, _ = _layout(tp_rank, tp_size)
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp_size)
        self.num_kv_heads = local_num_kv_heads(total_num_kv_heads, tp_size)
        self.kv_head_start = tp_rank * total_num_kv_heads // tp_size
        # LinearBase splits the output by tp_size; replicated KV heads make the
        # local rows more than a tp_size-th of the checkpoint's, so pass local * tp_size.
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp_size
        super().__init__(hidden_size, output_size, bias, tp_rank=tp_rank, tp_size=tp_size)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: str):
        q_size = self.num_heads * self.head_size
        kv_size = self.num_kv_heads * self.head_size
        offset, size = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[shard_id]
        if shard_id == "q":
            start, full_size = self.tp_rank * q_size, self.total_num_heads * self.head_size
        else:
            start, full_size = self.kv_head_start * self.head_size, self.total_num_kv_heads * self.head_size
        copy_shard(param.data.narrow(0, offset, size), loaded, 0, start, full_size)


class RowParallelLinear(LinearBase):
    """Splits the input features; partial outputs are summed across ranks
    (unless `reduce_results` is False: the caller sums several first, as the
    MoE block does with its experts' outputs)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True, **tp):
        super().__init__(input_size, output_size, bias, tp_dim=1, **tp)
        self.reduce_results = reduce_results

    def weight_loader(self, param: nn.Parameter, loaded):
        if param.dim() == 1:
            copy_weight(param.data, loaded)  # the bias
            return
        shard = param.size(1)
        copy_shard(param.data, loaded, 1, self.tp_rank * shard, shard * self.tp_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias if self.tp_rank == 0 else None)
        if self.tp_size > 1 and self.reduce_results:
            self.comm.all_reduce(y)
        return y


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous slice of the vocabulary's rows."""

    def __init__(self, num_embeddings: int, embedding_dim: int, tp_rank: int | None = None,
                 tp_size: int | None = None):
        super().__init__()
        self.tp_rank, self.tp_size, self.comm = _layout(tp_rank, tp_size)
        self.num_embeddings = num_embeddings
        self.num_embeddings_per_partition = divide(num_embeddings, self.tp_size)
        self.vocab_start_idx = self.num_embeddings_per_partition * self.tp_rank
        self.vocab_end_idx = self.vocab_start_idx + self.num_embeddings_per_partition
        self.weight = _parameter(self.num_embeddings_per_partition, embedding_dim)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded):
        shard = param.size(0)
        copy_shard(param.data, loaded, 0, self.tp_rank * shard, self.num_embeddings)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        # Ids owned by another rank look up row 0 and are zeroed; the all-reduce fills them in.
        owned = (input_ids >= self.vocab_start_idx) & (input_ids < self.vocab_end_idx)
        y = F.embedding((input_ids - self.vocab_start_idx) * owned, self.weight)
        y = y * owned.unsqueeze(1).to(y.dtype)
        self.comm.all_reduce(y)
        return y


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection onto the vocabulary, split like the embedding.
    Only rank 0 samples, so the logits are gathered there; other ranks get None."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        logits = F.linear(hidden, self.weight)
        if self.tp_size > 1:
            shards = self.comm.gather(logits)   # rank 0: every rank's slice of the vocabulary, in rank order
            logits = torch.cat(shards, -1) if shards is not None else None
        return logits

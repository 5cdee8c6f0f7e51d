"""Linear and embedding layers laid out for tensor parallelism (Megatron
style): column-parallel layers keep their output sharded, row-parallel layers
all-reduce theirs, and the vocabulary is split across ranks. With one rank
every collective is skipped. Each parameter carries a `weight_loader` that
cuts its shard out of the full checkpoint tensor, so the loader stays generic."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tracengine.errors import ModelError


def get_tp_rank_size() -> tuple[int, int]:
    """(rank, world size) of the tensor-parallel group; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def divide(numerator: int, denominator: int) -> int:
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"
    return numerator // denominator


def copy_weight(param: torch.Tensor, loaded: torch.Tensor):
    # A checkpoint of another shape is a user's mistake, not a bug: say which shapes.
    if param.shape != loaded.shape:
        raise ModelError(f"weight of shape {tuple(loaded.shape)} does not fit parameter of shape {tuple(param.shape)}")
    param.copy_(loaded)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor):
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
        rank, size = get_tp_rank_size()
        self.tp_rank = rank if tp_rank is None else tp_rank
        self.tp_size = size if tp_size is None else tp_size
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


class ColumnParallelLinear(LinearBase):
    """Splits the output features; the output stays sharded (no gather)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, **tp):
        super().__init__(input_size, output_size, bias, tp_dim=0, **tp)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor):
        shard = param.size(0)
        copy_weight(param.data, loaded.narrow(0, self.tp_rank * shard, shard))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of one input in one matmul
    (gate_proj and up_proj -> gate_up_proj); `shard_id` indexes `output_sizes`."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False, **tp):
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, **tp)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int):
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        copy_weight(param.data.narrow(0, offset, size), loaded.chunk(self.tp_size, 0)[self.tp_rank])


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul. Each rank holds whole heads, laid
    out [q_local | k_local | v_local]; `shard_id` is "q", "k" or "v"."""

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: int | None = None, bias: bool = False, **tp):
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        output_size = (total_num_heads + 2 * total_num_kv_heads) * head_size
        super().__init__(hidden_size, output_size, bias, **tp)
        self.num_heads = divide(total_num_heads, self.tp_size)
        self.num_kv_heads = divide(total_num_kv_heads, self.tp_size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str):
        q_size = self.num_heads * self.head_size
        kv_size = self.num_kv_heads * self.head_size
        offset, size = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[shard_id]
        copy_weight(param.data.narrow(0, offset, size), loaded.chunk(self.tp_size, 0)[self.tp_rank])


class RowParallelLinear(LinearBase):
    """Splits the input features; partial outputs are summed across ranks."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, **tp):
        super().__init__(input_size, output_size, bias, tp_dim=1, **tp)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor):
        if param.dim() == 1:
            copy_weight(param.data, loaded)  # the bias
            return
        shard = param.size(1)
        copy_weight(param.data, loaded.narrow(1, self.tp_rank * shard, shard))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias if self.tp_rank == 0 else None)
        if self.tp_size > 1:
            dist.all_reduce(y)
        return y


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous slice of the vocabulary's rows."""

    def __init__(self, num_embeddings: int, embedding_dim: int, tp_rank: int | None = None,
                 tp_size: int | None = None):
        super().__init__()
        rank, size = get_tp_rank_size()
        self.tp_rank = rank if tp_rank is None else tp_rank
        self.tp_size = size if tp_size is None else tp_size
        self.num_embeddings = num_embeddings
        self.num_embeddings_per_partition = divide(num_embeddings, self.tp_size)
        self.vocab_start_idx = self.num_embeddings_per_partition * self.tp_rank
        self.vocab_end_idx = self.vocab_start_idx + self.num_embeddings_per_partition
        self.weight = _parameter(self.num_embeddings_per_partition, embedding_dim)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor):
        shard = param.size(0)
        copy_weight(param.data, loaded.narrow(0, self.tp_rank * shard, shard))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        # Ids owned by another rank look up row 0 and are zeroed; the all-reduce fills them in.
        owned = (input_ids >= self.vocab_start_idx) & (input_ids < self.vocab_end_idx)
        y = F.embedding((input_ids - self.vocab_start_idx) * owned, self.weight)
        y = y * owned.unsqueeze(1).to(y.dtype)
        dist.all_reduce(y)
        return y


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection onto the vocabulary, split like the embedding."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight)
        if self.tp_size > 1:
            shards = [torch.empty_like(logits) for _ in range(self.tp_size)]
            dist.all_gather(shards, logits)
            logits = torch.cat(shards, -1)
        return logits

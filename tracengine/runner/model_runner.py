"""The model runner: turns scheduled sequences into tensors, runs the model
over the paged KV cache, and samples one token per sequence. It computes
what it is told and decides nothing; the scheduler owns the block tables.

Contract with the engine:
  prefill: computes tokens [num_cached_tokens, num_cached_tokens + num_scheduled_tokens)
           of each sequence, reading the cached prefix through its block table;
  decode:  computes each sequence's last token;
  both return one sampled token id per sequence."""
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from tracengine.engine.config import Config
from tracengine.errors import ConfigError
from tracengine.model.linear import local_num_kv_heads, tp_layout
from tracengine.model.loader import checkpoint_dtype, load_hf_config, load_model, resolve_model_dir
from tracengine.model.qwen3 import Qwen3ForCausalLM, head_dim_of
from tracengine.runner.attention import Attention, flash_attn_usable, kv_cache_shape
from tracengine.runner.context import Context, forward_context
from tracengine.runner.cuda_graph import MAX_GRAPH_BATCH_SIZE, CUDAGraphRunner
from tracengine.runner.distributed import TensorParallelGroup, rank_device
from tracengine.runner.sampler import Sampler, sample_seed
from tracengine.engine.sequence import Sequence

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# CPU default cache: room for max_model_len tokens of this many sequences.
CPU_CACHED_SEQS = 16
# Dense decode K/V copies on the CPU (Context.kv_copy_len): blocks of room past the batch's widest
# block table, and the memory they may take however small the KV cache.
KV_COPY_SPARE_BLOCKS = 2
KV_COPY_MIN_BUDGET = 256 << 20
# Rows of the copies whose sequence left the batch are still computed (masked) until a refill;
# past this share of the rows, the next decode refills instead.
KV_COPY_MAX_DEAD = 0.25
# Decode attention over the copies runs on row ranges of similar length, each only as wide as
# its longest sequence: at most this many ranges, of at least KV_COPY_BUCKET_ROWS rows each.
KV_COPY_BUCKETS = 8
KV_COPY_BUCKET_ROWS = 8
# Prefill attention on the CPU: at most this many grids of sequences of similar length, of at least
# PREFILL_GROUP_SEQS sequences each, once the longest sequence has PREFILL_GROUP_MIN_LEN tokens.
PREFILL_GROUPS = 8
PREFILL_GROUP_SEQS = 4
PREFILL_GROUP_MIN_LEN = 64


def even_ranges(n: int, num_ranges: int) -> list[tuple[int, int]]:
    """[0, n) cut into num_ranges (start, end) ranges of near-equal size."""
    bounds = [n * i // num_ranges for i in range(num_ranges + 1)]
    return list(zip(bounds, bounds[1:]))


@dataclass(slots=True)
class KVCopies:
    """Where each sequence of a CPU decode batch sits in the dense K/V copies.
    Rows are in order of context length when refilled; every sequence grows
    one token a step, so the order holds while the copies are kept."""
    row_by_key: dict           # (id(seq), seq_id) -> row, fixed at the refill and shared by later steps
    lens: list[int]            # per row: context length this step; 0 for a dead row (its sequence left)
    num_keys: int              # the copies' width in tokens
    row_of_seq: list[int]      # per sequence of the batch: its row
    seq_of_row: list[int]      # per row: its index in the batch (read only at a refill)
    reuse: bool
    buckets: tuple = ()        # ((first row, end row, keys to attend), ...)

    @classmethod
    def refill(cls, keys: list, context_lens: list[int], num_keys: int) -> "KVCopies":
        order = sorted(range(len(keys)), key=context_lens.__getitem__)
        row_of_seq = [0] * len(keys)
        for row, i in enumerate(order):
            row_of_seq[i] = row
        return cls({keys[i]: row for row, i in enumerate(order)}, [context_lens[i] for i in order], num_keys,
                   row_of_seq, order, False)._with_buckets()

    def advance(self, keys: list, context_lens: list[int]) -> "KVCopies | None":
        """The copies for the next step of (a subset of) the same batch, or None if they must be refilled."""
        num_rows = len(self.lens)
        if max(context_lens) > self.num_keys or num_rows - len(keys) > KV_COPY_MAX_DEAD * num_rows:
            return None
        lens = [0] * num_rows
        row_of_seq = []
        for key, n in zip(keys, context_lens):
            row = self.row_by_key.get(key)
            # A dead row has length 0: its sequence cannot come back one token longer.
            if row is None or n != self.lens[row] + 1:
                return None
            lens[row] = n
            row_of_seq.append(row)
        return KVCopies(self.row_by_key, lens, self.num_keys, row_of_seq, [], True)._with_buckets()

    def _with_buckets(self) -> "KVCopies":
        num_rows = len(self.lens)
        ranges = even_ranges(num_rows, max(1, min(KV_COPY_BUCKETS, num_rows // KV_COPY_BUCKET_ROWS)))
        widths = [max(self.lens[start:end]) for start, end in ranges]
        self.buckets = tuple((start, end, width) for (start, end), width in zip(ranges, widths) if width)
        return self


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} requested but CUDA is not available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"device {name!r} requested but only {torch.cuda.device_count()} CUDA devices exist")
    return device


def resolve_dtype(name: str, device: torch.device, hf_config) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    if device.type == "cpu":
        return torch.float32   # half-precision matmuls on the CPU are slow and no smaller in practice
    return checkpoint_dtype(hf_config) or torch.bfloat16


@contextmanager
def _default_dtype(dtype: torch.dtype):
    # Parameters are created with torch.empty; this gives them the model dtype
    # without a float32 copy first. Restored at once: no lasting global change.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class ModelRunner:

    def __init__(self, config: Config, hf_config=None, use_cuda_graph: bool | None = None, rank: int = 0,
                 comm=None):
        """`hf_config` defaults to the one in the model directory. CUDA graphs
        are used on CUDA unless `config.enforce_eager`; `use_cuda_graph=True`
        on the CPU runs the same bucketed decode path eagerly (for tests).
        With `config.tensor_parallel_size` > 1, rank 0 (this constructor's
        caller) starts the worker ranks (runner/distributed.py), which build
        their runners with `rank` > 0 and their `comm`, and sends them every forward."""
        self.config = config
        self.model_dir = resolve_model_dir(config.model)
        self.hf_config = hf_config if hf_config is not None else load_hf_config(self.model_dir)
        self.rank, self.tp_size = rank, config.tensor_parallel_size
        self.device = rank_device(resolve_device(config.device), rank, self.tp_size)
        self.comm = comm   # this rank's collectives (runner/distributed.py Communicator) when tp_size > 1
        self.tp = None     # rank 0's TensorParallelGroup, set once every rank is built
        if rank > 0 or self.tp_size == 1:
            self._build(use_cuda_graph)
            return
        tp = TensorParallelGroup(config, self.hf_config, self.device)   # validates, starts the workers
        self.comm = tp.comm
        try:
            with tp.guard("start-up"):
                self._build(use_cuda_graph)   # in lockstep with the workers' own builds
        except BaseException:
            tp.close()
            raise
        self.tp = tp

    def _build(self, use_cuda_graph: bool | None):
        config = self.config
        self.dtype = resolve_dtype(config.dtype, self.device, self.hf_config)
        self.block_size = config.kvcache_block_size
        self.max_model_len = min(config.max_model_len, self.hf_config.max_position_embeddings)
        with tp_layout(self.rank, self.tp_size, self.comm), _default_dtype(self.dtype), torch.device(self.device):
            self.model = Qwen3ForCausalLM(self.hf_config)
        load_model(self.model, self.model_dir)
        self.sampler = Sampler(self.device)
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.attention_backend = "flash" if flash_attn_usable(self.device, self.block_size) else "torch"
        for layer in self.attention_layers:
            layer.backend = self.attention_backend
        if use_cuda_graph is None:
            use_cuda_graph = self.device.type == "cuda" and not config.enforce_eager
        self.kv_cache = None
        self.scratch_slot = 0   # set by allocate_kv_cache; warmup forwards have no cache to store into

        if config.num_kvcache_blocks != -1:
            self.num_kvcache_blocks = config.num_kvcache_blocks
        elif self.device.type == "cuda":
            self.warmup_model(use_cuda_graph)
            self.num_kvcache_blocks = self.num_blocks_from_free_memory()
        else:
            self.num_kvcache_blocks = self.cpu_default_num_blocks()
        if self.tp_size > 1:   # each rank sized its own cache; the scheduler's count must fit every rank
            self.num_kvcache_blocks = self.comm.min(self.num_kvcache_blocks)
        self.allocate_kv_cache()
        self.graph_runner = None
        if use_cuda_graph:
            self.graph_runner = CUDAGraphRunner(self.model, config.max_num_seqs, self.max_num_blocks_per_seq,
                                                self.hf_config.hidden_size, self.dtype, self.device,
                                                self.scratch_slot)
            self.graph_runner.capture()

    # --- KV cache ---------------------------------------------------------

    @property
    def max_num_blocks_per_seq(self) -> int:
        return math.ceil(self.max_model_len / self.block_size)

    def _cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        num_kv_heads = local_num_kv_heads(self.hf_config.num_key_value_heads, self.tp_size)
        return (2, len(self.attention_layers)) + kv_cache_shape(self.attention_backend, num_blocks, self.block_size,
                                                                num_kv_heads, head_dim_of(self.hf_config))

    @property
    def block_bytes(self) -> int:
        return math.prod(self._cache_shape(1)) * self.dtype.itemsize

    def _assign_cache(self, kv_cache: torch.Tensor):
        for i, layer in enumerate(self.attention_layers):
            layer.k_cache, layer.v_cache = kv_cache[0, i], kv_cache[1, i]

    def _release_cache(self):
        for layer in self.attention_layers:
            layer.k_cache = layer.v_cache = torch.tensor([], dtype=self.dtype, device=self.device)

    def allocate_kv_cache(self):
        # One scratch block past the usable ones takes the K/V writes of
        # CUDA-graph padding rows. Zeroed: masked-out slots are still read,
        # and uninitialised memory could hold NaNs that a mask cannot hide.
        self.kv_cache = torch.zeros(self._cache_shape(self.num_kvcache_blocks + 1), dtype=self.dtype,
                                    device=self.device)
        self.scratch_slot = self.num_kvcache_blocks * self.block_size
        self._assign_cache(self.kv_cache)

    @torch.inference_mode()
    def warmup_model(self, use_cuda_graph: bool):
        """Run the largest forwards once so the peak activation memory is known
        before the KV cache takes what is left (CUDA only)."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        cfg = self.config
        seq_len = min(cfg.max_num_batched_tokens, self.max_model_len)
        num_seqs = max(1, min(cfg.max_num_batched_tokens // seq_len, cfg.max_num_seqs))
        self.compute_logits([self._dummy_seq(i, seq_len, []) for i in range(num_seqs)], True)
        if use_cuda_graph and self.attention_backend == "torch":
            # The torch decode gathers every sequence's keys up to the graph's
            # block-table width; a graph pool keeps that memory, so count it.
            self._assign_cache(torch.zeros(self._cache_shape(1), dtype=self.dtype, device=self.device))
            max_bs = min(cfg.max_num_seqs, MAX_GRAPH_BATCH_SIZE)
            width = self.max_num_blocks_per_seq
            self.compute_logits([self._dummy_seq(i, self.max_model_len, [0] * width, decode=True)
                                 for i in range(max_bs)], False)
            self._release_cache()
        torch.cuda.empty_cache()

    def _dummy_seq(self, seq_id: int, num_tokens: int, block_table: list[int], decode: bool = False) -> Sequence:
        seq = Sequence(seq_id, [0] * num_tokens, self.block_size)
        seq.block_table = block_table
        seq.num_scheduled_tokens = 1 if decode else num_tokens
        return seq

    def cpu_default_num_blocks(self) -> int:
        num_tokens = self.max_model_len * max(1, min(self.config.max_num_seqs, CPU_CACHED_SEQS))
        num_blocks = math.ceil(num_tokens / self.block_size)
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):   # no sysconf (Windows): trust the formula
            return num_blocks
        # A large model on a small machine: the cache takes at most a quarter of the memory.
        return max(1, min(num_blocks, memory // 4 // self.block_bytes))

    def num_blocks_from_free_memory(self) -> int:
        cfg = self.config
        free, total = torch.cuda.mem_get_info(self.device)
        stats = torch.cuda.memory_stats(self.device)
        # util * total, less memory torch does not hold, less the peak of the warmup.
        budget = total * cfg.gpu_memory_utilization - (total - free) - stats["allocated_bytes.all.peak"] \
            + stats["allocated_bytes.all.current"]
        num_blocks = int(budget) // self.block_bytes - 1   # less the scratch block
        if num_blocks <= 0:
            raise ConfigError(f"no GPU memory left for the KV cache at gpu_memory_utilization="
                              f"{cfg.gpu_memory_utilization} (budget {int(budget) >> 20} MiB, "
                              f"{self.block_bytes >> 10} KiB per block)")
        # Blocks past what max_num_seqs full-length sequences can hold are never used.
        return min(num_blocks, cfg.max_num_seqs * self.max_num_blocks_per_seq)

    # --- inputs -----------------------------------------------------------

    def _tensor(self, data: list, dtype: torch.dtype) -> torch.Tensor:
        on_cuda = self.device.type == "cuda"
        return torch.tensor(data, dtype=dtype, pin_memory=on_cuda).to(self.device, non_blocking=on_cuda)

    def _slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Cache slots of positions [start, end), one block's range at a time."""
        bs = self.block_size
        if not seq.block_table:   # a profiling forward: nothing to keep
            return [self.scratch_slot] * (end - start)
        assert len(seq.block_table) * bs >= end, f"seq {seq.seq_id}: block table too short for {end} tokens"
        slots = []
        for i in range(start // bs, (end + bs - 1) // bs):
            base = seq.block_table[i] * bs - i * bs
            slots.extend(range(base + max(start, i * bs), base + min(end, (i + 1) * bs)))
        return slots

    def prepare_block_tables(self, seqs: list[Sequence], width: int = 0) -> torch.Tensor:
        # Pad with block 0: a valid index for the gather, masked out by length.
        width = max(width, max(len(seq.block_table) for seq in seqs))
        return self._tensor([seq.block_table + [0] * (width - len(seq.block_table)) for seq in seqs], torch.int32)

    def prepare_prefill(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, Context]:
        self._kv_copies = None
        input_ids, positions, slot_mapping = [], [], []
        cu_seqlens_q, cu_seqlens_k = [0], [0]
        max_seqlen_q = max_seqlen_k = 0
        for seq in seqs:
            assert seq.block_size == self.block_size, f"seq {seq.seq_id}: block size {seq.block_size}"
            start, end = seq.num_cached_tokens, seq.num_cached_tokens + seq.num_scheduled_tokens
            assert start < end <= seq.num_tokens, f"seq {seq.seq_id}: cannot compute tokens [{start}, {end})"
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            cu_seqlens_q.append(cu_seqlens_q[-1] + end - start)
            cu_seqlens_k.append(cu_seqlens_k[-1] + end)
            max_seqlen_q, max_seqlen_k = max(max_seqlen_q, end - start), max(max_seqlen_k, end)
            slot_mapping.extend(self._slots(seq, start, end))
        # With a cached prefix anywhere (prefix hit or earlier chunk), keys are read through block tables.
        block_tables = self.prepare_block_tables(seqs) if cu_seqlens_k[-1] > cu_seqlens_q[-1] else None
        context = Context(True, self._tensor(cu_seqlens_q, torch.int32), self._tensor(cu_seqlens_k, torch.int32),
                          max_seqlen_q, max_seqlen_k, self._tensor(slot_mapping, torch.int64), None, block_tables)
        groups = self._plan_prefill_groups(cu_seqlens_q, cu_seqlens_k)
        if groups is not None:
            context.prefill_order = self._tensor(groups[0], torch.int64)
            context.prefill_groups = self._tensor(groups[1], torch.int64)
        return self._tensor(input_ids, torch.int64), self._tensor(positions, torch.int64), context

    def _plan_prefill_groups(self, cu_seqlens_q: list[int], cu_seqlens_k: list[int]) -> tuple | None:
        """Context.prefill_order and prefill_groups, or None for one grid. Only
        on the CPU (torch backend), where a causal grid costs the square of its
        longest sequence for every row: sequences sorted by length share grids
        in groups of PREFILL_GROUP_SEQS or more, at most PREFILL_GROUPS of them."""
        num_seqs = len(cu_seqlens_q) - 1
        num_groups = min(PREFILL_GROUPS, num_seqs // PREFILL_GROUP_SEQS)
        seqlen_q = [b - a for a, b in zip(cu_seqlens_q, cu_seqlens_q[1:])]
        seqlen_k = [b - a for a, b in zip(cu_seqlens_k, cu_seqlens_k[1:])]
        if (self.device.type != "cpu" or self.attention_backend != "torch" or num_groups < 2
                or max(seqlen_k) < PREFILL_GROUP_MIN_LEN):
            return None
        order = sorted(range(num_seqs), key=seqlen_k.__getitem__)
        groups = []
        for start, end in even_ranges(num_seqs, num_groups):
            members = order[start:end]
            groups.append((start, end, max(seqlen_q[i] for i in members), max(seqlen_k[i] for i in members),
                           sum(seqlen_q[i] for i in members)))
        return order, groups

    def prepare_decode(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, Context]:
        bs = self.block_size
        context_lens = [seq.num_tokens for seq in seqs]
        # Each sequence computes its last token, at position num_tokens - 1, into that position's slot.
        slot_mapping = [seq.block_table[(n - 1) // bs] * bs + (n - 1) % bs for seq, n in zip(seqs, context_lens)]
        context = Context(False, max_seqlen_k=max(context_lens), slot_mapping=self._tensor(slot_mapping, torch.int64),
                          context_lens=self._tensor(context_lens, torch.int32))
        copies = self._plan_kv_copies(seqs, context_lens)
        if copies is None:
            context.block_tables = self.prepare_block_tables(seqs)
        else:
            context.kv_copy_len, context.kv_copy_reuse = copies.num_keys, copies.reuse
            context.kv_copy_rows = self._tensor(copies.row_of_seq, torch.int64)
            context.kv_copy_lens = self._tensor([max(n, 1) for n in copies.lens], torch.int32)
            context.kv_copy_buckets = self._tensor(copies.buckets, torch.int64)
            if not copies.reuse:   # refilled in the copies' row order
                context.block_tables = self.prepare_block_tables([seqs[i] for i in copies.seq_of_row],
                                                                 copies.num_keys // bs)
        return (self._tensor([seq.last_token for seq in seqs], torch.int64),
                self._tensor([n - 1 for n in context_lens], torch.int64), context)

    # The dense K/V copies that decode attention keeps on the CPU (KVCopies); None after a prefill
    # or while they are not used.
    _kv_copies = None

    def _plan_kv_copies(self, seqs: list[Sequence], context_lens: list[int]) -> "KVCopies | None":
        """How this decode batch uses the dense K/V copies (Context.kv_copy_len),
        or None for no copies. Only on the CPU (eager, torch backend), where
        gathering every sequence's keys anew is a large share of a decode step;
        and only while the copies take no more memory than the KV cache (or
        KV_COPY_MIN_BUDGET). The copies are kept while the batch is the last
        one, one token longer, less sequences that left it (their rows stay,
        dead, until KV_COPY_MAX_DEAD of the rows are); otherwise refilled."""
        if self.device.type != "cpu" or self.attention_backend != "torch" or self.graph_runner is not None:
            return None
        keys = [(id(seq), seq.seq_id) for seq in seqs]
        last = self._kv_copies
        if last is not None:
            reused = last.advance(keys, context_lens)
            if reused is not None:
                self._kv_copies = reused
                return reused
        # Refilled with room to grow, so a steady batch refills once every KV_COPY_SPARE_BLOCKS blocks.
        width = max(len(seq.block_table) for seq in seqs)
        num_keys = max(width, min(width + KV_COPY_SPARE_BLOCKS, self.max_num_blocks_per_seq)) * self.block_size
        layer = self.attention_layers[0]
        nbytes = 2 * len(self.attention_layers) * len(seqs) * layer.num_kv_heads * num_keys * layer.head_dim \
            * self.dtype.itemsize
        if nbytes > max(self.kv_cache.nbytes, KV_COPY_MIN_BUDGET):
            self._kv_copies = None
            return None
        self._kv_copies = KVCopies.refill(keys, context_lens, num_keys)
        return self._kv_copies

    # --- forward ----------------------------------------------------------

    def run_model(self, input_ids: torch.Tensor, positions: torch.Tensor, context: Context) -> torch.Tensor:
        if self.tp is not None:   # rank 0 of a tensor-parallel group: the workers run this same forward
            self.tp.send_step(input_ids, positions, context)
        graphs = self.graph_runner
        if context.is_prefill or graphs is None or not graphs.can_run(input_ids.size(0),
                                                                    context.block_tables.size(1)):
            with forward_context(context):
                return self.model.compute_logits(self.model(input_ids, positions))
        return self.model.compute_logits(graphs.run(input_ids, positions, context))

    @torch.inference_mode()
    def compute_logits(self, seqs: list[Sequence], is_prefill: bool) -> torch.Tensor:
        """Next-token logits [num_seqs, vocab] of one step, before sampling."""
        input_ids, positions, context = (self.prepare_prefill if is_prefill else self.prepare_decode)(seqs)
        return self.run_model(input_ids, positions, context)

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[int]:
        logits = self.compute_logits(seqs, is_prefill)
        temperatures = [seq.temperature for seq in seqs]
        # Row seeds are hashed only when something is sampled: a greedy batch takes the argmax.
        seeds = ([sample_seed(self.config.seed, seq.seq_id, seq.num_tokens) for seq in seqs]
                 if any(t > 0 for t in temperatures) else [])
        return self.sampler(logits, temperatures, seeds).tolist()

    def exit(self):
        if self.graph_runner is not None:
            self.graph_runner.close()
            self.graph_runner = None
        self._release_cache()
        self.kv_cache = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        if self.tp is not None:
            self.tp.close()
            self.tp = self.comm = None

"""The model runner: turns scheduled sequences into tensors, runs the model
over the paged KV cache, and samples one token per sequence. It computes
what it is told and decides nothing; the scheduler owns the block tables.

Contract with the engine:
  prefill: computes tokens [num_cached_tokens, num_cached_tokens + num_scheduled_tokens)
           of each sequence, reading the cached prefix through its block table;
  decode:  computes each sequence's last token;
  both return one sampled token id per sequence. A sequence with drafts (`spec_token_ids`, which
  the scheduler cut to those it scheduled) computes its last token and its drafts and gets the
  token sampled after each of them: a list of 1 + its drafts. A decode step that verifies drafts
  runs on the CPU as a decode over the dense K/V copies (torch_plans.py), each sequence with 1 + its
  drafts queries; elsewhere, and beside a prefill, on the prefill path."""
import math
import os

import torch

from tracengine.engine.config import Config
from tracengine.engine.sequence import Sequence
from tracengine.errors import ConfigError
from tracengine.model.linear import tp_layout
from tracengine.model.attention import Attention
from tracengine.model.context import Context, forward_context
from tracengine.model.loader import load_hf_config, load_model, resolve_model_dir
from tracengine.model.registry import check_max_model_len, model_class
from tracengine.runner.attention import BACKENDS, kv_cache_shape
from tracengine.runner.kv_host import HostKVBuffer
from tracengine.runner.cuda_graph import MAX_GRAPH_BATCH_SIZE, CUDAGraphRunner
from tracengine.runner.device import available_memory, default_dtype, rank_device, resolve_device, resolve_dtype
from tracengine.runner.flash_backend import flash_attn_usable
from tracengine.runner.sampler import Sampler, row_seed
from tracengine.runner.torch_plans import KVCopyPlanner, prefill_groups

# CPU default cache: room for max_model_len tokens of this many sequences.
CPU_CACHED_SEQS = 16


class ModelRunner:
    tp = None   # rank 0's TensorParallelGroup, on a TensorParallelRunner (tp_runner.py)

    def __init__(self, config: Config, hf_config=None, use_cuda_graph: bool | None = None, rank: int = 0,
                 comm=None):
        """`hf_config` defaults to the one in the model directory. CUDA graphs
        are used on CUDA unless `config.enforce_eager` or the model's forward
        takes data-dependent paths (MoE routing); `use_cuda_graph=True`
        on the CPU runs the same bucketed decode path eagerly (for tests).
        With `config.tensor_parallel_size` > 1, each rank builds its shard
        with its `rank` and `comm` (tp_comm.py): rank 0 a TensorParallelRunner,
        the others in their worker process (tp_worker.py)."""
        self.config = config
        self.model_dir = resolve_model_dir(config.model)
        self.hf_config = hf_config if hf_config is not None else load_hf_config(self.model_dir)
        self.rank, self.tp_size, self.comm = rank, config.tensor_parallel_size, comm
        assert self.tp_size == 1 or comm is not None, "a tensor-parallel rank needs its communicator"
        self.device = rank_device(resolve_device(config.device), rank, self.tp_size)
        self.dtype = resolve_dtype(config.dtype, self.device, self.hf_config)
        self.block_size = config.kvcache_block_size
        self.max_model_len = min(config.max_model_len, self.hf_config.max_position_embeddings)
        check_max_model_len(self.hf_config, self.max_model_len)
        with tp_layout(rank, self.tp_size, comm), default_dtype(self.dtype), torch.device(self.device):
            self.model = model_class(self.hf_config)(self.hf_config)
        load_model(self.model, self.model_dir)
        self.sampler = Sampler(self.device)
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.attention_backend = "flash" if flash_attn_usable(self.device, self.block_size) else "torch"
        for layer in self.attention_layers:
            layer.backend = BACKENDS[self.attention_backend]
        if use_cuda_graph is None:
            use_cuda_graph = (self.device.type == "cuda" and not config.enforce_eager
                              and self.model.supports_cuda_graphs)
        self.kv_cache = None
        self.scratch_slot = 0   # set by allocate_kv_cache; warmup forwards have no cache to store into
        # The torch backend on the CPU plans its attention (torch_plans.py); the decode copies only when eager.
        self.cpu_plans = self.device.type == "cpu" and self.attention_backend == "torch"
        self.kv_copy_planner = None
        self.host_kv = None      # the CPU tier's host buffer (kv_host.py), made when a tier asks for it

        if config.num_kvcache_blocks != -1:
            self.num_kvcache_blocks = config.num_kvcache_blocks
        elif self.device.type == "cuda":
            self.warmup_model(use_cuda_graph)
            self.num_kvcache_blocks = self.num_blocks_from_free_memory()
        else:
            self.num_kvcache_blocks = self.cpu_default_num_blocks()
        if comm is not None:   # each rank sized its own cache; the scheduler's count must fit every rank
            self.num_kvcache_blocks = comm.min(self.num_kvcache_blocks)
        if config.num_kvcache_blocks != -1:    # a count sized from free memory fits it
            self.check_kv_cache_fits()
        self.allocate_kv_cache()
        self.graph_runner = None
        if use_cuda_graph:
            self.graph_runner = CUDAGraphRunner(self.model, config.max_num_seqs, self.max_num_blocks_per_seq,
                                                self.hf_config.hidden_size, self.dtype, self.device,
                                                self.scratch_slot)
            self.graph_runner.capture()
        if self.cpu_plans and self.graph_runner is None:
            self.kv_copy_planner = KVCopyPlanner(self.kv_cache, self.block_size, self.max_num_blocks_per_seq)

    # --- KV cache ---------------------------------------------------------

    @property
    def max_num_blocks_per_seq(self) -> int:
        return math.ceil(self.max_model_len / self.block_size)

    def _cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        layer = self.attention_layers[0]   # every layer holds as many KV heads (this rank's) of one size
        return (2, len(self.attention_layers)) + kv_cache_shape(self.attention_backend, num_blocks, self.block_size,
                                                                layer.num_kv_heads, layer.head_dim)

    @property
    def block_bytes(self) -> int:
        return math.prod(self._cache_shape(1)) * self.dtype.itemsize

    def _assign_cache(self, kv_cache: torch.Tensor):
        for i, layer in enumerate(self.attention_layers):
            layer.k_cache, layer.v_cache = kv_cache[0, i], kv_cache[1, i]

    def _release_cache(self):
        for layer in self.attention_layers:
            layer.k_cache = layer.v_cache = torch.tensor([], dtype=self.dtype, device=self.device)

    def check_kv_cache_fits(self):
        """A cache larger than the device's free memory is refused in one line with the figures,
        before the allocator fails on it (or, on the CPU, the kernel kills the process)."""
        available = available_memory(self.device)
        if available is None:
            return
        free, source = available
        asked = (self.num_kvcache_blocks + 1) * self.block_bytes     # with the scratch block
        if asked > free:
            fit = max(0, free // self.block_bytes - 1)
            raise ConfigError(f"num_kvcache_blocks={self.num_kvcache_blocks} needs {asked:,} bytes for the KV cache "
                              f"({asked / 1e9:,.1f} GB, {self.block_bytes:,} a block), but {free:,} bytes "
                              f"({free / 1e9:,.1f} GB) are available ({source}): {fit:,} blocks fit")

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
        if self.kv_copy_planner is not None:
            self.kv_copy_planner.last = None
        input_ids, positions, slot_mapping = [], [], []
        cu_seqlens_q, cu_seqlens_k = [0], [0]
        max_seqlen_q = max_seqlen_k = 0
        for seq in seqs:
            assert seq.block_size == self.block_size, f"seq {seq.seq_id}: block size {seq.block_size}"
            start, end = seq.num_cached_tokens, seq.num_cached_tokens + seq.num_scheduled_tokens
            drafts = seq.spec_token_ids
            assert start < end <= seq.num_tokens + len(drafts), f"seq {seq.seq_id}: cannot compute tokens [{start}, {end})"
            input_ids.extend(seq.tokens(start, min(end, seq.num_tokens)))
            if drafts:      # its drafts go in after its last token (a placeholder, never kept, as token 0)
                input_ids.extend(d if d >= 0 else 0 for d in drafts)
            positions.extend(range(start, end))
            cu_seqlens_q.append(cu_seqlens_q[-1] + end - start)
            cu_seqlens_k.append(cu_seqlens_k[-1] + end)
            max_seqlen_q, max_seqlen_k = max(max_seqlen_q, end - start), max(max_seqlen_k, end)
            slot_mapping.extend(self._slots(seq, start, end))
        # With a cached prefix anywhere (prefix hit or earlier chunk), keys are read through block tables.
        block_tables = self.prepare_block_tables(seqs) if cu_seqlens_k[-1] > cu_seqlens_q[-1] else None
        context = Context(True, self._tensor(cu_seqlens_q, torch.int32), self._tensor(cu_seqlens_k, torch.int32),
                          max_seqlen_q, max_seqlen_k, self._tensor(slot_mapping, torch.int64), None, block_tables)
        if self.cpu_plans:
            context.cpu_plan = prefill_groups(cu_seqlens_q, cu_seqlens_k)
        if any(seq.spec_token_ids for seq in seqs):     # a verifying sequence's logits at each of its tokens
            rows = []
            for seq, first, end in zip(seqs, cu_seqlens_q, cu_seqlens_q[1:]):
                rows.extend(range(first, end) if seq.spec_token_ids else (end - 1,))
            context.logits_indices = self._tensor(rows, torch.int64)
        return self._tensor(input_ids, torch.int64), self._tensor(positions, torch.int64), context

    def prepare_decode(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, Context]:
        bs = self.block_size
        context_lens = [seq.num_tokens for seq in seqs]
        # Each sequence computes its last token, at position num_tokens - 1, into that position's slot.
        slot_mapping = [seq.block_table[(n - 1) // bs] * bs + (n - 1) % bs for seq, n in zip(seqs, context_lens)]
        context = Context(False, max_seqlen_k=max(context_lens), slot_mapping=self._tensor(slot_mapping, torch.int64),
                          context_lens=self._tensor(context_lens, torch.int32))
        copies = self.kv_copy_planner.plan(seqs, context_lens) if self.kv_copy_planner is not None else None
        if copies is None:
            context.block_tables = self.prepare_block_tables(seqs)
        else:
            context.cpu_plan = copies.plan()
            if not copies.reuse:   # refilled in the copies' row order
                context.block_tables = self.prepare_block_tables([seqs[i] for i in copies.seq_of_row],
                                                                 copies.num_keys // bs)
        return (self._tensor([seq.last_token for seq in seqs], torch.int64),
                self._tensor([n - 1 for n in context_lens], torch.int64), context)

    def prepare_verify(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, Context] | None:
        """A decode step that verifies drafts, over the dense K/V copies: each sequence computes its
        last token and its drafts, one query each; None where the copies cannot serve it."""
        num_queries = [1 + len(seq.spec_token_ids) for seq in seqs]
        context_lens = [seq.num_tokens + q - 1 for seq, q in zip(seqs, num_queries)]
        copies = self.kv_copy_planner.plan(seqs, context_lens, num_queries)
        if copies is None:
            return None
        input_ids, positions, slot_mapping = [], [], []
        for seq, n, q in zip(seqs, context_lens, num_queries):
            input_ids.append(seq.last_token)     # then its drafts (a placeholder, never kept, as token 0)
            input_ids.extend(d if d >= 0 else 0 for d in seq.spec_token_ids)
            positions.extend(range(n - q, n))
            slot_mapping.extend(self._slots(seq, n - q, n))
        context = Context(False, max_seqlen_k=max(context_lens), slot_mapping=self._tensor(slot_mapping, torch.int64),
                          context_lens=self._tensor(context_lens, torch.int32), cpu_plan=copies.plan())
        if not copies.reuse:   # refilled in the copies' row order
            context.block_tables = self.prepare_block_tables([seqs[i] for i in copies.seq_of_row],
                                                             copies.num_keys // self.block_size)
        return self._tensor(input_ids, torch.int64), self._tensor(positions, torch.int64), context

    # --- forward ----------------------------------------------------------

    def run_model(self, input_ids: torch.Tensor, positions: torch.Tensor, context: Context) -> torch.Tensor:
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
        if not seqs:       # a step whose every sequence waits for a CPU tier's transfer
            return []
        if any(seq.spec_token_ids for seq in seqs):
            return self.run_verify(seqs, is_prefill)
        logits = self.compute_logits(seqs, is_prefill)
        temperatures = [seq.temperature for seq in seqs]
        # Row seeds are hashed only when something is sampled: a greedy batch takes the argmax.
        if not any(t > 0 for t in temperatures):
            return self.sampler(logits, temperatures, []).tolist()
        seeds = [row_seed(self.config.seed, seq) for seq in seqs]
        filtered = any(seq.top_k > 0 or seq.top_p < 1.0 for seq in seqs)
        return self.sampler(logits, temperatures, seeds, [seq.top_k for seq in seqs] if filtered else None,
                            [seq.top_p for seq in seqs] if filtered else None).tolist()

    def run_verify(self, seqs: list[Sequence], is_prefill: bool) -> list:
        """A step that verifies drafts, in one forward: a token for each position, sampled as a
        run without drafts samples there (its row seed at that length); a list for each sequence
        with drafts."""
        inputs = None if is_prefill or self.kv_copy_planner is None else self.prepare_verify(seqs)
        logits = self.compute_logits(seqs, True) if inputs is None else self.run_model(*inputs)
        rows = [(seq, offset) for seq in seqs for offset in range(len(seq.spec_token_ids) + 1)]
        temperatures = [seq.temperature for seq, _ in rows]
        if not any(t > 0 for t in temperatures):
            tokens = self.sampler(logits, temperatures, []).tolist()
        else:
            filtered = any(seq.top_k > 0 or seq.top_p < 1.0 for seq in seqs)
            tokens = self.sampler(logits, temperatures, [row_seed(self.config.seed, seq, offset) for seq, offset in rows],
                                  [seq.top_k for seq, _ in rows] if filtered else None,
                                  [seq.top_p for seq, _ in rows] if filtered else None).tolist()
        out, i = [], 0
        for seq in seqs:
            n = len(seq.spec_token_ids)
            out.append(tokens[i:i + n + 1] if n else tokens[i])
            i += n + 1
        return out

    def host_kv_buffer(self, num_blocks: int) -> HostKVBuffer:
        """The CPU tier's host buffer of `num_blocks` blocks, empty (made at the first call)."""
        if self.host_kv is None:
            self.host_kv = HostKVBuffer(self.kv_cache, num_blocks)
        else:
            self.host_kv.reset()
        return self.host_kv

    def exit(self):
        if self.graph_runner is not None:
            self.graph_runner.close()
            self.graph_runner = None
        self._release_cache()
        self.kv_cache = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

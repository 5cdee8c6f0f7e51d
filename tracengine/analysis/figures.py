"""The figures `stats` returns, as typed structs (the schema, as the events are): the tables,
the sweeps and the TUI read them by attribute; `stats --json` prints `to_builtins` of them,
the same object, key for key, as the dict it replaced. A name reads by key too
(`s["latency"]["ttft"]`), so code written against that dict keeps working."""
import math
from bisect import bisect_right
from itertools import accumulate

import msgspec


class Figures(msgspec.Struct, frozen=True, kw_only=True):
    """A group of figures: read by attribute, or by key as a mapping of its fields; equal to
the dict of its fields."""

    def __getitem__(self, name: str):
        if name not in self.__struct_fields__:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default=None):
        return getattr(self, name) if name in self.__struct_fields__ else default

    def keys(self):
        return self.__struct_fields__

    def __iter__(self):
        return iter(self.__struct_fields__)

    def __len__(self) -> int:
        return len(self.__struct_fields__)

    def items(self):
        return [(name, getattr(self, name)) for name in self.__struct_fields__]

    def __contains__(self, name) -> bool:
        return name in self.__struct_fields__

    def __eq__(self, other):
        # equal to the dict it stands for, as the figures were dicts before they were typed
        if isinstance(other, dict):
            return msgspec.to_builtins(self) == other
        if type(other) is type(self):
            return msgspec.structs.astuple(self) == msgspec.structs.astuple(other)
        return NotImplemented


class Summary(Figures, frozen=True):
    """count, mean and percentiles of a list of values; None for each figure of an empty list."""
    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


NO_VALUES = Summary()       # the figures of an empty list


class Latency(Figures, frozen=True):
    steps: Summary
    seconds: Summary


class Latencies(Figures, frozen=True):
    queueing: Latency
    ttft: Latency
    itl: Latency
    tpot: Latency
    e2e: Latency


class TraceFigures(Figures, frozen=True):
    torn_tail: str | None
    kvcache_block_size: int | None
    num_kvcache_blocks: int | None


class RequestCounts(Figures, frozen=True):
    num_requests: int
    num_finished: int
    num_unfinished: int
    finish_reasons: dict[str, int]
    num_aborted: int


class TokenCounts(Figures, frozen=True):
    num_prompt_tokens: int
    num_completion_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int


class StepFigures(Figures, frozen=True):
    num_steps: int
    num_prefill_steps: int
    num_decode_steps: int
    total_s: float
    prefill_s: float
    decode_s: float
    gap_s: float
    mean_gap_s: float | None
    idle_s: float
    num_idle_gaps: int
    num_mixed_steps: int
    mixed_s: float


class Throughput(Figures, frozen=True):
    """Per phase of step: a mixed step's tokens count under mixed."""
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    completion_tokens_per_s: float | None
    requests_per_s: float | None
    total_tokens_per_s: float | None
    mixed_tokens_per_s: float | None


class Goodput(Figures, frozen=True):
    slo_s: dict[str, float]
    num_good_requests: int
    good_request_share: float | None
    requests_per_s: float | None


class Preemption(Figures, frozen=True):
    num_preemptions: int
    num_self_preemptions: int
    num_preempted_requests: int
    num_recomputed_tokens: int


class PrefixCache(Figures, frozen=True):
    num_allocated_blocks: int
    num_hit_blocks: int
    block_hit_rate: float | None
    num_lookup_tokens: int
    num_hit_tokens: int | None
    token_hit_rate: float | None


class CpuTierFigures(Figures, frozen=True):
    """The CPU tier of KV offloading (analysis/cpu_tier.py): its hits (the GPU's are
    prefix_cache's; its token_hit_rate counts both), what moved each way, and how long the
    requests that loaded waited for their loads."""
    kv_offloading_size_gib: float
    kv_offloading_bandwidth_gbps: float
    block_bytes: int
    num_hit_blocks: int
    num_stored_blocks: int
    num_evicted_blocks: int
    num_loads: int
    bytes_to_cpu: int
    bytes_to_gpu: int
    load_wait_s: Summary


class KVBlocks(Figures, frozen=True):
    num_blocks: int | None
    utilization_mean: float | None = None
    utilization_peak: float | None = None
    peak_step: int | None = None
    min_free_blocks: int | None = None


class HeadOfLine(Figures, frozen=True):
    num_blocked_steps: int
    num_blocked_prefill_steps: int
    num_blocked_decode_steps: int
    num_blocked_requests: int


class RequestFigures(Figures, frozen=True):
    """One request's figures, in steps and in seconds (None: it never got that far)."""
    seq_id: int
    added_step: int
    arrival_s: float
    first_scheduled_step: int | None
    first_token_step: int | None
    finish_step: int | None
    finish_reason: str | None
    num_prompt_tokens: int
    num_completion_tokens: int
    num_preemptions: int
    queueing_steps: int | None = None
    ttft_steps: int | None = None
    tpot_steps: float | None = None
    e2e_steps: int | None = None
    queueing_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


class SpecDecoding(Figures, frozen=True):
    """Speculative decoding (a vLLM trace's, analysis/spec_decoding.py): drafts verified and accepted."""
    num_verifications: int          # a request's drafts verified in a step
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float | None   # accepted / drafted
    mean_acceptance_length: float | None    # tokens a verification gave: 1 + accepted (vLLM's)
    acceptance_rate_per_position: list[float]   # of the verifications with a draft at position j, the share accepting it
    # a dynamic draft length's (vLLM's num_speculative_tokens_per_batch_size): the lengths each batch size chose
    draft_lengths: list["DraftLength"] | None = None


class DraftLength(Figures, frozen=True):
    """Of the steps that scheduled `batch_size` requests, `num_steps` chose `num_spec_tokens` drafts."""
    batch_size: int
    num_spec_tokens: int
    num_steps: int


class KVConnectorFigures(Figures, frozen=True):
    """A vLLM KV connector's answers and transfers (analysis/vllm_inputs.py): the lookups it
    answered, the admissions it gave external tokens (loaded asynchronously or not), what its
    workers reported done, and the finished requests whose blocks it kept for a send."""
    kv_connector: str
    num_lookups: int
    num_lookups_pending: int         # answered "cannot tell yet": the request waits
    num_external_admissions: int     # admissions with external tokens (update_state_after_alloc)
    num_external_tokens: int
    num_async_loads: int             # of those, loaded while waiting (WAITING_FOR_REMOTE_KVS)
    num_finished_recving: int
    num_finished_sending: int
    num_failed_recving: int
    num_delayed_frees: int


class StructuredOutputFigures(Figures, frozen=True):
    """Structured output in a vLLM trace (analysis/vllm_inputs.py): requests with a grammar, how
    many steps each waited for it (from its arrival to the step the scheduler found it ready),
    and the grammars that failed to compile or refused a token."""
    num_requests: int
    num_ready: int
    num_failed: int
    num_rejected: int
    grammar_wait_steps: Summary


class Adapter(Figures, frozen=True):
    """The requests of one LoRA adapter (a vLLM trace's, analysis/adapters.py); "" is the base model's."""
    num_requests: int
    num_finished: int
    num_prompt_tokens: int
    num_completion_tokens: int
    queueing_steps: Summary
    ttft_steps: Summary
    e2e_steps: Summary


class KVGroupFigures(Figures, frozen=True):
    """One KV cache group of a vLLM hybrid model (analysis/kv_groups.py): the blocks its requests were
    given (prefix-cache hits among them), gave back while running (out of a sliding window, older
    Mamba states), freed, and the most held at once."""
    group: int
    spec: str                        # vLLM's spec class: FullAttentionSpec, SlidingWindowSpec, MambaSpec
    sliding_window: int | None
    num_allocated_blocks: int
    num_hit_blocks: int
    num_skipped_blocks: int
    num_freed_blocks: int
    peak_blocks: int


class Stats(Figures, frozen=True, kw_only=True):
    """What `tracengine stats` says of one engine's trace."""
    stats_version: int
    trace: TraceFigures
    requests: RequestCounts
    tokens: TokenCounts
    steps: StepFigures
    throughput: Throughput
    latency: Latencies
    goodput: Goodput | None
    preemption: Preemption
    prefix_cache: PrefixCache
    kv_blocks: KVBlocks
    head_of_line: HeadOfLine
    sessions: dict | None = None        # analysis/sessions.py; None without sessions
    spec_decoding: SpecDecoding | None = None   # analysis/spec_decoding.py; None without drafts
    lora_adapters: dict[str, Adapter] | None = None   # analysis/adapters.py; None without LoRA
    cpu_tier: CpuTierFigures | None = None    # analysis/cpu_tier.py; None without a CPU tier
    kv_connector: KVConnectorFigures | None = None    # analysis/vllm_inputs.py; None without a connector
    structured_output: StructuredOutputFigures | None = None   # analysis/vllm_inputs.py; None without grammars
    kv_groups: list[KVGroupFigures] | None = None   # analysis/kv_groups.py; None for one KV cache group
    per_request: list[RequestFigures]


def to_json_object(figures) -> dict:
    """The figures as plain JSON values (dicts, lists, numbers), as `--json` prints them."""
    return msgspec.to_builtins(figures)


def percentile(sorted_values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks; `sorted_values` is non-empty and sorted."""
    rank = (len(sorted_values) - 1) * p / 100
    lo, hi = math.floor(rank), math.ceil(rank)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo)


def summarize(values: list[float]) -> Summary:
    """count, mean, p50, p90, p99; None for each figure of an empty list."""
    if not values:
        return NO_VALUES
    ordered = sorted(values)
    return Summary(count=len(ordered), mean=sum(ordered) / len(ordered), p50=percentile(ordered, 50),
                   p90=percentile(ordered, 90), p99=percentile(ordered, 99))


class _Repeated:
    """The sorted list that holds each value of `counts` (value -> how many) that many times,
    each divided by `scale`, read by index without being built."""

    def __init__(self, counts: dict[int, int], scale: float):
        self.values = sorted(counts)
        self.ends = list(accumulate(counts[v] for v in self.values))   # one past each value's last index
        self.scale = scale

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __getitem__(self, index: int) -> float:
        return self.values[bisect_right(self.ends, index)] / self.scale


def summarize_counts(counts: dict[int, int], scale: float = 1) -> Summary:
    """summarize of the values `counts` holds (value -> how many times), each divided by `scale`."""
    repeated = _Repeated(counts, scale)
    n = len(repeated)
    if not n:
        return NO_VALUES
    return Summary(count=n, mean=sum(v * c for v, c in counts.items()) / scale / n, p50=percentile(repeated, 50),
                   p90=percentile(repeated, 90), p99=percentile(repeated, 99))


def figure_at(figures, *keys):
    """The figure at `keys` in a run's figures or a fleet's (dicts of them), or None where one is missing."""
    value = figures
    for key in keys:
        value = value.get(key) if isinstance(value, (dict, Figures)) else None
    return value

"""The event vocabulary: every decision of the scheduler, the block manager
and the engine as a typed fact. One tagged union, small int tags, array-like
structs. Tags are listed here (and 17-20, the wire forms of block_runs.py) and never
reused; new fields are appended with defaults (anything else bumps FORMAT_VERSION in
tracelog)."""
from typing import Literal, Union

import msgspec

# Closed vocabularies: a decoder rejects a value outside them.
# "mixed": a batch of the mixed policy holding prefill and decode tokens (each ScheduledSeq says which).
Phase = Literal["prefill", "decode", "mixed"]
# Why a scheduling loop stopped: its exits, named. prefill_first: the first six; mixed adds
# "preempted" (a preemption this step: no admission, as vLLM V1); "not_admitted": a policy's `admit` said no.
StopReason = Literal["waiting_empty", "max_num_seqs", "budget_exhausted", "no_free_blocks", "chunk_gate",
                     "running_empty", "preempted", "not_admitted"]
# "stop": one of the request's stop tokens (vLLM's stop_token_ids); "error": vLLM finished it with an error
FinishReason = Literal["eos", "length", "stop", "error"]
AbortReason = Literal["client", "shutdown", "error"]   # the client went away; the server shut down; vLLM's error
RunOutcome = Literal["failed", "interrupted"]   # an error ended the run; a signal (SIGINT, SIGTERM) did


class Event(msgspec.Struct, frozen=True, gc=False, array_like=True, omit_defaults=True, tag_field="t"):
    pass


class ModelInfo(msgspec.Struct, frozen=True, gc=False, array_like=True):
    name: str
    dtype: str
    architecture: str


class TraceHeader(Event, tag=0):
    format_version: int
    tracengine_version: str
    config: dict[str, str | int | float | bool | None]   # flat: every Config field, a scalar each
    model: ModelInfo
    device: str
    torch_version: str
    seed: int
    created_at: float = 0.0
    tensor_parallel_size: int = 1
    # Format version 4: a fleet run's replicas, routers and KV transfers (tracengine/fleet/engine.py,
    # FleetSpec.to_dict); empty for one engine
    fleet: dict[str, str | int | float | bool | None] = {}
    # Format version 5: the engine whose scheduler made the decisions ("tracengine", or "vllm" for a
    # trace of vLLM's own scheduler, whose config then holds vLLM's fields) and its exact version.
    engine: str = "tracengine"
    engine_version: str = ""
    # Format version 11: what the engine did that the trace does not hold (a vLLM feature recorded
    # anyway, tracengine/vllm/features.py): such a trace does not replay exactly. Empty: nothing.
    not_recorded: list[str] = msgspec.field(default_factory=list)


class RequestAdded(Event, tag=1):
    step: int
    seq_id: int
    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float
    ignore_eos: bool
    created_at: float = 0.0   # version 1: wall-clock seconds; version 2 writes 0 (the header's created_at + arrival_ns)
    # Format version 2:
    arrival_ns: int = -1      # when the request arrived, in ns from the start of the run; -1: not known
    top_k: int = -1           # -1: all tokens
    top_p: float = 1.0
    seed: int = -1            # the request's own sampling seed; -1: none
    # Format version 4: a prompt known by its hash ids (engine/hash_id_prompt.py) has no token ids
    # here (prompt_token_ids is empty): its hash ids, its length and the tokens each hash id names.
    prompt_hash_ids: list[int] = msgspec.field(default_factory=list)
    num_hash_id_prompt_tokens: int = 0
    hash_id_block_tokens: int = 0
    # Format version 5, what vLLM's scheduler reads of a request (tracengine/vllm/):
    request_id: str = ""      # the engine's own id of the request ("": tracengine's seq_id is the id)
    priority: int = 0         # the priority policy's order (lower first)
    arrival_time: float = 0.0   # vLLM's arrival time as its scheduler got it (priority ties); 0: not recorded
    min_tokens: int = 0
    eos_token_id: int = -1    # -1: none (ignore_eos, or the engine's own EOS)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    # Steps scheduled whose output had not come back when the request arrived (0 but for vLLM's
    # engine core, whose model output arrives after the next step is scheduled): a replay adds it
    # at the same point between schedule and update calls.
    num_steps_in_flight: int = 0
    # Format version 10: a turn of a session (workload/sessions.py), sent `think_ns` after the turns
    # of its session it depends on (`depends_on`, turn indices) finished: a what-if recomputes its
    # arrival from their finishes. "": not in a session.
    session_id: str = ""
    turn: int = 0
    depends_on: list[int] = msgspec.field(default_factory=list)
    think_ns: int = 0
    # Format version 11: the request's LoRA adapter in vLLM's scheduler (its name and id; 0: none)
    lora_name: str = ""
    lora_id: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return self.num_hash_id_prompt_tokens if self.prompt_hash_ids else len(self.prompt_token_ids)


class ScheduledSeq(msgspec.Struct, frozen=True, gc=False, array_like=True):
    seq_id: int
    num_tokens: int          # tokens computed for this sequence this step
    num_cached_tokens: int   # tokens already in the KV cache before this step


class ScheduleDecision(Event, tag=2):
    step: int
    phase: Phase
    seqs: list[ScheduledSeq]
    num_batched_tokens: int
    stop_reason: StopReason
    # The waiting head when prefill stopped on it (no_free_blocks / chunk_gate), else -1.
    blocked_seq_id: int = -1
    num_blocks_needed: int = 0   # free blocks the blocked head needed
    num_free_blocks: int = 0     # free blocks when the prefill loop stopped
    num_waiting: int = 0         # queue lengths after the decision
    num_running: int = 0
    # Appended for the mixed policy: in a "mixed" decision, the first num_decode_seqs of `seqs` decode
    # one token each and the rest compute prefill tokens (a chunk of a prompt, or a recompute); 0 in a
    # "prefill" or "decode" decision, whose phase says it for all. (On ScheduleDecision, not on each
    # ScheduledSeq: an array-like struct writes every field, so this costs a byte per step, not per seq.)
    num_decode_seqs: int = 0
    # Format version 5: sequences admitted back from waiting after a preemption (the rest of the
    # prefill seqs admitted this step are new)
    resumed_seq_ids: list[int] = msgspec.field(default_factory=list)


def prefill_flags(decision: "ScheduleDecision") -> list[bool]:
    """Per scheduled sequence, whether it computes prefill tokens, whatever the phase."""
    if decision.phase == "mixed":
        return [i >= decision.num_decode_seqs for i in range(len(decision.seqs))]
    return [decision.phase == "prefill"] * len(decision.seqs)


class BlockAllocate(Event, tag=3):
    step: int
    seq_id: int
    block_ids: list[int]
    num_cached_blocks: int   # leading blocks that were prefix-cache hits
    group: int = 0           # format 13: the KV cache group (vLLM's hybrid models: vllm/group_blocks.py)


class BlockAppend(Event, tag=4):
    step: int
    seq_id: int
    block_id: int
    group: int = 0


class BlockHash(Event, tag=5):
    step: int
    seq_id: int
    block_id: int
    hash: int


class BlockFree(Event, tag=6):
    step: int
    seq_id: int
    block_ids: list[int]     # the sequence's block table, in release order (tail first)
    group: int = 0


class Preempt(Event, tag=7):
    step: int
    seq_id: int
    by_seq_id: int           # the sequence that needed a block (== seq_id for self-preemption)
    freed_block_ids: list[int]
    num_computed_tokens: int = 0   # tokens whose KV is thrown away and must be recomputed


class TokenSample(Event, tag=8):
    step: int
    seq_id: int
    token_id: int
    kept: bool               # false for a middle chunk of a chunked prefill


class SeqFinish(Event, tag=9):
    step: int
    seq_id: int
    reason: FinishReason
    num_prompt_tokens: int
    num_completion_tokens: int


class StepEnd(Event, tag=10):
    step: int
    num_free_blocks: int
    schedule_ns: int
    model_ns: int
    postprocess_ns: int
    # Format version 2:
    # ns from the end of the previous step (for step 0, the start of the run) to the start of
    # this one: idle time waiting for arrivals and the loop's own work. Step s starts at the
    # sum of gap_ns and durations before it; a v1 trace reads as gaps of 0.
    gap_ns: int = 0
    # Format version 5: steps scheduled after this one before its model output came back
    # (vLLM's async scheduling: 1); a replay updates at the same point.
    num_scheduled_ahead: int = 0


class SeqAbort(Event, tag=11):
    """A request taken out of the engine between steps (a server's client went away, or the
    server shut down): Scheduler.abort, an extension of the seeds. Recorded at the step it
    precedes; a BlockFree follows when the sequence held blocks."""
    step: int
    seq_id: int
    reason: AbortReason
    status: Literal["waiting", "running"]   # the queue it was taken from
    num_prompt_tokens: int
    num_completion_tokens: int
    # Format version 5: as RequestAdded's; an abort can come while a step is in flight
    num_steps_in_flight: int = 0


# Format version 4: a fleet of replicas in one trace (tracengine/fleet/engine.py, docs/cluster.md).

class ReplicaScope(Event, tag=12):
    """The engine events after it, up to the next ReplicaScope, are replica `replica`'s; a trace
    without one is one engine's, replica 0. A fleet writes one before each replica step (and the
    requests that step adds), so every frame says whose it is: a byte or four a step, where a
    field on every event would cost a byte an event."""
    step: int                # the replica's step that follows
    replica: int


class RouteDecision(Event, tag=13):
    """A router's choice for a request, made when it arrived at the pool (the replicas' state
    then): each candidate's score, lower wins."""
    step: int                # the chosen replica's next step (the request enters before it or later)
    seq_id: int
    replica: int             # the chosen one
    candidates: list[int]    # the pool's replicas, in order
    scores: list[float]      # each candidate's score
    pool: Literal["all", "prefill", "decode"] = "all"
    arrival_ns: int = -1     # when the request reached the router (ns from the start of the run)


class KVTransfer(Event, tag=14):
    """A prefilled request's KV cache shipped from a prefill replica to a decode replica,
    written when it lands (the decode replica's prefix cache then holds the prompt's full blocks)."""
    step: int                # the decode replica's next step
    seq_id: int
    src_replica: int
    replica: int             # the decode replica it lands on
    num_tokens: int          # prompt tokens whose K and V were shipped
    num_bytes: int
    duration_ns: int         # simulated: latency + bytes / bandwidth
    num_blocks: int = 0      # full blocks the decode replica's cache took in


class RunEnd(Event, tag=15):
    """Format version 6: why a run ended before it finished, the one event of its end frame
    (the end frame of a run that finished is empty). Never among a trace's steps: readers
    give it as `TraceReader.run_end`."""
    step: int             # the last finished step (-1: none), where the trace ends
    outcome: RunOutcome
    reason: str           # the error's one line, or the signal's name


class PromptBlocksHashed(Event, tag=16):
    """Format 7: full blocks of a prompt known by its hash ids (engine/hash_id_prompt.py) registered
    in the prefix cache, one event where a token prompt has a BlockHash per block. Their hashes are
    not stored: they follow from what is here (`hash_id_prompt.hashed_blocks` gives the BlockHash
    events), which is what shrinks a simulated trace. The blocks are the sequence's blocks
    `first_block`, `first_block + 1`, ..., held in `block_ids`; `hash_ids` are the prompt's hash ids
    from the one holding the first block's first token on, `hash_id_block_tokens` tokens each."""
    step: int
    seq_id: int
    block_ids: list[int]
    first_block: int         # index of the first of them in the sequence's blocks
    block_size: int          # tokens a block
    parent_hash: int         # the hash of the sequence's block before the first; -1: none (block 0)
    hash_ids: list[int]
    hash_id_block_tokens: int


# Format version 11: speculative decoding in a trace of vLLM's scheduler (tracengine/vllm/spec.py)

class SpecDraft(Event, tag=24):
    """Draft tokens given to vLLM's scheduler for a request (update_draft_token_ids, after a step's
    output), which a later step may schedule for verification; placed as RequestAdded is."""
    step: int
    seq_id: int
    token_ids: list[int]
    num_steps_in_flight: int = 0


class SpecDecode(Event, tag=25):
    """A step's draft tokens scheduled for verification, per request (counted in its ScheduledSeq's
    num_tokens), and the draft length the scheduler applied (num_speculative_tokens_per_batch_size)."""
    step: int
    seq_ids: list[int]
    num_spec_tokens: list[int]
    num_spec_tokens_to_schedule: int


class SpecAccepted(Event, tag=26):
    """Of each request's drafts verified in the step, how many its output accepted (the sampled
    tokens but the last), as the step's output was processed."""
    step: int
    seq_ids: list[int]
    num_accepted: list[int]


# Format 11: speculative decoding (engine/spec_decode.py). Tags 117 and 118: 17 to 20 are the wire
# forms of block_runs.py, which a decoder reads in one union with these.

class DraftProposed(Event, tag=117):
    """Draft tokens proposed for a sequence after its step (in that step's frame): its next step
    verifies them, or as many of them as it schedules (its ScheduledSeq's num_tokens less one)."""
    step: int
    seq_id: int
    num_draft_tokens: int
    draft_token_ids: list[int] = msgspec.field(default_factory=list)   # empty: synthetic drafts (the target's own)


class DraftVerified(Event, tag=118):
    """A step verified a sequence's drafts: `num_accepted_tokens` of its `num_draft_tokens`
    were kept; its TokenSamples that follow are those and the model's next token (fewer when
    it stopped)."""
    step: int
    seq_id: int
    num_draft_tokens: int
    num_accepted_tokens: int
    # the drafts were placeholders, never kept: the mixed policy padded an admitted sequence with one
    # token to compute to a verify step's tokens, as vLLM does (stats leave them out)
    padded: bool = False


# Format 11: the CPU tier of KV offloading (engine/cpu_tier.py, vLLM's OffloadingConnector with its
# CPU manager). A block there is known by its hash; a block is stored once, asynchronously.

class CpuStore(Event, tag=21):
    """Full prompt blocks of a sequence, computed on the GPU, offered to the CPU tier and taken:
    the copy to the host starts at the next step's start and shares the GPU-to-CPU link. The
    blocks are in the tier from now on (found by a lookup once their copy has ended); the ones
    `evicted` (least recently used first) left it to make room. (Tag 20 is a wire form's,
    block_runs.py: an eviction happens only here, so it is this event's field.)"""
    step: int
    seq_id: int
    first_block: int         # index of the first stored block in the sequence's blocks
    hashes: list[int]        # the blocks stored (those the tier already held are not stored again)
    evicted: list[int] = msgspec.field(default_factory=list)


class CpuLoad(Event, tag=22):
    """A sequence's load from the CPU tier has ended: the blocks it loaded are registered in the
    GPU's prefix cache and it is scheduled from now on, `num_cached_tokens` computed."""
    step: int
    seq_id: int
    num_blocks: int          # blocks loaded
    num_cached_tokens: int   # tokens computed when it is scheduled (GPU hits and loaded, at most all but one)


class CpuHit(Event, tag=23):
    """A waiting sequence found leading blocks in the CPU tier past its GPU prefix-cache hits: it
    holds GPU blocks for both (its BlockAllocate) and waits while they load over the CPU-to-GPU
    link, which the load has from `start_ns` to `done_ns` (ns from the start of the run)."""
    step: int
    seq_id: int
    first_block: int         # the first block loaded (its GPU prefix-cache hits come before)
    hashes: list[int]        # the blocks loaded, in order
    start_ns: int = 0
    done_ns: int = 0


AnyEvent = Union[TraceHeader, RequestAdded, ScheduleDecision, BlockAllocate, BlockAppend, BlockHash,
                 BlockFree, Preempt, TokenSample, SeqFinish, StepEnd, SeqAbort, ReplicaScope, RouteDecision,
                 KVTransfer, RunEnd, PromptBlocksHashed, SpecDraft, SpecDecode, SpecAccepted, DraftProposed,
                 DraftVerified, CpuStore, CpuLoad, CpuHit]

EVENT_TYPES: dict[str, type] = {cls.__name__: cls for cls in AnyEvent.__args__}
# Only a fleet's trace holds these (one engine's never does)
FLEET_EVENT_TYPES = frozenset({"ReplicaScope", "RouteDecision", "KVTransfer"})
# Only a trace of prompts known by their hash ids holds these (a token prompt's blocks are a BlockHash each)
HASH_ID_EVENT_TYPES = frozenset({"PromptBlocksHashed"})
# Only a trace of vLLM's scheduler holds these (its speculative decoding)
VLLM_EVENT_TYPES = frozenset({"SpecDraft", "SpecDecode", "SpecAccepted"})
# Only a run that drafts holds these (speculative decoding)
SPEC_EVENT_TYPES = frozenset({"DraftProposed", "DraftVerified"})

# Only a trace of a run with a CPU tier holds these
CPU_TIER_EVENT_TYPES = frozenset({"CpuStore", "CpuLoad", "CpuHit"})

# Fields a replay does not compare: wall-clock readings.
WALL_CLOCK_FIELDS = frozenset({"schedule_ns", "model_ns", "postprocess_ns", "created_at", "arrival_ns", "gap_ns",
                               "start_ns", "done_ns"})



"""Events of a trace of vLLM's scheduler (format 12) beyond its decisions: what the scheduler was
told by a KV connector (its answers, and the transfers its workers report: tracengine/vllm/connector.py)
and by grammars (structured output: tracengine/vllm/structured.py). Tags 27-34. They are read
with events.py's (block_runs.WireEvent holds them); ALL_EVENT_TYPES names both, as EVENT_TYPES
names events.py's (which, imported by every layer, stays under its size and imports nothing)."""
from typing import Literal

import msgspec

from tracengine.trace.events import EVENT_TYPES, Event
from tracengine.trace.sglang_events import SGLANG_EVENTS


class ConnectorMatched(Event, tag=27):
    """get_num_new_matched_tokens: the tokens past `num_computed_tokens` (its local prefix-cache
    hit, block aligned) the connector has for a waiting request; -1: it cannot tell yet (the
    request waits); `load_async`: they load while the request waits (WAITING_FOR_REMOTE_KVS)."""
    step: int
    seq_id: int
    num_computed_tokens: int
    num_external_tokens: int
    load_async: bool = False


class ConnectorAllocated(Event, tag=28):
    """update_state_after_alloc: the blocks given to a request the connector matched for, and the
    external tokens it is to load into them."""
    step: int
    seq_id: int
    num_external_tokens: int
    block_ids: list[int] = msgspec.field(default_factory=list)


class ConnectorFinished(Event, tag=29):
    """request_finished (and a producer's partial tail): whether the connector keeps the finished
    request's blocks until its workers report them sent."""
    step: int
    seq_id: int
    delay_free: bool = False


class ConnectorPending(Event, tag=30):
    """has_pending_block_frees, asked where a running request's growth did not fit: True, the
    scheduler waits for those frees rather than preempt."""
    step: int
    pending: bool = False


class KVTransfersDone(Event, tag=31):
    """The step's model output's kv_connector_output: requests whose KV the workers finished
    sending (their blocks are freed) or receiving (they may be scheduled), the loads that failed,
    and blocks found invalid. Lists in the order the scheduler reads them."""
    step: int
    finished_sending: list[int] = msgspec.field(default_factory=list)
    finished_recving: list[int] = msgspec.field(default_factory=list)
    failed_recving: list[int] = msgspec.field(default_factory=list)
    invalid_block_ids: list[int] = msgspec.field(default_factory=list)


# Format 12: structured output in vLLM's scheduler (tracengine/vllm/structured.py): a request that
# waits for its grammar (WAITING_FOR_FSM), and what its grammar answered.

class GrammarRequested(Event, tag=32):
    """A request with structured output arrived (after its RequestAdded): it waits for its grammar."""
    step: int
    seq_id: int
    kind: str = "json"       # StructuredOutputsParams' kind: json, regex, choice, grammar, ...


class GrammarState(Event, tag=33):
    """What a request's grammar answered: "ready" (compiled, the request may be scheduled from
    this step), "failed" (its compilation raised: the request ends with an error), "rejected"
    (it refused a sampled token: the request ends with an error)."""
    step: int
    seq_id: int
    state: Literal["ready", "failed", "rejected"]


# Format 13: a hybrid model's KV cache groups (tracengine/vllm/group_blocks.py); tags 34-37.

class BlockSkip(Event, tag=34):
    """Blocks a running request gives back while it keeps its place in its group's table (vLLM puts
    the null block there): a sliding window's blocks that fell out of the window, a Mamba group's
    state blocks no longer needed (`remove_skipped_blocks`), freed in this order."""
    step: int
    seq_id: int
    block_ids: list[int]
    group: int = 0


VLLM_INPUT_EVENTS = (ConnectorMatched, ConnectorAllocated, ConnectorFinished, ConnectorPending,
                     KVTransfersDone, GrammarRequested, GrammarState)
# every event of this module
VLLM_EVENTS = (*VLLM_INPUT_EVENTS, BlockSkip)
# every event beyond events.py's (what a decoder reads beside them): these and SGLang's (sglang_events.py)
BACKEND_EVENTS = (*VLLM_EVENTS, *SGLANG_EVENTS)
ALL_EVENT_TYPES: dict[str, type] = {**EVENT_TYPES, **{cls.__name__: cls for cls in BACKEND_EVENTS}}

"""Events of a trace of vLLM's scheduler (format 12) beyond its plain decisions: a KV connector's
answers and the transfers its workers report (tracengine/vllm/connector.py), and structured
output's grammars (tracengine/vllm/structured.py). Part of events.py's union; tags 27-33."""
from typing import Literal

import msgspec

from tracengine.trace.event_base import Event


class KVConnectorMatched(Event, tag=27):
    """get_num_new_matched_tokens: the tokens past `num_computed_tokens` (its local prefix-cache
    hit, block aligned) the connector has for a waiting request; -1: it cannot tell yet (the
    request waits); `load_async`: they load while the request waits (WAITING_FOR_REMOTE_KVS)."""
    step: int
    seq_id: int
    num_computed_tokens: int
    num_external_tokens: int
    load_async: bool = False


class KVConnectorAllocated(Event, tag=28):
    """update_state_after_alloc: the blocks given to a request the connector matched for, and the
    external tokens it is to load into them."""
    step: int
    seq_id: int
    num_external_tokens: int
    block_ids: list[int] = msgspec.field(default_factory=list)


class KVConnectorFinished(Event, tag=29):
    """request_finished (and a producer's partial tail): whether the connector keeps the finished
    request's blocks until its workers report them sent."""
    step: int
    seq_id: int
    delay_free: bool = False


class KVConnectorPendingFrees(Event, tag=30):
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


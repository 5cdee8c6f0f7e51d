"""A KV connector (any KVConnectorBase_V1: vLLM's OffloadingConnector, LMCache, NIXL) in a trace of
vLLM's scheduler, and in its replay.

What the scheduler takes from a connector and acts on is events: the external tokens it has for a
waiting request and whether they load asynchronously (get_num_new_matched_tokens:
ConnectorMatched), the blocks given for them (update_state_after_alloc: ConnectorAllocated),
whether a finished request's blocks wait for a transfer (request_finished: ConnectorFinished),
whether a growth that does not fit waits for pending frees (has_pending_block_frees:
ConnectorPending), and the transfers the workers report finished in a step's model output
(kv_connector_output: KVTransfersDone). The rest (the metadata for the workers, stats, KV events)
goes to the workers or the logs, never back into a decision.

A replay installs `ReplayConnector` in place of the recorded one (the header names it and its
role): it answers each question from the trace in the order it was asked, and a step's model
output gets the recorded transfers, so a run with any connector replays without it."""
from collections import deque

from tracengine.trace.events import BlockFree, RequestAdded
from tracengine.trace.vllm_events import (ConnectorAllocated, ConnectorFinished, ConnectorMatched,
                                          ConnectorPending, KVTransfersDone)

STANDIN_NAME = "ReplayConnector"
STANDIN_MODULE = "tracengine.vllm.connector"
# a header's fields of a recorded connector, present only where one is configured
CONNECTOR_FIELDS = ("kv_connector", "kv_role", "kv_load_failure_policy", "kv_connector_requires_delivery")


# -- the header -----------------------------------------------------------------------------------

def connector_config(scheduler) -> dict:
    """The header's fields of the scheduler's KV connector ({}: none)."""
    transfer = scheduler.vllm_config.kv_transfer_config
    if transfer is None or scheduler.connector is None:
        return {}
    name = (transfer.kv_connector_extra_config or {}).get("recorded") if transfer.kv_connector == STANDIN_NAME \
        else transfer.kv_connector or transfer.kv_connector_module_path
    return {"kv_connector": name, "kv_role": transfer.kv_role,
            "kv_load_failure_policy": transfer.kv_load_failure_policy,
            "kv_connector_requires_delivery": bool(scheduler.connector.requires_kv_delivery)}


def standin_transfer_config(config: dict):
    """vLLM's KVTransferConfig installing ReplayConnector with the recorded connector's role; None
    for a header without a connector."""
    if not config.get("kv_connector"):
        return None
    from vllm.config import KVTransferConfig
    return KVTransferConfig(kv_connector=STANDIN_NAME, kv_connector_module_path=STANDIN_MODULE,
                            kv_role=config["kv_role"], kv_load_failure_policy=config["kv_load_failure_policy"],
                            kv_connector_extra_config={"recorded": config["kv_connector"],
                                                       "requires_delivery": config["kv_connector_requires_delivery"]})


# -- recording ------------------------------------------------------------------------------------

class OrderedIds(set):
    """A set of request ids that iterates in a given order: a replay gives the scheduler the
    recorded transfers in the order the recording's scheduler read them."""

    def __init__(self, ids):
        super().__init__(ids)
        self.order = list(ids)

    def __iter__(self):
        return iter(self.order)


def observe_connector(recorder) -> None:
    """Records the scheduler's connector's answers as it gives them (its methods are called as
    before and return the same); nothing for a scheduler without one."""
    connector = recorder.scheduler.connector
    if connector is None:
        return
    matched, allocated = connector.get_num_new_matched_tokens, connector.update_state_after_alloc
    pending = connector.has_pending_block_frees

    def get_num_new_matched_tokens(request, num_computed_tokens):
        num_tokens, load_async = matched(request, num_computed_tokens)
        recorder.emit(ConnectorMatched(recorder.current_step(), recorder.seq_id(request), num_computed_tokens,
                                         -1 if num_tokens is None else num_tokens, bool(load_async)))
        return num_tokens, load_async

    def update_state_after_alloc(request, blocks, num_external_tokens):
        block_ids = blocks.get_block_ids()[0] if blocks.blocks and blocks.blocks[0] else ()
        recorder.emit(ConnectorAllocated(recorder.current_step(), recorder.seq_id(request), num_external_tokens,
                                           list(block_ids)))
        return allocated(request, blocks, num_external_tokens)

    def has_pending_block_frees():
        answer = pending()
        recorder.emit(ConnectorPending(recorder.current_step(), bool(answer)))
        return answer

    connector.get_num_new_matched_tokens = get_num_new_matched_tokens
    connector.update_state_after_alloc = update_state_after_alloc
    connector.has_pending_block_frees = has_pending_block_frees
    observe_deferred_frees(recorder)


def observe_deferred_frees(recorder) -> None:
    """A KV consumer with async scheduling (defer_block_free) takes a finished request's blocks
    from it at once but returns them to the pool only when no step in flight can still write them:
    the BlockFree is written then, when the pool has them (their request named as it was taken)."""
    scheduler = recorder.scheduler
    if not scheduler.defer_block_free:
        return
    manager = scheduler.kv_cache_manager
    pop, drain = manager.pop_blocks_for_free, scheduler._drain_deferred_frees
    taken: dict[int, int] = {}        # id of a list of blocks set aside -> its request's seq_id

    def pop_blocks_for_free(request):
        blocks = pop(request)
        if blocks and request.request_id in recorder.seq_ids:
            taken[id(blocks)] = recorder.seq_id(request)
        return blocks

    def drain_deferred_frees():
        queued = list(scheduler.deferred_frees)
        drain()
        for _, blocks in queued[:len(queued) - len(scheduler.deferred_frees)]:
            seq_id = taken.pop(id(blocks), None)
            if seq_id is not None:   # (a copy-on-write retention has no request: not a request's free)
                recorder.emit(BlockFree(recorder.current_step(), seq_id, [b.block_id for b in reversed(blocks)]))

    manager.pop_blocks_for_free = pop_blocks_for_free
    scheduler._drain_deferred_frees = drain_deferred_frees


def unobserve_connector(scheduler) -> None:
    """The connector's own methods back (recording stopped)."""
    for name in ("get_num_new_matched_tokens", "update_state_after_alloc", "has_pending_block_frees"):
        if scheduler.connector is not None:
            scheduler.connector.__dict__.pop(name, None)
    scheduler.kv_cache_manager.__dict__.pop("pop_blocks_for_free", None)
    scheduler.__dict__.pop("_drain_deferred_frees", None)


def connector_finished(recorder, request, answer) -> None:
    """The scheduler's _connector_finished answer for a finishing request (delay_free, params)."""
    if recorder is not None and recorder.scheduler.connector is not None:
        recorder.emit(ConnectorFinished(recorder.current_step(), recorder.seq_id(request), bool(answer[0])))


def transfers_done(recorder, model_output) -> None:
    """Before a step's output is processed: the transfers its workers report (a replay's stand-in
    gives the recorded ones to the output first)."""
    connector = recorder.scheduler.connector
    if connector is None:
        return
    step = recorder.num_updated
    if isinstance(connector, _standin_class()) and model_output.kv_connector_output is None:
        model_output.kv_connector_output = connector.output(step)
    out = model_output.kv_connector_output
    if out is None or not (out.finished_sending or out.finished_recving or out.failed_recving
                           or out.invalid_block_ids):
        return
    ids = recorder.seq_ids
    recorder.emit(KVTransfersDone(step, [ids[r] for r in out.finished_sending or ()],
                                  [ids[r] for r in out.finished_recving or ()],
                                  [ids[r] for r in out.failed_recving or ()], list(out.invalid_block_ids or ())))


# -- replay ---------------------------------------------------------------------------------------

def answer_connector(scheduler, frames) -> None:
    """Gives a replay's stand-in connector the trace's answers (nothing without one)."""
    connector = scheduler.connector
    if connector is None or not isinstance(connector, _standin_class()):
        return
    request_ids: dict[int, str] = {}
    for frame in frames:
        for e in frame:
            t = type(e)
            if t is RequestAdded:
                request_ids[e.seq_id] = e.request_id
            elif t is ConnectorMatched:
                connector.matched.setdefault(request_ids[e.seq_id], deque()).append(
                    (None if e.num_external_tokens < 0 else e.num_external_tokens, e.load_async))
            elif t is ConnectorFinished:
                connector.finished.setdefault(request_ids[e.seq_id], deque()).append(e.delay_free)
            elif t is ConnectorPending:
                connector.pending_frees.append(e.pending)
            elif t is KVTransfersDone:
                connector.transfers[e.step] = tuple([request_ids[s] for s in ids] for ids in (
                    e.finished_sending, e.finished_recving, e.failed_recving)) + (e.invalid_block_ids,)


def _standin_class():
    return __getattr__(STANDIN_NAME)


def __getattr__(name: str):
    """ReplayConnector, made when first asked for (vLLM's connector factory asks by name), so that
    vLLM is imported then and not when this module is."""
    if name != STANDIN_NAME:
        raise AttributeError(name)
    cls = globals().get("_ReplayConnector")
    if cls is None:
        cls = globals()["_ReplayConnector"] = _make_standin()
    return cls


def _make_standin():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                   SupportsHMA)
    from vllm.v1.outputs import KVConnectorOutput

    class ReplayConnector(KVConnectorBase_V1, SupportsHMA):
        """A connector that answers the scheduler from a trace (answer_from): each question in the
        order the recording's connector was asked; a question the trace does not hold gets the
        answer of a connector that has nothing (the replay's comparison then finds the step)."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            super().__init__(vllm_config, role, kv_cache_config)
            extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
            self._requires_delivery = bool(extra.get("requires_delivery", False))
            self.matched: dict[str, deque] = {}
            self.finished: dict[str, deque] = {}
            self.pending_frees: deque = deque()
            self.transfers: dict[int, tuple] = {}

        @property
        def requires_kv_delivery(self) -> bool:
            return self._requires_delivery

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            answers = self.matched.get(request.request_id)
            return answers.popleft() if answers else (0, False)

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            pass

        def build_connector_meta(self, scheduler_output):
            return KVConnectorMetadata()

        def has_pending_block_frees(self) -> bool:
            return self.pending_frees.popleft() if self.pending_frees else False

        def request_finished(self, request, block_ids):
            answers = self.finished.get(request.request_id)
            return (answers.popleft() if answers else False), None

        def request_finished_all_groups(self, request, block_ids):
            return self.request_finished(request, block_ids)

        def register_finished_partial_tail(self, request, block_ids, finished_partial_tails) -> bool:
            return False     # the recorded request_finished answer holds a partial tail's delay

        def output(self, step: int):
            """The step's recorded kv_connector_output (None: none)."""
            recorded = self.transfers.get(step)
            if recorded is None:
                return None
            sending, recving, failed, invalid = recorded
            return KVConnectorOutput(finished_sending=OrderedIds(sending), finished_recving=OrderedIds(recving),
                                     failed_recving=OrderedIds(failed), invalid_block_ids=set(invalid))

        # the worker's side: a replay has no worker
        def start_load_kv(self, forward_context, **kwargs) -> None:
            pass

        def wait_for_layer_load(self, layer_name: str) -> None:
            pass

        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
            pass

        def wait_for_save(self):
            pass

    ReplayConnector.__module__, ReplayConnector.__qualname__ = STANDIN_MODULE, STANDIN_NAME
    return ReplayConnector

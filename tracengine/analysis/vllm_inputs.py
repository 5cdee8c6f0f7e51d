"""What a vLLM trace says its scheduler was told besides requests and tokens: a KV connector's
answers and its workers' transfers, and structured output's grammars (tracengine/vllm/connector.py,
structured.py). The request timeline folds their events here (a record made at the first of
them, so a trace without any costs nothing); `stats` reports the figures."""
from tracengine.analysis.kv_groups import FOLD as KV_GROUPS_FOLD
from tracengine.analysis.figures import KVConnectorFigures, StructuredOutputFigures, summarize
from tracengine.trace.vllm_events import (GrammarRequested, GrammarState, ConnectorAllocated, ConnectorFinished,
                                          ConnectorMatched, KVTransfersDone)

_CONNECTOR_COUNTS = ("num_lookups", "num_lookups_pending", "num_external_admissions", "num_external_tokens",
                     "num_async_loads", "num_finished_recving", "num_finished_sending", "num_failed_recving",
                     "num_delayed_frees")


class VllmInputs:
    def __init__(self):
        self.connector = dict.fromkeys(_CONNECTOR_COUNTS, 0)
        self.async_pending: set[int] = set()      # matched asynchronously, until admitted
        self.grammar_added: dict[int, int] = {}   # seq_id -> the step it arrived at
        self.grammar_waits: list[int] = []
        self.grammar_states = {"ready": 0, "rejected": 0}
        self.grammar_failed: set[int] = set()
        self.has_connector = False


def _record(timeline) -> VllmInputs:
    record = getattr(timeline, "vllm_inputs", None)
    if record is None:
        record = timeline.vllm_inputs = VllmInputs()
    return record


def connector_matched(timeline, event: ConnectorMatched) -> None:
    record = _record(timeline)
    record.has_connector = True
    record.connector["num_lookups"] += 1
    record.connector["num_lookups_pending"] += event.num_external_tokens < 0
    if event.load_async:
        record.async_pending.add(event.seq_id)


def connector_allocated(timeline, event: ConnectorAllocated) -> None:
    counts = _record(timeline).connector
    if event.num_external_tokens:
        counts["num_external_admissions"] += 1
        counts["num_external_tokens"] += event.num_external_tokens
        counts["num_async_loads"] += event.seq_id in _record(timeline).async_pending
    _record(timeline).async_pending.discard(event.seq_id)


def connector_finished(timeline, event: ConnectorFinished) -> None:
    record = _record(timeline)
    record.has_connector = True
    record.connector["num_delayed_frees"] += event.delay_free


def transfers_done(timeline, event: KVTransfersDone) -> None:
    counts = _record(timeline).connector
    counts["num_finished_recving"] += len(event.finished_recving)
    counts["num_finished_sending"] += len(event.finished_sending)
    counts["num_failed_recving"] += len(event.failed_recving)


def grammar_requested(timeline, event: GrammarRequested) -> None:
    _record(timeline).grammar_added[event.seq_id] = event.step


def grammar_state(timeline, event: GrammarState) -> None:
    record = _record(timeline)
    if event.state == "failed":      # asked again each step until the error ends the request: once
        record.grammar_failed.add(event.seq_id)
        return
    record.grammar_states[event.state] += 1
    added = record.grammar_added.get(event.seq_id)
    if event.state == "ready" and added is not None:
        record.grammar_waits.append(event.step - added)


FOLD = {ConnectorMatched: connector_matched, ConnectorAllocated: connector_allocated,
        ConnectorFinished: connector_finished, KVTransfersDone: transfers_done,
        GrammarRequested: grammar_requested, GrammarState: grammar_state,
        **KV_GROUPS_FOLD}   # a hybrid model's groups; BlockAllocate's prefix-cache figures stay the first group's


def connector_figures(timeline) -> KVConnectorFigures | None:
    record, header = getattr(timeline, "vllm_inputs", None), timeline.header
    name = header.config.get("kv_connector") if header is not None else None
    if not name and (record is None or not record.has_connector):
        return None
    counts = record.connector if record is not None else dict.fromkeys(_CONNECTOR_COUNTS, 0)
    return KVConnectorFigures(kv_connector=name or "", **counts)


def structured_output_figures(timeline) -> StructuredOutputFigures | None:
    record = getattr(timeline, "vllm_inputs", None)
    if record is None or not record.grammar_added:
        return None
    states = record.grammar_states
    return StructuredOutputFigures(num_requests=len(record.grammar_added), num_ready=states["ready"],
                                   num_failed=len(record.grammar_failed), num_rejected=states["rejected"],
                                   grammar_wait_steps=summarize([float(w) for w in record.grammar_waits]))


def vllm_inputs_lines(stats) -> list[tuple[str, str]]:
    """`stats`' table rows of a connector and of grammars (none without them)."""
    rows = []
    c = stats.kv_connector
    if c is not None:
        rows.append(("KV connector", f"{c.kv_connector}: {c.num_lookups:,} lookups ({c.num_lookups_pending:,} "
                                     f"pending), {c.num_external_tokens:,} external tokens in "
                                     f"{c.num_external_admissions:,} admissions ({c.num_async_loads:,} async); "
                                     f"{c.num_finished_recving:,} received, {c.num_finished_sending:,} sent, "
                                     f"{c.num_failed_recving:,} failed, {c.num_delayed_frees:,} frees delayed"))
    g = stats.structured_output
    if g is not None:
        wait = "-" if g.grammar_wait_steps.mean is None else f"{g.grammar_wait_steps.mean:,.1f}"
        rows.append(("structured output", f"{g.num_requests:,} requests: {g.num_ready:,} grammars ready "
                                          f"(wait mean {wait} steps), {g.num_failed:,} failed, "
                                          f"{g.num_rejected:,} rejected a token"))
    return rows


def step_items(e) -> tuple[str, str] | None:
    """A step table's item for a connector's or a grammar's event (render.py): (its label, the
    item); None for one the table leaves out (a lookup, asked again each step a head waits)."""
    t = type(e)
    if t is ConnectorAllocated:
        return ("kv", f"s{e.seq_id}:load {e.num_external_tokens}") if e.num_external_tokens else None
    if t is ConnectorFinished:
        return ("kv", f"s{e.seq_id}:keep") if e.delay_free else None
    if t is KVTransfersDone:
        done = [f"s{s}:{what}" for what, ids in (("sent", e.finished_sending), ("received", e.finished_recving),
                                                 ("failed", e.failed_recving)) for s in ids]
        return ("kv", " ".join(done)) if done else None
    if t is GrammarState:
        return "grammar", f"s{e.seq_id}:{e.state}"
    if t is GrammarRequested:
        return "grammar", f"s{e.seq_id}:waits({e.kind})"
    return None

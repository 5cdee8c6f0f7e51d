"""NVIDIA Dynamo's agentic Mooncake trace read as sessions (docs/workloads.md).

The file is a header row (`"schema": "dynamo.agentic_mooncake"`, `"version": 2`, `block_size`:
the tokens of a hash id, `"hash_id_scope": "local"`) and one row per request: `request_id`,
`play_id`, `session_id`, `input_length`, `output_length`, `hash_ids` (the whole prompt, its
history included, as recorded), `not_before_ms` and `dependencies` (request ids, each with a
`trigger`, a `delay_ms` and a `relation`). Dynamo's replay sends a request at the latest of its
`not_before_ms` and each dependency's finish plus that dependency's delay; a failed request
skips the rest of its play.

A play is a tracengine session: its root (the row with no dependencies) is turn 0, sent at its
`not_before_ms` (counted, as Dynamo counts, from the earliest `not_before_ms` of any row), and
its other rows are later turns in an order that puts each after those it depends on. A later turn's prompt is its own
hash ids, whole (not composed from the history: Dynamo sends the recorded prompt too), and it is
sent `delay_ms` after the last of its dependencies finished. That is Dynamo's rule exactly when a
row's delays are equal and its `not_before_ms` cannot hold it past its dependencies; a row that
needs more is refused, naming it, rather than read as something else: a `dispatch` trigger (sent
when the dependency is sent), unequal delays, a binding `not_before_ms`, a play with several
roots, a dependency on another play, priorities. Dynamo's `session_id` (a conversation inside
the play), `model`, `relation`, `output_token_ids` and `policy_class` are not read."""
from graphlib import CycleError, TopologicalSorter

from tracengine.engine.request import NO_TIME, Request
from tracengine.errors import TracengineError
from tracengine.workload.rows import hash_id_tokens, integer_field, number_field, require_field, scale_length

SCHEMA, VERSION = "dynamo.agentic_mooncake", 2
UNSUPPORTED = ("priority", "strict_priority")      # a request's place in Dynamo's priority queues


def is_agentic_header(record: dict) -> bool:
    return record.get("schema") == SCHEMA


def agentic_rows(records, vocab_size: int, length_scale: float, hash_id_prompts: bool):
    """The turns of `records` ((FILE:LINE, object) of each row, the header first): the plays in the
    order of their roots' `not_before_ms`, each play's turns after its root."""
    where, header = next(records)
    block_tokens = _header_block_size(header, where)
    rows, plays = _request_rows(records)
    if not rows:
        return
    delays = {request_id: _delay(record, where, rows) for request_id, (where, record) in rows.items()}
    not_before = {request_id: _not_before(record, where) for request_id, (where, record) in rows.items()}
    origin = min(not_before.values())       # Dynamo's clock starts at the earliest not_before_ms of any row
    orders = [_turn_order(play, ids, rows) for play, ids in plays.items()]
    for order in orders:
        _check_not_before(order, rows, not_before, delays)
    for order in sorted(orders, key=lambda order: not_before[order[0]]):      # stable: ties in file order
        turn_of = {request_id: turn for turn, request_id in enumerate(order)}
        for turn, request_id in enumerate(order):
            where, record = rows[request_id]
            input_length = integer_field(require_field(record, "input_length", where), "input_length", where, 1)
            output_length = integer_field(require_field(record, "output_length", where), "output_length", where, 0)
            prompt = hash_id_tokens(require_field(record, "hash_ids", where), input_length, where, vocab_size,
                                    length_scale, hash_id_prompts, block_tokens)
            deps = _dependencies(record)
            arrival_ns = NO_TIME if deps else round((not_before[request_id] - origin) * 1_000_000)
            # an output length of 0 still samples the first token, as every engine does
            yield Request(prompt, scale_length(max(output_length, 1), length_scale), arrival_ns, ignore_eos=True,
                          source=where, session_id=record["play_id"], turn=turn,
                          depends_on=tuple(sorted(turn_of[d] for d in deps)),
                          think_ns=round(delays[request_id] * 1_000_000))


def _request_rows(records) -> tuple[dict, dict]:
    """request_id -> (FILE:LINE, row), and play_id -> its request ids in file order."""
    rows, plays = {}, {}
    for where, record in records:
        request_id = require_field(record, "request_id", where)
        if not isinstance(request_id, str) or not request_id:
            raise TracengineError(f"{where}: request_id must be a non-empty string, got {request_id!r}")
        if request_id in rows:
            raise TracengineError(f"{where}: request_id {request_id!r} is also on {rows[request_id][0]}")
        play = require_field(record, "play_id", where)
        if not isinstance(play, str) or not play:
            raise TracengineError(f"{where}: play_id must be a non-empty string, got {play!r}")
        for name in UNSUPPORTED:
            if record.get(name):
                raise TracengineError(f"{where}: {name} {record[name]!r}: tracengine does not read Dynamo's "
                                      f"request priorities")
        rows[request_id] = (where, record)
        plays.setdefault(play, []).append(request_id)
    return rows, plays


def _not_before(record: dict, where: str) -> float:
    not_before = number_field(require_field(record, "not_before_ms", where), "not_before_ms", where)
    if not_before < 0:
        raise TracengineError(f"{where}: not_before_ms is negative ({not_before:g})")
    return not_before


def _check_not_before(order: list[str], rows: dict, not_before: dict, delays: dict) -> None:
    """A later turn's `not_before_ms` must not be able to hold it past its dependencies: it is at
    most the soonest Dynamo could send it were they to finish at once (they finish later)."""
    earliest = {}
    for request_id in order:
        deps = _dependencies(rows[request_id][1])
        if not deps:
            earliest[request_id] = not_before[request_id]
            continue
        earliest[request_id] = max(earliest[d] for d in deps) + delays[request_id]
        if not_before[request_id] > earliest[request_id]:
            raise TracengineError(f"{rows[request_id][0]}: not_before_ms {not_before[request_id]:g} may hold "
                                  f"request {request_id!r} past its dependencies; tracengine sends a later turn "
                                  f"delay_ms after them only")


def _header_block_size(header: dict, where: str) -> int:
    if header.get("version") != VERSION:
        raise TracengineError(f"{where}: {SCHEMA} version {header.get('version')!r}; tracengine reads version "
                              f"{VERSION}")
    if header.get("hash_id_scope") != "local":
        raise TracengineError(f"{where}: hash_id_scope {header.get('hash_id_scope')!r}; tracengine reads "
                              f"'local' (hash ids shared by the whole file)")
    return integer_field(require_field(header, "block_size", where), "block_size", where, 1)


def _dependencies(record: dict) -> list[str]:
    return [d["request_id"] for d in record.get("dependencies") or ()]


def _delay(record: dict, where: str, rows: dict) -> float:
    """A row's one delay: its dependencies' `delay_ms`, checked (0 for a root)."""
    deps = record.get("dependencies") or []
    if not isinstance(deps, list):
        raise TracengineError(f"{where}: dependencies must be a list, got {deps!r}")
    delays = set()
    for dep in deps:
        if not isinstance(dep, dict):
            raise TracengineError(f"{where}: a dependency must be an object, got {dep!r}")
        request_id = require_field(dep, "request_id", where)
        if not isinstance(request_id, str) or request_id not in rows:
            raise TracengineError(f"{where}: depends on request {request_id!r}, which is not in the file")
        if rows[request_id][1]["play_id"] != record["play_id"]:
            raise TracengineError(f"{where}: depends on request {request_id!r} of another play "
                                  f"({rows[request_id][1]['play_id']!r})")
        trigger = dep.get("trigger")
        if trigger != "completion":
            raise TracengineError(f"{where}: trigger {trigger!r}: tracengine sends a turn after the turns it "
                                  f"depends on finished ('completion'), not when they are sent")
        delay = number_field(require_field(dep, "delay_ms", where), "delay_ms", where)
        if delay < 0:
            raise TracengineError(f"{where}: delay_ms is negative ({delay:g})")
        delays.add(delay)
    if len(delays) > 1:
        listed = ", ".join(f"{d:g}" for d in sorted(delays))
        raise TracengineError(f"{where}: dependencies with different delay_ms ({listed}): tracengine sends a "
                              f"turn one think time after the last of them finished")
    if len({d["request_id"] for d in deps}) != len(deps):
        raise TracengineError(f"{where}: dependencies name a request twice")
    return delays.pop() if delays else 0.0


def _turn_order(play: str, ids: list[str], rows: dict) -> list[str]:
    """A play's request ids as turns: each after those it depends on (in rounds: the rows whose
    dependencies are all in earlier rounds, in file order)."""
    roots = [request_id for request_id in ids if not _dependencies(rows[request_id][1])]
    if len(roots) != 1:
        where = rows[ids[0]][0]
        raise TracengineError(f"{where}: play {play!r} has {len(roots)} requests without dependencies; tracengine "
                              f"reads a play as a session, sent from its one root")
    place = {request_id: i for i, request_id in enumerate(ids)}
    sorter = TopologicalSorter({request_id: _dependencies(rows[request_id][1]) for request_id in ids})
    try:
        sorter.prepare()
    except CycleError as exc:
        raise TracengineError(f"{rows[exc.args[1][0]][0]}: play {play!r}: its dependencies go round in a circle "
                              f"({' -> '.join(exc.args[1])})") from None
    order = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=place.__getitem__)
        order += ready
        sorter.done(*ready)
    return order

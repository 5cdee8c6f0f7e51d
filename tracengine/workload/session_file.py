"""The rows of a sessions file: tracengine JSONL whose rows carry a `session_id` (docs/workloads.md).

Each session's rows are its turns, in order (sessions may interleave). The first turn has
`timestamp` (ms from the start of the run); a later turn has `think_ms` (the time after the
turns it depends on finished before it is sent; default 0) and `depends_on` (the turn indices
of its session it waits for; default the turn before). Each turn has its new input, as
`prompt` text, `prompt_token_ids`, `hash_ids` with `input_length` (Mooncake's blocks of 512
tokens), or `input_length` alone (tokens of its own), and `output_length` (it runs with
ignore_eos). A later turn's prompt is composed when it is sent (workload/sessions.py)."""
import random
import struct

from tracengine.engine.request import NO_TIME, Request
from tracengine.errors import TracengineError
from tracengine.workload.rows import (hash_id_tokens, integer_field, number_field, require_field, scale_length,
                                      text_prompt, token_ids)
from tracengine.workload.sessions import set_history_bounds

SESSION_FIELDS = frozenset({"session_id", "timestamp", "think_ms", "depends_on", "prompt", "prompt_token_ids",
                            "hash_ids", "input_length", "output_length"})
PROMPT_FIELDS = ("prompt", "prompt_token_ids", "hash_ids")


def session_rows(records, vocab_size: int, length_scale: float, seed: int, hash_id_prompts: bool):
    """The turns of `records` ((FILE:LINE, object) of each row), in file order. Read whole: a
    turn's history bound (Request.num_history_tokens) needs the turns before it."""
    num_turns: dict[str, int] = {}
    requests = []
    for where, record in records:
        unknown = sorted(record.keys() - SESSION_FIELDS)
        if unknown:
            raise TracengineError(f"{where}: unknown field {unknown[0]!r} in a sessions file; known: "
                                  f"{', '.join(sorted(SESSION_FIELDS))}")
        session = require_field(record, "session_id", where)
        if isinstance(session, bool) or not isinstance(session, (str, int)) or session == "":
            raise TracengineError(f"{where}: session_id must be a non-empty string or an integer, got {session!r}")
        session = str(session)
        turn = num_turns.get(session, 0)
        num_turns[session] = turn + 1
        arrival_ns, think_ns, depends_on = _timing(record, where, session, turn)
        prompt = _new_input(record, where, vocab_size, length_scale, seed, hash_id_prompts)
        output_length = integer_field(require_field(record, "output_length", where), "output_length", where, 0)
        # an output length of 0 still samples the first token, as every engine does
        requests.append(Request(prompt, scale_length(max(output_length, 1), length_scale), arrival_ns,
                                ignore_eos=True, source=where, session_id=session, turn=turn,
                                depends_on=depends_on, think_ns=think_ns, num_history_tokens=1 if turn else 0))
    set_history_bounds(requests)
    return requests


def _timing(record: dict, where: str, session: str, turn: int) -> tuple[int, int, tuple[int, ...]]:
    """(arrival_ns, think_ns, depends_on) of a turn: the first's arrival; a later one's wait."""
    if turn == 0:
        for name in ("think_ms", "depends_on"):
            if name in record:
                raise TracengineError(f"{where}: the first turn of session {session!r} is sent at its timestamp; "
                                      f"{name} is for a later turn")
        timestamp = number_field(require_field(record, "timestamp", where), "timestamp", where)
        if timestamp < 0:
            raise TracengineError(f"{where}: timestamp is negative ({timestamp:g})")
        return round(timestamp * 1_000_000), 0, ()
    if "timestamp" in record:
        raise TracengineError(f"{where}: turn {turn} of session {session!r} is sent think_ms after the turns it "
                              f"depends on, not at a timestamp")
    think_ms = number_field(record.get("think_ms", 0), "think_ms", where)
    if think_ms < 0:
        raise TracengineError(f"{where}: think_ms is negative ({think_ms:g})")
    depends_on = record.get("depends_on", [turn - 1])
    if not isinstance(depends_on, list) or not depends_on:
        raise TracengineError(f"{where}: depends_on must be a non-empty list of earlier turns, got {depends_on!r}")
    for d in depends_on:
        integer_field(d, "a turn in depends_on", where, 0)
        if d >= turn:
            raise TracengineError(f"{where}: turn {turn} of session {session!r} depends on turn {d}, which is not "
                                  f"before it")
    if len(set(depends_on)) != len(depends_on):
        raise TracengineError(f"{where}: depends_on names a turn twice: {depends_on}")
    return NO_TIME, round(think_ms * 1_000_000), tuple(depends_on)


def _new_input(record: dict, where: str, vocab_size: int, length_scale: float, seed: int, hash_id_prompts: bool):
    """A turn's own input: text, token ids, tokens of hash ids, or `input_length` tokens of its own."""
    given = [name for name in PROMPT_FIELDS if name in record]
    if len(given) > 1:
        raise TracengineError(f"{where}: give one of {', '.join(PROMPT_FIELDS)} (or input_length alone), "
                              f"not {' and '.join(given)}")
    if given == ["prompt"]:
        return text_prompt(record, where, length_scale)
    if given == ["prompt_token_ids"]:
        return token_ids(record["prompt_token_ids"], where, vocab_size, length_scale)
    input_length = integer_field(require_field(record, "input_length", where), "input_length", where, 1)
    if given == ["hash_ids"]:
        # tokens, not a HashIdPrompt: the history a later turn is sent after is token ids, and a
        # token prompt of a hash-id prompt's twin tokens hashes to the same blocks
        return list(hash_id_tokens(record["hash_ids"], input_length, where, vocab_size, length_scale, hash_id_prompts))
    num_tokens = scale_length(input_length, length_scale)
    raw = random.Random(f"session:{seed}:{where.rpartition(':')[2]}").randbytes(4 * num_tokens)
    return [v % vocab_size for v in struct.unpack(f"<{num_tokens}I", raw)]

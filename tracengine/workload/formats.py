"""Workload files: requests with arrival times, from a Mooncake JSONL trace, an
Azure LLM inference trace (CSV), tracengine's own JSONL or Dynamo's agentic Mooncake
JSONL (docs/workloads.md).

Model-free and torch-free: `read_workload` returns `Request`s (prompt text or
token ids, max_tokens, sampling fields, arrival in seconds from the start of
the run) for the engine, the simulator and the serving benchmark alike. Every
malformed line is a one-line `TracengineError` naming FILE:LINE."""
import json
import math
import random
import struct
from collections.abc import Iterator
from datetime import datetime
from functools import partial
from itertools import chain

from tracengine.engine.request import Request
from tracengine.errors import TracengineError

from tracengine.workload.agentic_mooncake import SCHEMA as AGENTIC_SCHEMA, agentic_rows, is_agentic_header
from tracengine.workload.rows import (hash_id_tokens, integer_field, number_field, require_field, scale_length,
                                      text_prompt, token_ids)

FORMATS = ("mooncake", "azure", "tracengine", "agentic_mooncake")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
TRACENGINE_FIELDS = frozenset({"arrival_s", "prompt", "prompt_token_ids", "max_tokens", "temperature",
                               "ignore_eos", "top_k", "top_p", "seed"})
DEFAULT_MAX_TOKENS = 64


def read_workload(path: str, format: str | None = None, *, vocab_size: int, max_requests: int | None = None,
                  time_scale: float = 1.0, length_scale: float = 1.0, max_model_len: int | None = None,
                  seed: int = 0, hash_id_prompts: bool = False) -> list[Request]:
    """The requests of a workload file, in arrival order.

    `format`: one of FORMATS, or None to detect it. `vocab_size` bounds the token ids
    (made up for the length-only formats, checked for given ones). `max_requests`: the
    first N. `time_scale` X: arrivals X times faster. `length_scale` X: prompt and
    output lengths times X, at least 1 token. `max_model_len`: a prompt longer than it
    can never run and is an error naming its line. Mooncake and Azure times count from
    the first request; tracengine's `arrival_s` is taken as written; an agentic Mooncake file's
    from its earliest `not_before_ms`, as Dynamo counts them. `hash_id_prompts`: a
    Mooncake prompt as its hash ids (engine.hash_id_prompt.HashIdPrompt), never expanded into
    tokens, for a run with no model (simulation)."""
    return list(iter_workload(path, format, vocab_size=vocab_size, max_requests=max_requests,
                              time_scale=time_scale, length_scale=length_scale, max_model_len=max_model_len,
                              seed=seed, hash_id_prompts=hash_id_prompts))


def iter_workload(path: str, format: str | None = None, *, vocab_size: int, max_requests: int | None = None,
                  time_scale: float = 1.0, length_scale: float = 1.0, max_model_len: int | None = None,
                  seed: int = 0, hash_id_prompts: bool = False) -> Iterator[Request]:
    """read_workload's requests one at a time, as the file gives them (in arrival order): a run
    that takes each when it arrives holds none it has not reached. The arguments are checked
    now; a bad line is an error when it is reached."""
    if format is None:
        format = detect_format(path)
    if format not in FORMATS:
        raise TracengineError(f"unknown workload format {format!r}; known: {', '.join(FORMATS)}")
    for name, value in (("time scale", time_scale), ("length scale", length_scale)):
        if not (value > 0 and math.isfinite(value)):
            raise TracengineError(f"{name} must be a positive number, got {value!r}")
    if max_requests is not None and max_requests <= 0:
        raise TracengineError(f"max requests must be positive, got {max_requests}")
    if vocab_size <= 0:
        raise TracengineError(f"vocab size must be positive, got {vocab_size}")
    parse = {"mooncake": partial(_mooncake, hash_id_prompts=hash_id_prompts), "azure": _azure,
             "tracengine": partial(_tracengine, hash_id_prompts=hash_id_prompts),
             "agentic_mooncake": partial(_agentic_mooncake, hash_id_prompts=hash_id_prompts)}[format]
    return _read(path, parse, vocab_size, length_scale, seed, max_requests, max_model_len,
                 format in ("mooncake", "azure"), time_scale)


def _read(path, parse, vocab_size, length_scale, seed, max_requests, max_model_len, from_first: bool,
          time_scale: float) -> Iterator[Request]:
    """The requests, checked line by line; `from_first`: times count from the first request's."""
    num_requests, origin, last_ns = 0, None, None
    # utf-8-sig: a byte-order mark (some editors write one) is not part of the first line
    with open(path, encoding="utf-8-sig", newline="") as f:
        for request in parse(_text_lines(f, path), path, vocab_size, length_scale, seed):
            if request.depends_on:      # a later turn of a session: sent when its session releases it
                _check_fits(request, max_model_len)
                request.think_ns = round(request.think_ns / time_scale)
                yield request
                num_requests += 1
                if num_requests == max_requests:
                    break
                continue
            if last_ns is not None and request.arrival_ns < last_ns:
                raise TracengineError(f"{request.source}: arrival time goes back ({request.arrival_s:g} s after "
                                      f"{last_ns / 1e9:g} s on the line before): timestamps must not decrease")
            _check_fits(request, max_model_len)
            last_ns = request.arrival_ns
            if origin is None:
                origin = last_ns if from_first else 0
            request.arrival_ns = round((last_ns - origin) / time_scale)
            yield request
            num_requests += 1
            if num_requests == max_requests:
                break
    if not num_requests:
        raise TracengineError(f"{path}: no requests")


def _check_fits(request: Request, max_model_len: int | None) -> None:
    """A prompt longer than max_model_len (a session's turn: with all the history it may follow) never runs."""
    if max_model_len is not None and not isinstance(request.prompt, str):
        num_tokens = len(request.prompt) + request.num_history_tokens
        if num_tokens > max_model_len:
            raise TracengineError(f"{request.source}: a prompt of {num_tokens} tokens"
                                  f"{' (with its history)' if request.num_history_tokens else ''} can never fit "
                                  f"max_model_len={max_model_len} (--length-scale shortens prompts)")


def detect_format(path: str) -> str:
    """The format of a workload file, from its first non-blank line."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        for number, line in enumerate(_text_lines(f, path), 1):
            if line.strip():
                break
        else:
            raise TracengineError(f"{path}: no requests")
    line = line.strip()
    if line.startswith("{"):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            if is_agentic_header(record):      # Dynamo's (workload/agentic_mooncake.py)
                return "agentic_mooncake"
            if "session_id" in record:      # tracengine's sessions (workload/session_file.py)
                return "tracengine"
            if "hash_ids" in record or "input_length" in record:
                return "mooncake"
            if {"arrival_s", "prompt", "prompt_token_ids"} & record.keys():
                return "tracengine"
    elif "TIMESTAMP" in line.split(","):
        return "azure"
    raise TracengineError(f"{path}:{number}: unknown workload format (not Mooncake JSONL, an Azure CSV, "
                          f"tracengine JSONL or Dynamo's agentic Mooncake); name it with --workload-format "
                          f"{{{','.join(FORMATS)}}}")


def _text_lines(f, path: str):
    """The lines of the text file `f`; bytes that are not UTF-8 (a trace given for a
    workload, a compressed file) are one line naming the file."""
    try:
        yield from f
    except UnicodeDecodeError:
        raise TracengineError(f"{path}: not a workload file (not UTF-8 text: JSONL or CSV)") from None


def _json_lines(f, path: str):
    for number, line in enumerate(f, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TracengineError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise TracengineError(f"{where}: expected a JSON object, got {type(record).__name__}")
        yield where, record


def _mooncake(f, path, vocab_size, length_scale, seed, hash_id_prompts=False):
    for where, record in _json_lines(f, path):
        timestamp = number_field(require_field(record, "timestamp", where), "timestamp", where)
        input_length = integer_field(require_field(record, "input_length", where), "input_length", where, 1)
        output_length = integer_field(require_field(record, "output_length", where), "output_length", where, 0)
        prompt = hash_id_tokens(require_field(record, "hash_ids", where), input_length, where, vocab_size, length_scale,
                                hash_id_prompts)
        # An output length of 0 still samples the first token, as every engine does.
        yield Request(prompt, scale_length(max(output_length, 1), length_scale), round(timestamp * 1_000_000),
                      ignore_eos=True, source=where)


def _agentic_mooncake(f, path, vocab_size, length_scale, seed, hash_id_prompts=False):
    records = _json_lines(f, path)
    first = next(records, None)
    if first is None:
        return
    if not is_agentic_header(first[1]):
        raise TracengineError(f"{first[0]}: an agentic Mooncake file starts with its header "
                              f"({{\"schema\": \"{AGENTIC_SCHEMA}\", ...}})")
    yield from agentic_rows(chain([first], records), vocab_size, length_scale, hash_id_prompts)


def _azure(f, path, vocab_size, length_scale, seed):
    import csv      # here: only Azure's traces are CSV
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None:
        return
    header = [name.strip() for name in header]
    for name in AZURE_COLUMNS:
        if name not in header:
            raise TracengineError(f"{path}:{reader.line_num}: missing column {name!r} (an Azure trace has "
                                  f"{', '.join(AZURE_COLUMNS)})")
    i_time, i_context, i_generated = (header.index(name) for name in AZURE_COLUMNS)
    first = None
    for row in reader:
        where = f"{path}:{reader.line_num}"
        if not row or not "".join(row).strip():
            continue
        if len(row) < len(header):
            raise TracengineError(f"{where}: {len(row)} columns, the header has {len(header)}")
        try:
            when = datetime.fromisoformat(row[i_time].strip())
        except ValueError:
            raise TracengineError(f"{where}: TIMESTAMP is not a date and time: {row[i_time]!r}") from None
        lengths = []
        for i, name, minimum in ((i_context, "ContextTokens", 1), (i_generated, "GeneratedTokens", 0)):
            try:
                value = int(row[i].strip())
            except ValueError:
                raise TracengineError(f"{where}: {name} must be an integer, got {row[i]!r}") from None
            lengths.append(integer_field(value, name, where, minimum))
        first = when if first is None else first
        try:
            arrival_s = (when - first).total_seconds()
        except TypeError:
            raise TracengineError(f"{where}: TIMESTAMP {row[i_time]!r} mixes a time zone with the first "
                                  f"line's") from None
        # The trace has lengths only: each request gets tokens of its own (no shared prefixes).
        num_tokens = scale_length(lengths[0], length_scale)
        raw = random.Random(f"azure:{seed}:{reader.line_num}").randbytes(4 * num_tokens)
        prompt = [v % vocab_size for v in struct.unpack(f"<{num_tokens}I", raw)]
        yield Request(prompt, scale_length(max(lengths[1], 1), length_scale), round(arrival_s * 1e9),
                      ignore_eos=True, source=where)


def _tracengine(f, path, vocab_size, length_scale, seed, hash_id_prompts=False):
    records = _json_lines(f, path)
    first = next(records, None)
    if first is None:
        return
    records = chain([first], records)
    if "session_id" in first[1]:      # a sessions file (workload/session_file.py)
        from tracengine.workload.session_file import session_rows
        yield from session_rows(records, vocab_size, length_scale, seed, hash_id_prompts)
        return
    for where, record in records:
        unknown = sorted(record.keys() - TRACENGINE_FIELDS)
        if unknown:
            raise TracengineError(f"{where}: unknown field {unknown[0]!r}; known: {', '.join(sorted(TRACENGINE_FIELDS))}")
        arrival_s = number_field(require_field(record, "arrival_s", where), "arrival_s", where)
        if arrival_s < 0:
            raise TracengineError(f"{where}: arrival_s is negative ({arrival_s:g})")
        if ("prompt" in record) == ("prompt_token_ids" in record):
            raise TracengineError(f"{where}: give one of 'prompt' or 'prompt_token_ids'")
        if "prompt" in record:
            prompt = text_prompt(record, where, length_scale)
        else:
            prompt = token_ids(record["prompt_token_ids"], where, vocab_size, length_scale)
        max_tokens = integer_field(record.get("max_tokens", DEFAULT_MAX_TOKENS), "max_tokens", where, 1)
        temperature = number_field(record.get("temperature", 1.0), "temperature", where)
        if temperature < 0:
            raise TracengineError(f"{where}: temperature is negative ({temperature:g})")
        top_k = integer_field(record.get("top_k", -1), "top_k", where, -1)
        if top_k == 0:
            raise TracengineError(f"{where}: top_k must be -1 (all tokens) or positive, got 0")
        top_p = number_field(record.get("top_p", 1.0), "top_p", where)
        if not 0 < top_p <= 1:
            raise TracengineError(f"{where}: top_p must be in (0, 1], got {top_p:g}")
        ignore_eos = record.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise TracengineError(f"{where}: ignore_eos must be true or false, got {ignore_eos!r}")
        yield Request(prompt, scale_length(max_tokens, length_scale), round(arrival_s * 1e9), temperature, ignore_eos,
                      top_k, top_p, integer_field(record.get("seed", -1), "seed", where, -1), source=where)

"""A runner without a model for simulation (`SyntheticRunner`: it answers `run(seqs,
is_prefill)` like the model runner, from a hash instead of logits), and `run_workload`, which
drives the engine's step loop over requests added by step."""
import math
from typing import Any

import xxhash

from tracengine.engine.config import Config
from tracengine.errors import RequestError
from tracengine.sim.clock import StepClockedEngine, in_arrival_order, run_in_time
from tracengine.sim.synthetic_keys import synthetic_tokens
from tracengine.trace.sinks import ListSink
import tracengine.engine.core_choice as core_choice
from tracengine.engine.llm_engine import LLMEngine
from tracengine.engine.request import Request
from tracengine.engine.native import mypyc_attr
from tracengine.engine.sequence import Sequence
from tracengine.trace.header import make_header
from tracengine.workload.sessions import SessionRelease, has_sessions


# b"%d" % position, made once per position and shared by every runner: formatting a number is
# most of the cost of a synthetic token
_DECIMALS: list[bytes] = [b"%d" % i for i in range(1024)]


def _decimal(position: int) -> bytes:
    """b"%d" % position, growing _DECIMALS past position by an eighth of its size when it is short:
    geometric growth keeps a token's share of it constant, and a short run of one long prompt
    writes little past the positions it reaches."""
    if position < len(_DECIMALS):
        return _DECIMALS[position]
    _DECIMALS.extend(b"%d" % i for i in range(len(_DECIMALS), position + 1 + len(_DECIMALS) // 8))
    return _DECIMALS[position]


@mypyc_attr(allow_interpreted_subclasses=True)     # a test's runner subclasses it
class SyntheticRunner:
    """A stand-in model: each token is a hash of (seed, seq_id, position), so
    like the real model it does not depend on batching, chunking or preemption.
    `eos_at` maps a seq_id to the completion index at which it emits `eos`."""

    def __init__(self, vocab_size: int = 1000, seed: int = 0, eos: int = -1,
                 eos_at: dict[int, int] | None = None) -> None:
        self.vocab_size = vocab_size
        self.seed = seed
        self.eos = eos
        self.eos_at = eos_at or {}
        self._prefixes: dict[int, bytes] = {}   # seq_id -> b"{seed}:{seq_id}:", made once per sequence
        self._compiled = core_choice.COMPILED     # the compiled core hashes a token's key in machine words (_run_compiled)

    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[Any]:
        """A token for each of `seqs`: an int, or a verify step's list of them."""
        if self._compiled:
            compiled_tokens = self._run_compiled(seqs)
            if compiled_tokens is not None:
                return compiled_tokens
        # One loop for the batch, no call per sequence: a simulation samples every token here.
        eos, eos_at, vocab_size, prefixes, digest, decimals = self.eos, self.eos_at, self.vocab_size, \
            self._prefixes, xxhash.xxh64_intdigest, _DECIMALS
        tokens: list[Any] = []
        for seq in seqs:
            if seq.spec_token_ids:      # a verify step: the model's token at each of its positions
                tokens.append(self.targets(seq))
                continue
            position = seq.num_cached_tokens + seq.num_scheduled_tokens
            if eos_at and position == seq.num_tokens and eos_at.get(seq.seq_id) == seq.num_completion_tokens:
                tokens.append(eos)
                continue
            # the hash of f"{seed}:{seq_id}:{position}", its prefix and the position formatted once;
            # a new sequence or a position past _DECIMALS is the exception, not a test every token
            try:
                token = digest(prefixes[seq.seq_id] + decimals[position]) % vocab_size
            except (KeyError, IndexError):
                token = digest(self._prefix(seq.seq_id) + _decimal(position)) % vocab_size
            if token == eos:
                token = (token + 1) % vocab_size
            tokens.append(token)
        return tokens

    def _run_compiled(self, seqs: list[Sequence]) -> list[Any] | None:
        """run's tokens, the batch's hashed at once by the compiled block hasher
        (`synthetic_tokens`: the same hash of the same bytes, which it writes into machine
        words, no bytes made and no call per token); None where a number is out of its range."""
        seq_ids: list[int] = []
        positions: list[int] = []
        verifies = False
        for seq in seqs:
            seq_ids.append(seq.seq_id)
            positions.append(seq.num_cached_tokens + seq.num_scheduled_tokens)
            verifies = verifies or bool(seq.spec_token_ids)
        try:
            tokens: list[Any] = synthetic_tokens(self.seed, seq_ids, positions, self.vocab_size, self.eos)
        except OverflowError:      # a number no int64 holds, or no positive vocabulary: run samples the bytes
            return None
        eos_at = self.eos_at
        if not verifies and not eos_at:
            return tokens
        for i, seq in enumerate(seqs):      # a verify step's tokens, and eos where eos_at puts it, as in run
            if seq.spec_token_ids:
                tokens[i] = self.targets(seq)
            elif eos_at and positions[i] == seq.num_tokens and eos_at.get(seq.seq_id) == seq.num_completion_tokens:
                tokens[i] = self.eos
        return tokens

    def targets(self, seq: Sequence) -> list[int]:
        """The tokens of a sequence that verifies drafts, at positions num_tokens, num_tokens + 1,
        ...: those it would sample there without drafts, eos where `eos_at` puts it."""
        eos, vocab_size, digest, prefix = self.eos, self.vocab_size, xxhash.xxh64_intdigest, self._prefix(seq.seq_id)
        eos_index = self.eos_at.get(seq.seq_id, -1)
        tokens: list[int] = []
        for j in range(len(seq.spec_token_ids) + 1):
            if seq.num_completion_tokens + j == eos_index:
                tokens.append(eos)
                continue
            token = digest(prefix + _decimal(seq.num_tokens + j)) % vocab_size
            tokens.append((token + 1) % vocab_size if token == eos else token)
        return tokens

    def _prefix(self, seq_id: int) -> bytes:
        prefix = self._prefixes.get(seq_id)
        if prefix is None:
            prefix = self._prefixes[seq_id] = f"{self.seed}:{seq_id}:".encode()
        return prefix

    def exit(self) -> None:
        pass


def check_requests(scheduler: Any, requests: list[Request], under: str = "the config", first_index: int = 0) -> None:
    """Refuse, before a run and naming it, a request that could never run under the scheduler's config
    (a request without a seq_id is named by its index, the first `first_index`)."""
    for i, r in enumerate(requests, first_index):
        try:
            scheduler.check_request(len(r.prompt) + r.num_history_tokens, r.max_tokens)
        except RequestError as exc:
            arriving = (f"at {r.arrival_ns / 1e9:.3f} s" if r.arrival_ns >= 0 else
                        f"as turn {r.turn} of session {r.session_id!r}" if r.session_id else f"before step {r.arrival_step}")
            seq_id = i if r.seq_id is None else r.seq_id
            raise RequestError(f"request s{seq_id} (arriving {arriving}) can never run under {under}: {exc}") \
                from None


class Departures:
    """The requests whose clients leave, by when (`abort_step` or `abort_ns`): once `next_due`
    (the earliest, or infinity) has come, `abort(engine, now)` takes out, as the recording did,
    each one due by `now` that is still queued (one that finished first has nothing to take out)."""

    def __init__(self, requests: list[Request], when: str) -> None:
        self._due = sorted((getattr(r, when), i if r.seq_id is None else r.seq_id, r.abort_reason)
                           for i, r in enumerate(requests) if getattr(r, when) >= 0)
        self._next = 0
        self.next_due = self._due[0][0] if self._due else math.inf   # read every step: no call

    def due(self, now: int) -> list[tuple[int, str]]:
        """(seq_id, reason) of each request due by `now` and not named before, in the order of their times."""
        due = self._due
        leaving: list[tuple[int, str]] = []
        while self._next < len(due) and due[self._next][0] <= now:
            _, seq_id, reason = due[self._next]
            leaving.append((seq_id, reason))
            self._next += 1
        self.next_due = due[self._next][0] if self._next < len(due) else math.inf
        return leaving

    def abort(self, engine, now: int) -> list[int]:
        """The seq_ids of the requests taken out (a session ends with its aborted turn)."""
        return [seq_id for seq_id, reason in self.due(now) if engine.abort_request(seq_id, reason) is not None]


def run_workload(config: Config, requests: list[Request], runner: Any = None, sink: ListSink | None = None,
                 max_steps: int = 1_000_000, on_step: Any = None, policy: type | str | None = None) -> list[Any]:
    """Drive `LLMEngine` over a scripted workload; returns the events, header
    first. Each request enters before its arrival step; when the engine goes
    idle before the next arrival, that arrival is brought forward. `on_step(engine)`
    is called after every step (property tests check invariants there). `policy`: as LLMEngine's."""
    sink = sink if sink is not None else ListSink()
    runner = runner if runner is not None else SyntheticRunner(eos=config.eos, seed=config.seed)
    engine = LLMEngine(config, runner, sink, policy=policy)
    # a session's later turn arrives think_steps after the step its last dependency finished in
    sessions = SessionRelease(requests, "steps") if has_sessions(requests) else None
    take = sessions.pop if sessions is not None else in_arrival_order(requests, "arrival_step")
    departures = Departures(requests, "abort_step")
    clocked = StepClockedEngine(engine, departures.due if departures.next_due < math.inf else None,
                                records_sessions=sessions is not None, on_step=on_step)
    run_in_time(clocked, take, sessions, max_steps, arrival="arrival_step")
    return [make_header(engine.config), *sink.events]

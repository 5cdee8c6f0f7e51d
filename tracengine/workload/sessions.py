"""Sessions: multi-turn and agentic workloads whose next turn waits for the last (docs/workloads.md).

A session is turns 0, 1, ... sharing a `session_id`. Turn 0 is sent at its arrival; a later turn
depends on earlier turns of its session (`depends_on`: by default the one before) and is sent its
think time after the last of them finished. A turn read from a workload file holds its own input
only, and is sent after its session's history: the prompt and output of its latest dependency,
then the outputs of its other dependencies in turn order (what parallel branches brought back),
then its own input; so its prefix is its latest dependency's blocks. A turn re-run from a trace
has its whole prompt, as recorded.

`SessionRelease` is that rule, one definition for every driver: the simulated engine, the
step-exact what-if, a fleet and a real `generate` tell it each finish (`finished`) and each
abort (`ended`: its session ends, and its later turns are never sent), and add the turns it
releases when their time comes. Time is the driver's: ns (simulated, or the wall clock's) with
`think_ns`, or steps with `think_steps`."""
import heapq
import math
from dataclasses import replace

from tracengine.engine.request import Request

NOT_HELD = (0, None)      # a driver's (index, request) when no arrival is held


def has_sessions(requests) -> bool:
    """Whether any of `requests` (a list) is a turn of a session."""
    return any(r.session_id for r in requests)


def set_history_bounds(requests: list[Request]) -> None:
    """Each later turn read from a file (num_history_tokens > 0) gets the most history tokens it
    can be sent after: its latest dependency's whole prompt and max_tokens, and the others'
    max_tokens; so a run refuses, before it starts, a session whose history could outgrow the
    context. `requests` are in file order: a turn after those it depends on."""
    lengths: dict[tuple[str, int], tuple[int, int]] = {}    # (session, turn) -> (whole prompt, max_tokens)
    for r in requests:
        if not r.session_id:
            continue
        if r.num_history_tokens:
            latest = max(r.depends_on)
            r.num_history_tokens = sum(lengths[(r.session_id, d)][1] for d in r.depends_on) \
                + lengths[(r.session_id, latest)][0]
        lengths[(r.session_id, r.turn)] = (len(r.prompt) + r.num_history_tokens, r.max_tokens)


def history_prompt(request: Request, done: dict[int, list[int]], seq_ids: list[int]) -> list[int]:
    """The prompt a later turn is sent with: the latest dependency's tokens (prompt and output),
    then the other dependencies' outputs in turn order, then its own input. `done`: each finished
    dependency's tokens and number of prompt tokens, by seq_id; `seq_ids`: its dependencies' by turn."""
    by_turn = sorted(zip(request.depends_on, seq_ids))
    tokens, _ = done[by_turn[-1][1]]
    prompt = list(tokens)
    for _, seq_id in by_turn[:-1]:
        other, num_prompt_tokens = done[seq_id]
        prompt += other[num_prompt_tokens:]
    prompt += request.prompt
    return prompt


class SessionRelease:
    """Which turns are ready when, given finishes. Built from a run's requests (each numbered by
    its seq_id, or its index where it has none); every request that is not a later turn is ready
    at its arrival. `unit`: "ns" (arrival_ns, think_ns) or "steps" (arrival_step, think_steps).

    A single engine's driver holds the next arrival as (index, request) and takes the next with
    `pop`; after a step, `release(finished, now, held)` gives it the arrival to hold (a turn
    released now may come before the one it held). A fleet's clock takes `finished`'s released
    turns as arrivals of its own, and asks `is_dropped` when one comes due."""

    def __init__(self, requests: list[Request], unit: str = "ns"):
        self.arrival, self.think = ("arrival_ns", "think_ns") if unit == "ns" else ("arrival_step", "think_steps")
        self._ready: list[tuple[int, int, int, Request]] = []     # heap of (arrival, seq_id, index, request)
        self._waiting: dict[int, list] = {}      # seq_id -> [index, request, dependencies left, last finish]
        self._dependents: dict[int, list[int]] = {}    # seq_id -> the seq_ids of the turns waiting on it
        self._deps: dict[int, list[int]] = {}    # a composed turn's seq_id -> its dependencies' seq_ids
        self._done: dict[int, tuple[list[int], int]] = {}   # finished turns' tokens, kept for a composed turn
        self._needed: dict[int, int] = {}        # seq_id -> composed turns still to take its tokens
        self._session_of: dict[int, str] = {}
        self.ended_sessions: set[str] = set()
        self.num_unsent = 0                      # turns never sent: their session ended first
        turns: dict[tuple[str, int], int] = {}
        for index, r in enumerate(requests):
            seq_id = index if r.seq_id is None else r.seq_id
            if r.session_id:
                self._session_of[seq_id] = r.session_id
                turns[(r.session_id, r.turn)] = seq_id
            if not (r.session_id and r.depends_on):
                self._ready.append((getattr(r, self.arrival), seq_id, index, r))
                continue
            deps = [turns[(r.session_id, d)] for d in r.depends_on]
            self._waiting[seq_id] = [index, r, len(deps), -math.inf]
            for dep in deps:
                self._dependents.setdefault(dep, []).append(seq_id)
            if r.num_history_tokens:
                self._deps[seq_id] = deps
                for dep in deps:
                    self._needed[dep] = self._needed.get(dep, 0) + 1
        heapq.heapify(self._ready)

    @property
    def next_due(self) -> float:
        """The arrival of the next ready turn (inf: none ready)."""
        return self._ready[0][0] if self._ready else math.inf

    def pop(self) -> tuple[int, Request | None]:
        """The next ready turn as (index, request), earliest first (then by seq_id); NOT_HELD when none."""
        while self._ready:
            _, _, index, request = heapq.heappop(self._ready)
            if not self.is_dropped(request):
                return index, request
        return NOT_HELD

    def push(self, index: int, request: Request) -> None:
        seq_id = index if request.seq_id is None else request.seq_id
        heapq.heappush(self._ready, (getattr(request, self.arrival), seq_id, index, request))

    def is_dropped(self, request: Request) -> bool:
        """Whether a ready turn is never sent, its session having ended (counted once, when asked)."""
        if request.session_id and request.session_id in self.ended_sessions:
            self.num_unsent += 1
            return True
        return False

    def finished(self, seq, when: int) -> list[tuple[int, Request]]:
        """`seq` (an engine Sequence) finished at `when`: the turns it releases, each as (index,
        request) with its arrival set (its last dependency's finish plus its think time) and,
        read from a file, its prompt composed. A finish with an error ends the session instead."""
        seq_id = seq.seq_id
        if seq_id not in self._session_of:
            return []
        if seq.finish_reason == "error":
            self.ended(seq_id)
            return []
        if seq_id in self._needed:
            self._done[seq_id] = (seq.token_ids, seq.num_prompt_tokens)
        released = []
        for waiting_id in self._dependents.pop(seq_id, ()):
            waiting = self._waiting.get(waiting_id)
            if waiting is None:      # its session ended
                continue
            waiting[2] -= 1
            waiting[3] = max(waiting[3], when)
            if waiting[2]:
                continue
            index, request, _, last = self._waiting.pop(waiting_id)
            changes = {self.arrival: last + getattr(request, self.think)}
            if waiting_id in self._deps:
                deps = self._deps.pop(waiting_id)
                changes.update(prompt=history_prompt(request, self._done, deps), num_history_tokens=0)
                for dep in deps:
                    self._needed[dep] -= 1
                    if not self._needed[dep]:
                        del self._needed[dep], self._done[dep]
            released.append((index, replace(request, **changes)))
        return released

    def ended(self, seq_id: int) -> None:
        """`seq_id` was aborted: its session ends; the turns still waiting in it are never sent."""
        session = self._session_of.get(seq_id)
        if session is None or session in self.ended_sessions:
            return
        self.ended_sessions.add(session)
        for waiting_id in [w for w, (_, r, _, _) in self._waiting.items() if r.session_id == session]:
            del self._waiting[waiting_id]
            self._deps.pop(waiting_id, None)
            self.num_unsent += 1

    def release(self, seqs, when: int, held: tuple[int, Request | None]) -> tuple[int, Request | None]:
        """The turns `seqs` (finished at `when`) release become ready; the arrival a single engine's
        driver holds next: `held`, or a released turn that comes before it."""
        for seq in seqs:
            for index, request in self.finished(seq, when):
                self.push(index, request)
        index, request = held
        if request is None:
            return self.pop()
        seq_id = index if request.seq_id is None else request.seq_id
        if self._ready and self._ready[0][:2] < (getattr(request, self.arrival), seq_id):
            self.push(index, request)
            return self.pop()
        return held

    def end(self, seq_ids, held: tuple[int, Request | None]) -> tuple[int, Request | None]:
        """The sessions of `seq_ids` (aborted) end; the arrival to hold next (`held`, unless its session ended)."""
        for seq_id in seq_ids:
            self.ended(seq_id)
        return self.pop() if held[1] is not None and self.is_dropped(held[1]) else held


def session_fields(source) -> dict:
    """A Request's session keywords from `source` (a Request, or a RequestAdded): none outside a session."""
    if not source.session_id:
        return {}
    return {"session_id": source.session_id, "turn": source.turn, "depends_on": tuple(source.depends_on),
            "think_ns": source.think_ns}


def session_turn(request: Request):
    """What the engine records of a request's session (LLMEngine.add_request's `session`): None outside one."""
    if not request.session_id:
        return None
    return request.session_id, request.turn, list(request.depends_on), request.think_ns

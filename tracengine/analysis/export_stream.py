"""The Perfetto export, streamed: the trace is read frame by frame and each step's
engine events are written when its StepEnd comes; a request's events when it has
finished and the step after it has begun (its last span ends there). What is held
is the requests in flight, each with the start times of the steps it took part in:
memory bounded by a step and the live requests, not by the trace (BENCHMARKS.md).

The fold is timeline.py's (the same RequestRecord, the same time axis: a step starts
gap_ns after the previous one ended and lasts its StepEnd durations), kept only for
live requests; the idle part of a gap is timeline.idle_gaps' rule, step by step: no
request added before the step is still in flight."""
import os

import msgspec

from tracengine.analysis.export import (ENGINE_PID, REQUESTS_PID, STEPS_TID, _meta, request_events,
                                        step_events)
from tracengine.analysis.export import metadata as export_metadata
from tracengine.analysis.timeline import RequestRecord, StepRecord
from tracengine.errors import TraceError
from tracengine.trace.events import (DraftVerified, Preempt, RequestAdded, ScheduleDecision, SeqAbort, SeqFinish,
                                     SpecAccepted, SpecDecode, StepEnd, TokenSample, TraceHeader, prefill_flags)


class RequestClock:
    """What request_spans and request_events read of the time axis, for one request: the
    starts of the steps it took part in (and of the step after each), and the trace's end."""

    def __init__(self, starts: dict[int, int], num_steps: int, total_ns: int):
        self.starts, self.num_steps, self.total_ns = starts, num_steps, total_ns

    def start_ns(self, step: int) -> int:
        return self.starts[step] if step < self.num_steps else self.total_ns

    def arrival_ns(self, req: RequestRecord) -> int:
        return req.arrival_ns if req.arrival_ns >= 0 else self.start_ns(req.added_step)


class _Live:
    __slots__ = ("record", "starts")

    def __init__(self, record: RequestRecord):
        self.record = record
        self.starts: dict[int, int] = {}   # step -> its start ns, for the steps this request needs


class PerfettoStream:
    """Folds events as they come and hands trace-event dicts to `write` (a list of them
    at a time) as soon as they are final."""

    def __init__(self, write):
        self.write = write
        self.header: TraceHeader | None = None
        self.live: dict[int, _Live] = {}
        self.num_steps = 0
        self.num_events = 0
        self.num_requests = 0                # written
        self.end_ns = 0                      # the end of the last step
        self._decision: ScheduleDecision | None = None
        self._touched: list[_Live] = []      # took part in this step
        self._touched_before: list[_Live] = []   # took part in the step before
        self._added_now = 0                  # requests added before this step
        self._finished_now = 0               # requests that finished in it
        self._num_in_flight = 0              # added before this step, neither finished nor aborted
        self._first_arrival: int | None = None
        self._drafts = (0, 0)                # draft tokens verified in this step, and kept
        self._emit(_meta(ENGINE_PID, 0, "process", "engine", 0) + _meta(REQUESTS_PID, 0, "process", "requests", 1)
                   + _meta(ENGINE_PID, STEPS_TID, "thread", "steps", 0))

    def _emit(self, events: list[dict]) -> None:
        if events:
            self.num_events += len(events)
            self.write(events)

    def _get(self, seq_id: int, event) -> _Live:
        live = self.live.get(seq_id)
        if live is None:
            raise TraceError(f"{type(event).__name__} at step {event.step} names seq_id {seq_id}, "
                             f"which no RequestAdded introduced (or which has finished)")
        return live

    def _touch(self, live: _Live) -> None:
        if not self._touched or self._touched[-1] is not live:
            self._touched.append(live)

    def add(self, event) -> None:
        kind = type(event)
        if kind is TokenSample:
            if event.kept:
                self._get(event.seq_id, event).record.token_steps.append(event.step)
        elif kind is ScheduleDecision:
            self._decision = event
            phases = (["prefill" if f else "decode" for f in prefill_flags(event)] if event.phase == "mixed"
                      else [event.phase] * len(event.seqs))
            for s, phase in zip(event.seqs, phases):
                live = self._get(s.seq_id, event)
                live.record.scheduled.append((event.step, phase, s.num_tokens))
                self._touch(live)
        elif kind is StepEnd:
            self._step_ended(event)
        elif kind is DraftVerified and not event.padded:
            self._drafts = (self._drafts[0] + event.num_draft_tokens, self._drafts[1] + event.num_accepted_tokens)
        elif kind is SpecDecode:       # vLLM's scheduler: the drafts a step schedules, and those accepted
            self._drafts = (self._drafts[0] + sum(event.num_spec_tokens), self._drafts[1])
        elif kind is SpecAccepted:
            self._drafts = (self._drafts[0], self._drafts[1] + sum(event.num_accepted))
        elif kind is RequestAdded:
            num_prompt_tokens = len(event.prompt_token_ids)
            live = _Live(RequestRecord(event.seq_id, event.step, num_prompt_tokens, num_prompt_tokens,
                                       event.arrival_ns))
            self.live[event.seq_id] = live
            self._touch(live)
            self._added_now += 1
            if event.arrival_ns >= 0 and (self._first_arrival is None or event.arrival_ns < self._first_arrival):
                self._first_arrival = event.arrival_ns
        elif kind is Preempt:
            live = self._get(event.seq_id, event)
            live.record.preempts.append(event)
            self._touch(live)
        elif kind is SeqFinish:
            live = self._get(event.seq_id, event)
            live.record.finish_step, live.record.finish_reason = event.step, event.reason
            self._touch(live)
            self._finished_now += 1
        elif kind is SeqAbort:
            live = self._get(event.seq_id, event)
            live.record.abort = event
            if live.record.added_step < self.num_steps:
                self._num_in_flight -= 1
            else:
                self._added_now -= 1
        elif kind is TraceHeader:
            self.header = event

    def _step_ended(self, end: StepEnd) -> None:
        decision, self._decision = self._decision, None
        step = self.num_steps
        if decision is None or decision.step != end.step or end.step != step:
            raise TraceError(f"step {end.step} ends without its ScheduleDecision (expected step {step})")
        rec = StepRecord(decision, end, self._drafts)
        self._drafts = (0, 0)
        start = self.end_ns + end.gap_ns
        # idle before this step: no request added before it still in flight (timeline.idle_gaps)
        idle = None
        if self._num_in_flight == 0:
            idle_to = min(start, self._first_arrival if self._first_arrival is not None else start)
            if idle_to > self.end_ns:
                idle = (self.end_ns, idle_to)
        self._emit(step_events(rec, start, idle))
        for live in self._touched + self._touched_before:
            live.starts[step] = start
        self.end_ns = start + rec.duration_ns
        self.num_steps = step + 1
        for live in self._touched_before:     # finished in the step before: its last span ends at `start`
            if live.record.finish_step == step - 1 and live.record.seq_id in self.live:
                self._finish(live)
        self._touched_before, self._touched = self._touched, []
        self._num_in_flight += self._added_now - self._finished_now
        self._first_arrival, self._added_now, self._finished_now = None, 0, 0

    def _finish(self, live: _Live) -> None:
        del self.live[live.record.seq_id]
        self.num_requests += 1
        self._emit(request_events(RequestClock(live.starts, self.num_steps, self.end_ns), live.record))

    def close(self) -> None:
        """The requests still held (unfinished, aborted, finished in the last step), in arrival order."""
        for live in list(self.live.values()):
            self._finish(live)


def export_perfetto(events, out_path) -> dict:
    """Writes the Chrome trace-event JSON of `events` (a trace path, or an iterable of events)
    to `out_path`, streamed; returns the metadata and the numbers of trace events and requests
    written. A regular file is written beside OUT and renamed over it when whole; a device or a
    pipe (`--perfetto /dev/null`) is written in place."""
    target = os.fspath(out_path)
    # a device or a pipe (--perfetto /dev/null) is written in place, never replaced
    in_place = os.path.exists(target) and not os.path.isfile(target)
    temp = target if in_place else target + ".exporting.tmp"
    encode = msgspec.json.Encoder().encode
    reader = None
    try:
        with open(temp, "wb") as f:
            f.write(b'{"traceEvents":[')
            first = [True]

            def write(batch: list[dict]) -> None:
                data = b",".join(encode(e) for e in batch)
                f.write(data if first[0] else b"," + data)
                first[0] = False

            stream = PerfettoStream(write)
            torn_tail = None
            if isinstance(events, (str, os.PathLike)):
                from tracengine.trace.tracelog import TraceReader
                reader = TraceReader(events, max_frames=1)     # indexed a slice at a time, then forgotten
                for event in reader.events_once():
                    stream.add(event)
                if reader.torn_tail is not None:
                    torn_tail = (f"{reader.describe_torn_tail()}; figures cover steps 0..{stream.num_steps - 1}")
            else:
                for event in events:
                    stream.add(event)
            stream.close()
            metadata = export_metadata(stream.header, stream.num_steps, torn_tail)
            f.write(b'],"displayTimeUnit":"ms","metadata":' + encode(metadata) + b"}")
        if not in_place:
            os.replace(temp, target)
    except BaseException:
        if not in_place and os.path.exists(temp):
            os.remove(temp)
        raise
    finally:
        if reader is not None:
            reader.close()
    return {"metadata": metadata, "num_trace_events": stream.num_events, "num_requests": stream.num_requests}

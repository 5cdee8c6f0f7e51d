"""Checking a trace frame by frame (`tracengine check`): every event follows from the ones
before it, applied as the fold (fold.py) applies them."""
from tracengine.errors import TraceError
from tracengine.replay.fold import _projection_of
from tracengine.trace.events import (RequestAdded, ScheduleDecision, SpecAccepted, SpecDecode, StepEnd, TokenSample,
                                     TraceHeader)
from tracengine.trace.vllm_events import ConnectorPending, KVTransfersDone
from tracengine.trace.tracelog import ends_mid_step


class FrameCheck:
    """Checks, one frame at a time, that every event follows from the ones before it; it keeps
    state, not events. `frame(events)` raises TraceError naming the first event that does not
    follow. What follows is a backend's rules (`follows`); the frames' order and the steps'
    stamps are every trace's."""

    def __init__(self, header: TraceHeader):
        self.step = 0                   # the step in progress
        self.open_frame = False         # the last frame ended in the middle of a step (frames.ends_mid_step)
        self.version = header.format_version

    def frame(self, events) -> None:
        if self.open_frame:
            raise TraceError(f"step {self.step}: a frame follows one that ended without its step's StepEnd")
        if not events:
            raise TraceError(f"step {self.step}: a frame without events")
        for i, event in enumerate(events):
            reason = self._impossible(event, i == len(events) - 1)
            if reason is not None:
                raise TraceError(f"step {self.step}: event {i} of the frame, {type(event).__name__}, "
                                 f"does not follow: {reason}")
        self.open_frame = ends_mid_step(events, self.version)

    def _impossible(self, e, is_last: bool) -> str | None:
        if type(e) is TraceHeader:
            return "a TraceHeader after the first frame"
        if e.step != self.step:
            return f"it is stamped step {e.step}"
        return self.follows(e, is_last)

    def follows(self, e, is_last: bool) -> str | None:
        """Why `e` cannot follow the events before it under the backend's rules (None: it can)."""
        raise NotImplementedError


class EventCheck(FrameCheck):
    """tracengine's and vLLM's traces: every event applied as the fold applies it."""

    def __init__(self, header: TraceHeader):
        super().__init__(header)
        self.state = _projection_of(header)
        self.num_blocks = len(self.state.ref_counts)
        self.scheduled: set[int] = set()

    def follows(self, e, is_last: bool) -> str | None:
        t = type(e)
        seqs = self.state.seqs
        if t is RequestAdded:
            if e.seq_id in seqs:
                return f"seq {e.seq_id} was added before"
        elif t is ScheduleDecision:
            if self.state.decision is not None and self.state.decision.step == self.step:
                return "a second ScheduleDecision in one step"
            # decode takes running sequences; prefill waiting ones, and mixed (a policy) running ones too
            queues = (self.state.running,) if e.phase == "decode" else (self.state.waiting, self.state.running)
            missing = [ss.seq_id for ss in e.seqs if not any(ss.seq_id in q for q in queues)
                       and not self.state.scheduled_when_finished(ss.seq_id)]
            if missing:
                return f"seq {missing[0]} is not {'running' if e.phase == 'decode' else 'waiting or running'}"
            self.scheduled = {ss.seq_id for ss in e.seqs}
        elif t is SpecDecode or t is SpecAccepted:     # (SpecDecode comes before its step's decision)
            missing = [seq_id for seq_id in e.seq_ids if seq_id not in (seqs if t is SpecDecode else self.scheduled)]
            if missing:
                return f"seq {missing[0]} was {'never added' if t is SpecDecode else 'not scheduled in this step'}"
        elif t is KVTransfersDone:
            missing = [s for ids in (e.finished_sending, e.finished_recving, e.failed_recving) for s in ids
                       if s not in seqs]
            if missing:
                return f"seq {missing[0]} was never added"
        elif t is not StepEnd and t is not ConnectorPending and e.seq_id not in seqs:
            return f"seq {e.seq_id} was never added"
        elif t is TokenSample and e.seq_id not in self.scheduled:
            return f"seq {e.seq_id} was not scheduled in this step"
        for name in ("block_ids", "freed_block_ids"):
            bad = [b for b in getattr(e, name, ()) if not 0 <= b < self.num_blocks]
            if bad:
                return f"block {bad[0]} is outside the pool of {self.num_blocks}"
        block_id = getattr(e, "block_id", 0)
        if not 0 <= block_id < self.num_blocks:
            return f"block {block_id} is outside the pool of {self.num_blocks}"
        if t is StepEnd and not is_last:
            return "events of the step follow its StepEnd in the same frame"
        if t is not TokenSample:
            try:
                self.state.handlers[t](e)
            except (KeyError, IndexError, ValueError) as exc:
                return str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__} {exc}"
        if t is StepEnd:
            self.step += 1
            self.scheduled = set()
        return None

"""`tracengine check` on a trace of SGLang's scheduler, frame by frame: every event follows from
the ones before it as far as SGLang's own rules are not needed (no SGLang is imported). The
fold's block rules (replay/event_check.py) are tracengine's and vLLM's, not a radix cache's: a
token-pool slot here is shared by every request whose prefix matched it, and freed by the
pool (seq_id -1) when the radix tree evicts it, so slots are checked against the pool's size."""
from tracengine.replay.event_check import FrameCheck
from tracengine.trace.events import RequestAdded, ScheduleDecision, StepEnd, TokenSample, TraceHeader
from tracengine.trace.header import block_pool_config
from tracengine.trace.sglang_events import PolicyOrder


class SglangEventCheck(FrameCheck):
    def __init__(self, header: TraceHeader):
        super().__init__(header)
        self.num_slots = block_pool_config(header)[0]
        self.seq_ids: set[int] = set()
        self.scheduled: set[int] | None = None   # this step's, once decided

    def follows(self, e, is_last: bool) -> str | None:
        t = type(e)
        if t is RequestAdded:
            if e.seq_id in self.seq_ids:
                return f"seq {e.seq_id} was added before"
            self.seq_ids.add(e.seq_id)
        elif t is ScheduleDecision:
            if self.scheduled is not None:
                return "a second ScheduleDecision in one step"
            missing = [s.seq_id for s in e.seqs if s.seq_id not in self.seq_ids]
            if missing:
                return f"seq {missing[0]} was never added"
            self.scheduled = {s.seq_id for s in e.seqs}
        elif t is PolicyOrder:
            missing = [s for s in (*e.seq_ids, *e.deprioritized) if s not in self.seq_ids]
            if missing:
                return f"seq {missing[0]} was never added"
            if len(e.seq_ids) > e.num_waiting or len(e.num_matched_tokens) > len(e.seq_ids):
                return f"it orders {len(e.seq_ids)} of {e.num_waiting} waiting"
        elif t is TokenSample and e.seq_id not in (self.scheduled or ()):
            return f"seq {e.seq_id} was not scheduled in this step"
        elif t is not StepEnd and getattr(e, "seq_id", -1) not in self.seq_ids and e.seq_id != -1:
            return f"seq {e.seq_id} was never added"
        slots = list(getattr(e, "block_ids", ())) + list(getattr(e, "freed_block_ids", ()))
        slots += [e.block_id] if hasattr(e, "block_id") else []
        bad = [b for b in slots if not 0 <= b < self.num_slots]
        if bad:
            return f"slot {bad[0]} is outside the token pool of {self.num_slots}"
        if t is StepEnd:
            if not is_last:
                return "events of the step follow its StepEnd in the same frame"
            self.step += 1
            self.scheduled = None
        return None

"""The steps' sums that `stats` reads (analysis/stats.py), folded as each step ends: a run folded live
(RequestTimeline, lean) keeps these, not its steps. Compiled with the timeline (tracengine/compiled.py)."""
from tracengine.errors import TraceError
from tracengine.trace.events import ScheduledSeq, ScheduleDecision, StepEnd


class StepFigures:
    """What `stats` reads of the steps, folded as each ends: a run folded live keeps these sums,
    not its steps. Phases are a decision's ("prefill", "decode", "mixed"); `kind_tokens` splits
    a mixed step's tokens by sequence; a blocked step is one whose waiting head did not fit.
    Each sum a typed attribute, not a dict by phase: compiled, a machine int that `add` updates per step."""

    def __init__(self) -> None:
        self.prefill_tokens = self.decode_tokens = self.mixed_tokens = 0       # by the step's phase
        self.prefill_ns = self.decode_ns = self.mixed_ns = 0
        self.num_prefill_steps = self.num_decode_steps = self.num_mixed_steps = 0
        self.kind_prefill_tokens = self.kind_decode_tokens = 0                  # by the sequence's kind
        self.num_blocked_prefill_steps = self.num_blocked_decode_steps = 0
        self.blocked_seq_ids: set[int] = set()
        self.busy_ns = 0                       # the steps' durations, summed
        self.min_free = 0                      # the fewest free blocks a step left
        self.min_free_at = -1                  # the first step that left that few; -1: no step yet
        self.utilization_sum = 0.0             # of 1 - free / blocks over the steps, in step order

    def add(self, d: ScheduleDecision, end: StepEnd, duration_ns: int, num_kvcache_blocks: int | None) -> None:
        # Runs per step: a field read every step is read once, into a local (compiled, each read of an
        # event's field is a generic attribute lookup); a decode step reads no sequence.
        phase: str = d.phase
        num_batched_tokens: int = d.num_batched_tokens
        if phase == "decode":
            self.decode_tokens += num_batched_tokens
            self.decode_ns += duration_ns
            self.num_decode_steps += 1
            self.kind_decode_tokens += num_batched_tokens
            blocked_seq_id: int = d.blocked_seq_id
            if blocked_seq_id != -1:
                self.num_blocked_decode_steps += 1     # the waiting head did not fit, so the step decoded instead
                self.blocked_seq_ids.add(blocked_seq_id)
        else:
            if phase == "prefill":
                self.prefill_tokens += num_batched_tokens
                self.prefill_ns += duration_ns
                self.num_prefill_steps += 1
                self.kind_prefill_tokens += num_batched_tokens
            elif phase == "mixed":      # its leading num_decode_seqs decode, the rest prefill
                self.mixed_tokens += num_batched_tokens
                self.mixed_ns += duration_ns
                self.num_mixed_steps += 1
                seqs: list[ScheduledSeq] = d.seqs
                num_decode_seqs: int = d.num_decode_seqs
                for i in range(len(seqs)):
                    num_tokens: int = seqs[i].num_tokens
                    if i < num_decode_seqs:
                        self.kind_decode_tokens += num_tokens
                    else:
                        self.kind_prefill_tokens += num_tokens
            else:
                raise TraceError(f"step {end.step}: ScheduleDecision of unknown phase {phase!r}")
            if d.stop_reason == "no_free_blocks":
                self.num_blocked_prefill_steps += 1
                self.blocked_seq_ids.add(d.blocked_seq_id)
        self.busy_ns += duration_ns
        free: int = end.num_free_blocks
        if self.min_free_at < 0 or free < self.min_free:
            self.min_free, self.min_free_at = free, end.step
        if num_kvcache_blocks:
            self.utilization_sum += 1 - free / num_kvcache_blocks


class GapCounts:
    """Inter-token gaps counted by size, in steps (`steps`) and in ns (`ns`), each size -> how many.
    The gaps of consecutive steps are mostly of one size (a step each, of one duration): the latest
    size and its count are kept as ints (compiled, machine ints) and go into the dicts when another
    size comes, or when they are read (`counted`)."""

    def __init__(self, steps: dict[int, int] | None = None, ns: dict[int, int] | None = None) -> None:
        self.steps: dict[int, int] = steps if steps is not None else {}
        self.ns: dict[int, int] = ns if ns is not None else {}
        self.last_steps = 0       # the latest size, not yet in the dicts: `count` of them
        self.last_ns = 0
        self.count = 0

    def add(self, gap_steps: int, gap_ns: int, count: int) -> None:
        if gap_steps != self.last_steps or gap_ns != self.last_ns:
            self.flush()
            self.last_steps, self.last_ns = gap_steps, gap_ns
        self.count += count

    def flush(self) -> None:
        if self.count:
            self.steps[self.last_steps] = self.steps.get(self.last_steps, 0) + self.count
            self.ns[self.last_ns] = self.ns.get(self.last_ns, 0) + self.count
            self.count = 0

    def counted(self) -> tuple[dict[int, int], dict[int, int]]:
        """(steps, ns), every gap counted in."""
        self.flush()
        return self.steps, self.ns

    def copy(self) -> "GapCounts":
        steps, ns = self.counted()
        return GapCounts(dict(steps), dict(ns))

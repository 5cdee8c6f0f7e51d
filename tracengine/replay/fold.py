"""Event sourcing: the scheduler and block-manager state at any step, from the events alone.

`Fold` applies each event to a mutable projection of what the scheduler and the block manager
did (queues, block tables, and the engine's own block pool and prefix cache), and keeps a
keyframe every `keyframe_interval` steps. `state_at(step)` starts from the nearest keyframe
at or before the step and applies at most `keyframe_interval` steps of events. The states
it returns are values: nothing changes them after they are returned."""


from tracengine.errors import TraceError
from tracengine.trace.events import StepEnd, TokenSample, TraceHeader
from tracengine.trace.header import block_pool_config
from tracengine.replay.state import BlockState, FoldState, SeqState, live_state
from tracengine.replay.projection import Keyframe, Projection
from tracengine.replay.block_rules_fold import projection    # vLLM's block rules, or nano-vllm's
from tracengine.trace.tracelog import TraceReader, check_header

__all__ = ["Fold", "FoldState", "SeqState", "BlockState", "live_state"]

# A larger block pool is no trace this tracengine wrote: refused before a state that size is built.
MAX_FOLD_BLOCKS = 1 << 22


class Fold:
    """fold = Fold(events) (TraceHeader first); fold.append(more) as a trace grows;
    fold.state_at(step) is the state after `step` (-1: before the first step)."""

    def __init__(self, events=(), keyframe_interval: int = 256):
        if keyframe_interval <= 0:
            raise ValueError("keyframe_interval must be positive")
        self.keyframe_interval = keyframe_interval
        self.header: TraceHeader | None = None
        self.num_steps = 0                     # completed steps
        self._steps: list[list] = [[]]         # events per step; the last is the step in progress
        self._decisions: list = []
        self._keyframes: list[Keyframe] = []
        self._live: Projection | None = None
        self.append(events)

    @classmethod
    def from_trace(cls, path, keyframe_interval: int = 256) -> "Fold":
        """Every complete step of the trace at `path` (a torn tail is left out)."""
        with TraceReader(path) as reader:
            return cls(reader.events(), keyframe_interval)

    @property
    def block_size(self) -> int:
        return self._live.block_size

    @property
    def num_blocks(self) -> int:
        return len(self._live.ref_counts)

    def append(self, events):
        it = iter(events)
        if self.header is None:
            first = next(it, None)
            if first is None:
                return
            self._start(first)
        live, current, K = self._live, self._steps[-1], self.keyframe_interval
        handlers = live.handlers
        for event in it:
            t = type(event)
            if t is not TokenSample:      # applied with the step's ScheduleDecision
                try:
                    handlers[t](event)
                except (KeyError, IndexError, ValueError) as exc:
                    raise TraceError(f"step {self.num_steps}: {t.__name__} does not follow from the events "
                                     f"before it ({exc!r}): {event}") from None
                if t is StepEnd:
                    if event.step != self.num_steps:
                        raise TraceError(f"StepEnd of step {event.step} where step {self.num_steps} was expected")
                    current.append(event)
                    self._decisions.append(live.decision)
                    self.num_steps += 1
                    current = []
                    self._steps.append(current)
                    if self.num_steps % K == 0:
                        self._keyframes.append(live.keyframe(self.num_steps - 1))
                    continue
            current.append(event)

    def _start(self, header):
        self._live = _projection_of(header)
        self.header = header
        self._keyframes.append(self._live.keyframe(-1))

    def events_at(self, step: int) -> list:
        """That step's events (the step in progress too, as far as it has arrived)."""
        if not 0 <= step < len(self._steps):
            raise IndexError(f"step {step} is not in the trace (0..{self.num_steps - 1})")
        return list(self._steps[step])

    def state_at(self, step: int | None = None, *, before_step: int | None = None) -> FoldState:
        """The state after `step` completed; `before_step=n` is the state after n - 1."""
        if before_step is not None:
            step = before_step - 1
        if step is None or not -1 <= step < self.num_steps:
            raise IndexError(f"step {step} is not in the trace (-1..{self.num_steps - 1})")
        if self.header is None:
            raise IndexError("the trace has no header yet")
        kf = self._keyframes[(step + 1) // self.keyframe_interval]
        p = type(self._live).from_keyframe(kf, self.block_size)
        handlers = p.handlers
        for s in range(kf.step + 1, step + 1):
            for event in self._steps[s]:
                handlers[type(event)](event)
        return p.state(step, self._decisions[step] if step >= 0 else None)


def _projection_of(header) -> Projection:
    """The empty state of the block pool the header describes, under the block rules it was recorded with
    (vLLM's, for its scheduler's trace; a disaggregated fleet's replica takes in KV transfers)."""
    num_blocks, _, block_size = block_pool_config(check_header(header))
    if not (type(num_blocks) is int and 0 < num_blocks <= MAX_FOLD_BLOCKS and type(block_size) is int
            and block_size > 0):
        raise TraceError(f"the trace header has no plausible block pool: num_kvcache_blocks={num_blocks!r} "
                         f"(at most {MAX_FOLD_BLOCKS}), kvcache_block_size={block_size!r}")
    return projection(header, num_blocks, block_size)

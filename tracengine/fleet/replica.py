"""One replica of a fleet (fleet/engine.py): its engine on the clock, and the figures a router
reads. In the compiled core (tracengine/compiled.py), a native subclass of the clocked engine:
the clock's calls into it are native calls, as into the one engine a simulation runs."""
from typing import Any

from tracengine.sim.clock import ClockedEngine, Stepped
from tracengine.trace.events import ReplicaScope


class Replica(ClockedEngine):
    """One replica: its engine on the clock (sim/clock.py: the requests routed to it, which
    enter before its next step, and when that step starts), and the figures a router reads."""

    def __init__(self, index: int, role: str, engine: Any, step_time: Any, first_step_ns: int = 0,
                 leaving: Any = None, scoped: bool = True) -> None:
        super().__init__(engine, step_time, first_step_ns, leaving, records_sessions=role != "decode")
        self.index = index
        self.role = role                   # "all", "prefill" or "decode"
        self.scoped = scoped               # a fleet of several: its steps' events follow a ReplicaScope

    def run_step(self, aborts: Any = None) -> Stepped:
        """ClockedEngine's, its events (the requests entering first) after a ReplicaScope, so the
        step's frame says whose it is."""
        sink = self.engine.sink
        if self.scoped and sink.enabled:
            sink.emit(ReplicaScope(self.engine.num_steps, self.index))
        return super().run_step(aborts)

    @property
    def num_requests(self) -> int:
        """Outstanding requests: waiting, running, and routed here but not yet entered."""
        s = self.engine.scheduler
        return len(s.waiting) + len(s.running) + len(self.queued)

    @property
    def num_prefill_tokens(self) -> int:
        """Prompt tokens still to compute here: waiting sequences', and queued requests' (a decode
        replica's come with their prompt's KV)."""
        queued = 0 if self.role == "decode" else sum(len(r.prompt) for _, r in self.queued)
        waiting: int = sum(seq.num_tokens - seq.num_cached_tokens for seq in self.engine.scheduler.waiting)
        return waiting + queued

    @property
    def num_active_blocks(self) -> int:
        bm = self.engine.scheduler.block_manager
        active: int = bm.num_blocks - bm.num_free_blocks
        return active

    def num_cached_blocks(self, hashes: list[int]) -> int:
        """How many of `hashes` (a prompt's leading full blocks) the prefix cache holds, up to the first miss."""
        return len(self.engine.scheduler.block_manager.prefix_cache.lookup(hashes))

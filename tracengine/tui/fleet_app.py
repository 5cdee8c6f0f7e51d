"""`tracengine tui fleet.trace`: a fleet trace (fleet/engine.py), one replica at a time.

Each replica's events are written out as a trace of their own (a temporary directory, gone
when the TUI exits), and the replica's view is the one-engine app (app.py) with four keys
more: `r` and `R` switch to the next and previous replica, at the step running at the same
moment of the fleet's clock, keeping the selected request; `F` shows the fleet's figures
(`tracengine stats` of a fleet); `w` the router's decisions and the KV transfer of the
selected request (each candidate's score: why it went where it went)."""
import bisect
import os
import tempfile

from textual.binding import Binding

from tracengine.fleet.stats import (fleet_stats, fold_fleet, num_replicas, render_fleet, replica_headers,
                                      replica_streams)
from tracengine.tui.app import TraceApp
from tracengine.tui.screens import TextScreen
from tracengine.tui.trace_index import TraceIndex


class FleetView:
    """A fleet trace, read once: each replica's events as a trace file of its own, the fleet's
    figures, and the routing decisions and transfers by request."""

    def __init__(self, path):
        from tracengine.trace.tracelog import TraceReader, TraceWriter
        with TraceReader(path) as reader:
            events = list(reader.events())
        self.name = os.path.basename(os.fspath(path))
        self.header = events[0]
        self.num_replicas = num_replicas(self.header)
        folded = fold_fleet(events)
        self.stats = fleet_stats(folded)
        self.roles = [p["role"] for p in self.stats["replicas"]]
        self.starts = [[t.start_ns(s) for s in range(t.num_steps)] for _, t in sorted(folded.timelines.items())]
        # each replica's config fields of its own (a pool's or its own, fleet/overrides.py)
        self.own_config = [{k: v for k, v in h.config.items() if self.header.config.get(k) != v}
                           for h in replica_headers(self.header)]
        self.routes: dict[int, list] = {}
        for e in folded.routes + folded.transfers:
            self.routes.setdefault(e.seq_id, []).append(e)
        self._dir = tempfile.TemporaryDirectory(prefix="tracengine-fleet-")
        _, streams = replica_streams(events, transfers=True)     # a decode replica's blocks view takes them in
        self.paths = []
        for r in range(self.num_replicas):
            replica_path = os.path.join(self._dir.name, f"replica-{r}.trace")
            stream = streams.get(r) or [replica_headers(self.header)[r]]
            with TraceWriter(replica_path, stream[0], deflate=False) as writer:     # the replica's own config
                for e in stream[1:]:
                    writer.emit(e)
            self.paths.append(replica_path)

    def index(self, replica: int) -> TraceIndex:
        index = TraceIndex(self.paths[replica])
        index.name = f"{self.name} [replica {replica}]"
        while index.index_more():    # a replica's file is whole: read it all before showing it
            pass
        return index

    def step_at(self, replica: int, time_ns: int) -> int:
        """The replica's step running at `time_ns` (its last one started by then)."""
        starts = self.starts[replica]
        return max(0, bisect.bisect_right(starts, time_ns) - 1) if starts else 0

    def decisions(self, seq_id: int) -> list[str]:
        lines = []
        for e in self.routes.get(seq_id, []):
            if type(e).__name__ == "RouteDecision":
                scores = ", ".join(f"r{c} {s:g}" for c, s in zip(e.candidates, e.scores))
                lines.append(f"{e.pool} pool at {e.arrival_ns / 1e6:,.3f} ms: to replica {e.replica} "
                             f"(scores, lower wins: {scores})")
            else:
                lines.append(f"KV transfer from replica {e.src_replica} to {e.replica}: {e.num_tokens:,} tokens, "
                             f"{e.num_bytes:,} bytes, {e.duration_ns / 1e6:,.3f} ms, {e.num_blocks} blocks cached")
        return lines

    def close(self):
        self._dir.cleanup()


class FleetTraceApp(TraceApp):
    BINDINGS = TraceApp.BINDINGS + [
        Binding("r", "replica(1)", "Next replica"),
        Binding("R", "replica(-1)", "Previous replica", show=False),
        Binding("F", "fleet", "Fleet figures"),
        Binding("w", "routes", "Router's decisions for the selected request", show=False),
    ]
    MAIN_ONLY = TraceApp.MAIN_ONLY | {"replica", "fleet", "routes"}

    def __init__(self, index: TraceIndex, fleet: FleetView, replica: int, step: int = 0, seq_id: int = -1):
        super().__init__(index)
        self.fleet = fleet
        self.replica = replica
        self.switch_to: tuple[int, int, int] | None = None    # (replica, step, selected seq) to show next
        own = "".join(f", {k}={v}" for k, v in fleet.own_config[replica].items())
        self.replica_note = (f"replica {replica} of {fleet.num_replicas} ({fleet.roles[replica]}{own}); "
                             f"r: next replica, F: fleet, w: routing")
        self.set_reactive(TraceApp.note, self.replica_note)
        if index.num_steps:
            step = max(0, min(step, index.num_steps - 1))
            self.set_reactive(TraceApp.step, step)
            self.set_reactive(TraceApp.view, index.view_at(step))
        self.set_reactive(TraceApp.selected_seq_id, seq_id)

    def on_trace_app_indexed(self, message: TraceApp.Indexed) -> None:
        message.prevent_default()       # the one-engine handler, then the replica named again
        super().on_trace_app_indexed(message)
        if not self.note:
            self.note = self.replica_note

    def action_replica(self, delta: int) -> None:
        other = (self.replica + delta) % self.fleet.num_replicas
        starts = self.fleet.starts[self.replica]
        time_ns = starts[self.step] if self.step < len(starts) else 0
        self.switch_to = (other, self.fleet.step_at(other, time_ns), self.selected_seq_id)
        self.exit()

    def action_fleet(self) -> None:
        self.push_screen(TextScreen(render_fleet(self.fleet.stats), f"{self.fleet.name}: the fleet"))

    def action_routes(self) -> None:
        seq_id = self.selected_seq_id
        if seq_id < 0:
            self.notify("select a request first (s, or click one)")
            return
        lines = self.fleet.decisions(seq_id) or ["no routing decision names it"]
        self.push_screen(TextScreen("\n".join(lines), f"s{seq_id}: the router's decisions"))


def run_fleet_tui(path) -> int:
    """The TUI of a fleet trace: one app per replica shown, until one quits without switching."""
    fleet = FleetView(path)
    try:
        replica, step, seq_id = 0, 0, -1
        while True:
            index = fleet.index(replica)
            try:
                app = FleetTraceApp(index, fleet, replica, step, seq_id)
                app.run()
            finally:
                index.close()
            if app.return_code or app.switch_to is None:
                return app.return_code or 0
            replica, step, seq_id = app.switch_to
    finally:
        fleet.close()

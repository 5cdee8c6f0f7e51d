"""The TUI paints its first screen of a long trace before the index is complete (issue 34,
item 12): the app opens on the first slice of frames and a thread worker indexes the rest,
the screen filling in as it goes (BENCHMARKS.md has the time to first paint of a 130 MB trace)."""
import threading

from test_export import steady_trace
from tracengine.tui.app import TraceApp
from tracengine.tui.trace_index import TraceIndex

NUM_STEPS = 3000


class GatedIndex(TraceIndex):
    """The worker's reading waits for the test to open the gate."""

    def __init__(self, path, gate: threading.Event):
        self.gate = gate
        super().__init__(path)

    def index_more(self, max_frames: int = 2000) -> int:
        self.gate.wait()
        return super().index_more(max_frames)


async def test_the_first_screen_is_up_before_the_index_is_complete(tmp_path):
    trace = tmp_path / "long.trace"
    steady_trace(trace, NUM_STEPS)
    gate = threading.Event()
    index = GatedIndex(trace, gate)
    app = TraceApp(index)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            # on screen: step 0, from the first slice of frames alone
            assert app.view is not None and app.view.step == 0
            assert 0 < app.num_steps < NUM_STEPS and not app.indexed_all
            assert "long.trace" in app.query_one("#header").render().plain
            gate.set()
            for _ in range(600):
                if app.indexed_all:
                    break
                await pilot.pause(0.05)
            assert app.indexed_all and app.num_steps == NUM_STEPS
            await pilot.press("end")
            assert app.step == NUM_STEPS - 1
    finally:
        gate.set()
        index.close()

"""The TUI on a large trace: time from opening the file to the first screen (headless, Textual's
pilot at 120x40), the steps indexed by then, and the time the background worker takes to index
the whole trace.

    python benchmarks/bench_tui_first_paint.py TRACE"""
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tracengine.cli.tui import open_index  # noqa: E402
from tracengine.tui.app import TraceApp  # noqa: E402


async def measure(path: str) -> None:
    start = time.perf_counter()
    index = open_index(path, False)
    opened = time.perf_counter()
    app = TraceApp(index)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            painted = time.perf_counter()
            steps_then = index.num_steps
            while not app.indexed_all:
                await pilot.pause(0.2)
            indexed = time.perf_counter()
    finally:
        index.close()
    print(f"{os.path.basename(path)} ({os.path.getsize(path) / 1e6:,.1f} MB): index opened {opened - start:.3f} s, "
          f"first screen {painted - start:.3f} s ({steps_then} steps indexed then), whole index "
          f"{indexed - start:.1f} s ({index.num_steps:,} steps)")


if __name__ == "__main__":
    asyncio.run(measure(sys.argv[1]))

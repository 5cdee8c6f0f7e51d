"""The TUI on a 100,000-step trace: time to open, to show a step, to seek.

    python benchmarks/bench_tui.py [--steps 100000] [--trace PATH]

Records a synthetic trace (SyntheticRunner, no model) unless --trace names
one, then drives the app headless with Textual's pilot at 120x40:

- open: from reading the file to the first step on screen (the rest of the
  trace is indexed by a background worker meanwhile), and the time the
  worker takes to index all of it;
- step: one step forward (fold from the nearest keyframe, every panel
  redrawn), while indexing runs and after it is done;
- seek: a jump to a random step far away.

Each figure is printed beside its goal and their ratio (below 1 meets it)."""
import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tracengine.config import Config  # noqa: E402
from tracengine.llm_engine import LLMEngine  # noqa: E402
from tracengine.replay.scripted import SyntheticRunner  # noqa: E402
from tracengine.sampling_params import SamplingParams  # noqa: E402
from tracengine.tracelog import TraceWriter, make_header  # noqa: E402
from tracengine.tui.app import TraceApp  # noqa: E402
from tracengine.tui.trace_index import TraceIndex  # noqa: E402

OPEN_GOAL_S, STEP_GOAL_MS = 1.0, 50.0


def record(path: str, num_steps: int) -> None:
    """A busy server: ~20 requests in flight, prompts 32-300 tokens, outputs
    50-400, 256 blocks of 16, so prefill chunks, blocking and preemption recur."""
    config = Config(num_kvcache_blocks=256, kvcache_block_size=16, max_num_batched_tokens=512, max_num_seqs=16,
                    max_model_len=4096, eos=999)
    rng = random.Random(0)
    with TraceWriter(path, make_header(config)) as writer:
        engine = LLMEngine(config, SyntheticRunner(eos=999), writer)
        while engine.num_steps < num_steps:
            while len(engine.scheduler.waiting) + len(engine.scheduler.running) < 20:
                prompt = [rng.randrange(1000) for _ in range(rng.randint(32, 300))]
                engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=rng.randint(50, 400),
                                                          ignore_eos=True))
            engine.step()


async def shown(pilot, app, step: int) -> float:
    """Seconds from moving the cursor to the panels having drawn that step:
    what `Pilot.pause()` does, without its wait for the process to go idle,
    which a busy indexing thread would stretch to its one-second limit."""
    t = time.perf_counter()
    app.go(step)
    await pilot._wait_for_screen()      # every message the move caused is handled
    app.screen._on_timer_update()       # the dirty regions are rendered to the (headless) terminal
    return time.perf_counter() - t


class TimedApp(TraceApp):
    """Notes when the first frame is on screen (Textual's Ready event)."""
    CSS_PATH = os.path.join(os.path.dirname(sys.modules[TraceApp.__module__].__file__), TraceApp.CSS_PATH)
    ready_at = None

    def on_ready(self) -> None:
        self.ready_at = time.perf_counter()
        super().on_ready()


async def measure(path: str) -> dict:
    results = {}
    t = time.perf_counter()
    index = TraceIndex(path)
    app = TimedApp(index)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        results["open_s"] = app.ready_at - t
        results["open_steps"] = index.num_steps
        step_times = []
        while any(w.is_running for w in app.workers):
            if app.step + 1 < app.num_steps:
                step_times.append(await shown(pilot, app, app.step + 1))
            else:
                await pilot.pause(0.05)
            if len(step_times) >= 200:
                break
        results["step_while_indexing_ms"] = 1000 * statistics.median(step_times) if step_times else float("nan")
        await app.workers.wait_for_complete()
        results["index_s"] = time.perf_counter() - t
        await pilot.pause()
        results["steps"] = app.num_steps
        rng = random.Random(1)
        results["step_ms"] = 1000 * statistics.median([await shown(pilot, app, app.step + 1) for _ in range(100)])
        seeks = [await shown(pilot, app, rng.randrange(app.num_steps)) for _ in range(100)]
        results["seek_ms"] = 1000 * statistics.median(seeks)
        results["seek_max_ms"] = 1000 * max(seeks)
        views = []
        for _ in range(100):
            step = rng.randrange(app.num_steps)
            t0 = time.perf_counter()
            index.view_at(step)
            views.append(time.perf_counter() - t0)
        results["view_ms"] = 1000 * statistics.median(views)
    index.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--trace", help="an existing trace instead of a recorded one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.trace
        if path is None:
            path = os.path.join(tmp, "bench.trace")
            t = time.perf_counter()
            record(path, args.steps)
            print(f"recorded {args.steps:,} steps, {os.path.getsize(path) / 1e6:.1f} MB, "
                  f"in {time.perf_counter() - t:.1f} s")
        r = asyncio.run(measure(path))
    print(f"trace: {r['steps']:,} steps")
    print(f"{'':34}{'measured':>12}{'goal':>10}{'ratio':>8}")
    rows = [
        ("open (first step on screen)", r["open_s"] * 1000, OPEN_GOAL_S * 1000),
        ("show next step, while indexing", r["step_while_indexing_ms"], STEP_GOAL_MS),
        ("show next step, indexed", r["step_ms"], STEP_GOAL_MS),
        ("seek to a random step (median)", r["seek_ms"], STEP_GOAL_MS),
        ("seek to a random step (worst)", r["seek_max_ms"], STEP_GOAL_MS),
        ("fold + explain a step (no drawing)", r["view_ms"], STEP_GOAL_MS),
    ]
    for name, value, goal in rows:
        print(f"{name:34}{value:>9.1f} ms{goal:>7.0f} ms{value / goal:>8.2f}")
    print(f"{'background index of the whole trace':34}{r['index_s']:>10.1f} s")


if __name__ == "__main__":
    main()

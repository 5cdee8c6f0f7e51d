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

from tracengine.engine.config import Config  # noqa: E402
from tracengine.engine.llm_engine import LLMEngine  # noqa: E402
from tracengine.sim.runners import SyntheticRunner  # noqa: E402
from tracengine.engine.sampling_params import SamplingParams  # noqa: E402
from tracengine.trace.tracelog import TraceWriter, make_header  # noqa: E402
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


async def shown(pilot, app, step: int) -> tuple[float, float]:
    """(wall, UI-thread CPU) seconds from moving the cursor to the panels having
    drawn that step: what `Pilot.pause()` does, without its wait for the process
    to go idle, which a busy indexing thread would stretch to its one-second limit.
    The CPU time is the UI thread's own, so other processes on a shared machine
    inflate it less than the wall time."""
    t, c = time.perf_counter(), time.thread_time()
    app.go(step)
    await pilot._wait_for_screen()      # every message the move caused is handled
    app.screen._on_timer_update()       # the dirty regions are rendered to the (headless) terminal
    return time.perf_counter() - t, time.thread_time() - c


def medians(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return tuple(1000 * statistics.median(column) for column in zip(*samples))


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
        while any(w.is_running for w in app.workers) and len(step_times) < 200:
            if app.step + 1 < app.num_steps:
                step_times.append(await shown(pilot, app, app.step + 1))
            else:
                await pilot.pause(0.05)
        results["step_while_indexing"] = medians(step_times) if step_times else (float("nan"),) * 2
        await app.workers.wait_for_complete()
        results["index_s"] = time.perf_counter() - t
        await pilot.pause()
        results["steps"] = app.num_steps
        rng = random.Random(1)
        results["step"] = medians([await shown(pilot, app, app.step + 1) for _ in range(100)])
        seeks = [await shown(pilot, app, rng.randrange(app.num_steps)) for _ in range(100)]
        results["seek"] = medians(seeks)
        results["seek_worst"] = tuple(1000 * max(column) for column in zip(*seeks))
        views = []
        for _ in range(100):
            step = rng.randrange(app.num_steps)
            t0 = time.perf_counter()
            index.view_at(step)
            views.append((time.perf_counter() - t0, 0.0))
        results["view"] = medians(views)
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
    print(f"{'':36}{'wall':>10}{'UI CPU':>10}{'goal':>9}{'wall/goal':>11}")
    print(f"{'open (first step on screen)':36}{r['open_s'] * 1000:>7.1f} ms{'':>10}{OPEN_GOAL_S * 1000:>6.0f} ms"
          f"{r['open_s'] / OPEN_GOAL_S:>11.2f}")
    rows = [
        ("show next step, while indexing", r["step_while_indexing"]),
        ("show next step, indexed", r["step"]),
        ("seek to a random step (median)", r["seek"]),
        ("seek to a random step (worst)", r["seek_worst"]),
    ]
    for name, (wall, cpu) in rows:
        print(f"{name:36}{wall:>7.1f} ms{cpu:>7.1f} ms{STEP_GOAL_MS:>6.0f} ms{wall / STEP_GOAL_MS:>11.2f}")
    print(f"{'fold + explain a step (no drawing)':36}{r['view'][0]:>7.1f} ms")
    print(f"{'background index of the whole trace':36}{r['index_s']:>8.1f} s")


if __name__ == "__main__":
    main()

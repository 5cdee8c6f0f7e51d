"""Recording overhead: the same workload through the real engine (the embedded
tiny Qwen3 on the CPU) with and without `record=`, side by side in one run.
Repetitions alternate (plain, recorded, recorded, plain, ...) so that the
machine's drift hits both alike; medians are compared, of wall-clock seconds
and of this process's CPU seconds (which other load on a shared machine
disturbs less), and so is each adjacent pair. Torch runs on one thread by
default, for the same reason. Inside the recorded runs the writer's own time
per frame (encode, checksum, write) is clocked. Then the sink's cost per step
without a model: the same schedule through LLMEngine + SyntheticRunner with no
sink, with events built into a list, folded for generate's summary, written
stored (the writer now, its compaction at close not counted) and deflated in
the step (the writer before). Last, the two writers side by side in place
(runs alternating, each writer's time per frame clocked inside the recorded
model runs): the writer before (InStepDeflateTraceWriter: each frame deflated
inside the step) and the writer now (frames stored, the trace compacted at
close, which is clocked too); then the writer's frame by phase, in place.

    python benchmarks/bench_record_overhead.py [--repeats 7] [--requests 16] [--threads 1] [--writers-only]
        [--batched]
"""
import argparse
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracengine.analysis.timeline_sink import RequestTimelineSink  # noqa: E402
from tracengine.engine.config import Config  # noqa: E402
from tracengine.trace.sinks import NULL_SINK, ListSink  # noqa: E402
from tracengine.engine.llm_engine import LLMEngine  # noqa: E402
from tracengine.sim.runners import SyntheticRunner  # noqa: E402
from tracengine.engine.sampling_params import SamplingParams  # noqa: E402
from tracengine.trace import tracelog  # noqa: E402
from tracengine.trace.tracelog import TraceWriter, make_header
from tracengine.trace.frames import deflate_frame, frame_head, primed_deflater

# A small cache and budget, so the run chunks, blocks, preempts and hits the prefix cache;
# 4 sequences at a time with 64 tokens each: about 300 steps for 16 requests.
CONFIG = dict(kvcache_block_size=16, num_kvcache_blocks=32, max_num_batched_tokens=128, max_num_seqs=4, seed=0)
# --batched: the server benchmark's engine (bench_serve.py): 32 sequences at a time, bigger frames
BATCHED_CONFIG = dict(max_model_len=512, max_num_seqs=32, seed=0)
MAX_TOKENS = 64


def build_workload(num_requests: int, vocab_size: int, seed: int = 0) -> tuple[list, SamplingParams]:
    """Prompts of 24-160 token ids, half after a shared 32-token prefix; greedy,
    a fixed length, so every run schedules the same steps."""
    rng = random.Random(seed)
    prefix = [rng.randrange(1, vocab_size) for _ in range(32)]
    prompts = []
    for _ in range(num_requests):
        prompt = [rng.randrange(1, vocab_size) for _ in range(rng.randint(24, 128))]
        prompts.append(prefix + prompt if rng.random() < 0.5 else prompt)
    return prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


class FrameClock:
    """Clocks TraceWriter._write_frame while installed."""

    def __init__(self):
        self.ns = 0
        self.num_frames = 0
        self._original = TraceWriter._write_frame

    def __enter__(self):
        original = self._original

        def write_frame(writer, events):
            start = time.perf_counter_ns()
            original(writer, events)
            self.ns += time.perf_counter_ns() - start
            self.num_frames += 1

        TraceWriter._write_frame = write_frame
        return self

    def __exit__(self, *exc):
        TraceWriter._write_frame = self._original


class InStepDeflateTraceWriter(TraceWriter):
    """The writer before compaction, kept to measure against: each frame deflated
    inside the step as it is written (the same frames as a compacted trace's),
    nothing done at close."""

    def __init__(self, path, header, deflate: bool = True):
        self._deflater = primed_deflater()
        super().__init__(path, header, deflate=False)

    def _write_frame(self, events) -> None:
        payload = self._encoder.encode(events)
        word, payload = deflate_frame(self._deflater, payload)
        self._write(frame_head(word, xxhash.xxh64_intdigest(payload, word >> 31)) + payload)


WRITERS = {"before: deflated inside the step": InStepDeflateTraceWriter,
           "now: stored, compacted at close": TraceWriter}


class PhaseClockedTraceWriter(TraceWriter):
    """The writer now, each phase of its frame clocked (the clock's own calls included)."""
    phase_ns: dict[str, list[int]] = {}

    def _write_frame(self, events) -> None:
        clock, phases = time.perf_counter_ns, self.phase_ns
        t0 = clock()
        payload = self._encoder.encode(events)
        t1 = clock()
        frame = frame_head(len(payload), xxhash.xxh64_intdigest(payload)) + payload
        t2 = clock()
        self._write(frame)
        t3 = clock()
        for name, start, end in (("encode", t0, t1), ("checksum and head", t1, t2),
                                 ("write (one call, unbuffered)", t2, t3), ("the frame", t0, t3)):
            phases.setdefault(name, []).append(end - start)


def frame_phases(llm, prompts, sp, tmp: str, repeats: int):
    """Each phase of the writer's frame inside recorded model runs: medians over all frames."""
    PhaseClockedTraceWriter.phase_ns = {}
    for _ in range(repeats):
        with recording_with(PhaseClockedTraceWriter, [], []):
            model_run(llm, prompts, sp, os.path.join(tmp, "phases.trace"))
    print(f"\nthe writer's frame by phase, in place ({repeats} recorded runs; us, median / mean over frames):")
    for name, ns in PhaseClockedTraceWriter.phase_ns.items():
        print(f"  {name:<32} {statistics.median(ns) / 1000:6.1f} / {statistics.mean(ns) / 1000:6.1f} us")


@contextlib.contextmanager
def recording_with(cls, frame_ns: list, compaction_ns: list):
    """LLM.generate(record=...) writes with `cls`, each frame's nanoseconds appended to `frame_ns`
    and each compaction's (at close) to `compaction_ns`."""
    def write_frame(writer, events, _write=cls._write_frame):
        start = time.perf_counter_ns()
        _write(writer, events)
        frame_ns.append(time.perf_counter_ns() - start)

    def compact_closed(writer, _compact=cls._compact_closed):
        start = time.perf_counter_ns()
        _compact(writer)
        compaction_ns.append(time.perf_counter_ns() - start)
    clocked = type(cls.__name__, (cls,), {"_write_frame": write_frame, "_compact_closed": compact_closed})
    tracelog.TraceWriter = clocked
    try:
        yield
    finally:
        tracelog.TraceWriter = TraceWriter


def writers_in_place(llm, prompts, sp, tmp: str, repeats: int, step_us: float | None):
    """Each writer's median time per frame inside the recorded model runs, alternating;
    and the compaction at close, per frame and per run."""
    per_run = {name: [] for name in WRITERS}
    compaction = {name: [] for name in WRITERS}     # (us per frame, ms per run)
    sizes = {}
    names = list(WRITERS)
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            frame_ns, compaction_ns = [], []
            path = os.path.join(tmp, f"writer-{names.index(name)}.trace")
            with recording_with(WRITERS[name], frame_ns, compaction_ns):
                wall, _, num_steps = model_run(llm, prompts, sp, path)
            per_run[name].append(sum(frame_ns) / len(frame_ns) / 1000)
            if compaction_ns:
                compaction[name].append((sum(compaction_ns) / len(frame_ns) / 1000, sum(compaction_ns) / 1e6))
            sizes[name] = os.path.getsize(path)
            step_us = step_us or 1e6 * wall / num_steps
    print(f"\nwriters in place ({repeats} recorded runs each, alternating; us per frame: the mean of each run, "
          "the median of those):")
    for name, runs in per_run.items():
        us = statistics.median(runs)
        print(f"  {name:<34} {us:7.1f} us  {100 * us / step_us:5.2f}% of a {step_us / 1000:.1f} ms step  "
              f"trace {sizes[name]:,} B  runs {' '.join(f'{v:.1f}' for v in runs)}")
    for name, runs in compaction.items():
        if runs:
            print(f"  {name}: the compaction at close {statistics.median(us for us, _ in runs):.1f} us per frame, "
                  f"{statistics.median(ms for _, ms in runs):.2f} ms per run of {len(frame_ns)} frames "
                  "(medians; outside the steps)")


def model_run(llm, prompts, sp, path) -> tuple[float, float, int]:
    """Wall and CPU seconds and steps of one generate; from a fresh scheduler either way."""
    if path is None:
        llm.reset()       # recording resets too: both start with an empty prefix cache
    wall, cpu = time.perf_counter(), time.process_time()
    llm.generate(prompts, sp, record=path, use_tqdm=False)
    return time.perf_counter() - wall, time.process_time() - cpu, llm.num_steps


def synthetic_steps(config: Config, prompts, sp, sink) -> tuple[float, int]:
    engine = LLMEngine(config, SyntheticRunner(vocab_size=1024, eos=config.eos), sink)
    for prompt in prompts:
        engine.add_request(prompt, sp)
    start = time.perf_counter()
    while not engine.is_finished():
        engine.step()
    elapsed = time.perf_counter() - start
    if isinstance(sink, TraceWriter):
        sink.close()
    return elapsed, engine.num_steps


def sink_costs(config: Config, prompts, sp, tmp: str, repeats: int = 7) -> dict[str, float]:
    """Microseconds per step of the step loop without a model, best of `repeats`, for each sink."""
    path = os.path.join(tmp, "synthetic.trace")
    sinks = {
        "no sink": lambda: NULL_SINK,
        "events built (ListSink)": ListSink,
        "summary (timeline fold)": lambda: RequestTimelineSink(make_header(config)),
        "written, stored (now)": lambda: TraceWriter(path, make_header(config), deflate=False),
        "written, deflated (before)": lambda: InStepDeflateTraceWriter(path, make_header(config)),
    }
    best = {name: float("inf") for name in sinks}
    synthetic_steps(config, prompts, sp, NULL_SINK)     # warm-up
    for _ in range(repeats):
        for name, make in sinks.items():
            elapsed, num_steps = synthetic_steps(config, prompts, sp, make())
            best[name] = min(best[name], 1e6 * elapsed / num_steps)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="runs of each kind (default 7)")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--writers-only", action="store_true", help="only the writers side by side")
    parser.add_argument("--batched", action="store_true",
                        help="the server benchmark's engine (32 sequences, no small cache); with --requests 48")
    args = parser.parse_args(argv)
    engine_kwargs = BATCHED_CONFIG if args.batched else CONFIG

    import torch
    torch.set_num_threads(args.threads)
    from tracengine.engine.llm import LLM
    llm = LLM("", **engine_kwargs)
    prompts, sp = build_workload(args.requests, llm.hf_config.vocab_size)
    runs = {False: [], True: []}     # (wall s, cpu s) per run
    frame_us = []                    # the writer's microseconds per frame, per recorded run
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.trace")
        _, _, num_steps = model_run(llm, prompts, sp, None)          # warm-up, not counted
        if args.writers_only:
            writers_in_place(llm, prompts, sp, tmp, args.repeats, None)
            frame_phases(llm, prompts, sp, tmp, args.repeats)
            return 0
        print(f"embedded tiny Qwen3 on {llm.runner.device}, {torch.get_num_threads()} torch thread(s), "
              f"{args.requests} requests, {num_steps} steps per run, {args.repeats} runs each, alternating\n")
        for r in range(args.repeats):
            for record in ((False, True) if r % 2 == 0 else (True, False)):
                with FrameClock() as clock:
                    wall, cpu, steps = model_run(llm, prompts, sp, path if record else None)
                if record:
                    frame_us.append(clock.ns / 1000 / clock.num_frames)
                assert steps == num_steps, f"a run took {steps} steps, not {num_steps}"
                runs[record].append((wall, cpu))
                print(f"  run {r}  {'recorded' if record else 'plain   '}  {wall:7.3f} s wall  {cpu:7.3f} s cpu")
        trace_bytes = os.path.getsize(path)
        config = llm.config
        llm.close()

        median = {(record, k): statistics.median(run[k] for run in runs[record]) for record in runs for k in (0, 1)}
        print(f"\n{'':<10} {'wall s':>8} {'steps/s':>8} {'min':>8} {'max':>8}   {'cpu s':>8} {'steps/s':>8}")
        for name, record in (("plain", False), ("recorded", True)):
            walls = [run[0] for run in runs[record]]
            print(f"{name:<10} {median[record, 0]:>8.3f} {num_steps / median[record, 0]:>8.2f} {min(walls):>8.3f} "
                  f"{max(walls):>8.3f}   {median[record, 1]:>8.3f} {num_steps / median[record, 1]:>8.2f}")
        print(f"recording costs {100 * (median[True, 0] / median[False, 0] - 1):+.2f}% wall, "
              f"{100 * (median[True, 1] / median[False, 1] - 1):+.2f}% cpu (medians); trace {trace_bytes:,} bytes")
        pairs = [[recorded[k] / plain[k] - 1 for plain, recorded in zip(runs[False], runs[True])] for k in (0, 1)]
        print(f"median of the {args.repeats} adjacent pairs: {100 * statistics.median(pairs[0]):+.2f}% wall, "
              f"{100 * statistics.median(pairs[1]):+.2f}% cpu")
        step_us = 1e6 * median[False, 0] / num_steps
        writer_us = statistics.median(frame_us)
        print(f"the writer inside the recorded runs: {writer_us:.1f} us per frame (median), "
              f"{100 * writer_us / step_us:.2f}% of a {step_us / 1000:.1f} ms step")

        costs = sink_costs(config, prompts, sp, tmp)
        llm = LLM("", **engine_kwargs)
        writers_in_place(llm, prompts, sp, tmp, args.repeats, step_us)
        frame_phases(llm, prompts, sp, tmp, args.repeats)
        llm.close()
    print(f"\nthe sink per step, without a model ({num_steps} steps, best of 7):")
    base = costs["no sink"]
    for name, us in costs.items():
        share = 100 * (us - base) / step_us
        extra = "" if name == "no sink" else f"+{us - base:6.1f} us  {share:6.3f}% of a model step"
        print(f"  {name:<26} {us:8.1f} us/step  {extra}")
    print(f"(a model step here takes {step_us / 1000:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

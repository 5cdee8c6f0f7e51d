"""The reliability harness of tests/test_reliability.py, run longer: single-bit
flips spread over every region of a recorded trace (preamble, header frame head
and payload, step frame heads and payloads, end frame), a cut at every byte,
and the hand-made hostile files with the peak memory of reading each.

    python benchmarks/fuzz_trace.py [--trials 10000] [--seed 16] [--atheris SECONDS]

A trial is 'reported' when the reader refuses with a typed error that says
where (TraceCorruptError with an offset, a version error, not-a-trace for a
damaged magic); 'silent' otherwise: a read that goes on, comes back shorter,
or calls the damage a torn tail (the goal is 0). With --atheris (if atheris is
installed) a coverage-guided fuzzer mutates the trace for that many seconds and
fails on any exception that is not a TraceError (reading, and folding the events
as `check` does); half its inputs get valid checksums again, so that mutations
reach the inflater, the decoder and the fold. atheris installs here from a
wheel (`pip install atheris`)."""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import test_reliability as harness   # noqa: E402  (the same harness the tests run)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--atheris", type=float, default=0.0, metavar="SECONDS")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trace = tmp / "run.trace"
        harness.recorded_trace(trace)
        size = os.path.getsize(trace)
        print(f"trace: {size:,} bytes, the every-event-type run (deflated frames)")

        start = time.perf_counter()
        counts = harness.run_flips(trace, tmp / "flipped.trace", args.trials, args.seed)
        silent_cases = counts.pop("silent_cases", [])
        seconds = time.perf_counter() - start
        print(f"\nbit flips: {args.trials:,} trials, seed {args.seed}, {seconds:.1f} s")
        print(f"  {'region':<16}{'trials':>8}{'reported':>10}{'silent':>8}")
        for region, c in counts.items():
            print(f"  {region:<16}{c['reported'] + c['silent']:>8}{c['reported']:>10}{c['silent']:>8}")
        reported = sum(c["reported"] for c in counts.values())
        silent = sum(c["silent"] for c in counts.values())
        print(f"  {'all':<16}{args.trials:>8}{reported:>10}{silent:>8}")
        for case in silent_cases[:10]:
            print(f"  silent: {case}")

        for deflate in (True, False):
            path = tmp / f"cut-{deflate}.trace"
            harness.recorded_trace(path, deflate=deflate)
            data = path.read_bytes()
            ends = harness.frame_ends(path)
            start = time.perf_counter()
            problems = [cut for cut in range(len(data) + 1)
                        if harness.check_cut(path, data, tmp / "cut.trace", ends, cut) is not None]
            print(f"\ncuts at every byte ({'deflated' if deflate else 'stored'} frames): {len(data) + 1:,} cuts, "
                  f"{len(problems)} wrong, {time.perf_counter() - start:.1f} s")

        print(f"\nhostile files: {'name':<40}{'bytes':>11}{'peak memory':>14}{'per byte':>10}  outcome")
        largest = (0, "")
        for name, (build, expected) in harness.HOSTILE_FILES.items():
            data = build()
            path = tmp / "hostile.trace"
            path.write_bytes(data)
            outcome = harness.read_all(path, measure=True)
            verdict = "read" if outcome.kind == "read" else type(outcome.error).__name__
            ok = (expected == "read" and outcome.kind == "read" or expected == "torn" and outcome.torn_offset is not None
                  or expected in ("corrupt", "version") and harness.is_reported(outcome))
            print(f"  {name:<54}{len(data):>11,}{outcome.peak_bytes:>14,}{outcome.peak_bytes / len(data):>10.1f}  "
                  f"{verdict}{'' if ok else '  UNEXPECTED'}")
            largest = max(largest, (outcome.peak_bytes, name))
        print(f"  largest peak: {largest[0] / 2**20:.1f} MiB ({largest[1]})")

        if args.atheris:
            run_atheris(trace, args.atheris)
    return 1 if silent else 0


def check_events(path: Path) -> None:
    """What `tracengine check` does past the frames: fold every event."""
    from tracengine.replay.event_check import EventCheck
    from tracengine.trace.tracelog import TraceReader
    with TraceReader(path) as reader:
        check = EventCheck(reader.header)
        for i in range(1, reader.num_frames):
            check.frame(reader.read_frame(i))


def reseal(data: bytes) -> bytes:
    """`data` with every frame head (as its lengths lay them out) given a valid checksum and head check."""
    import xxhash
    from tracengine.trace.frames import DEFLATED, FRAME_HEAD, LENGTH_MASK, PREAMBLE, pack_head
    out = bytearray(data)
    offset = PREAMBLE.size
    while offset + FRAME_HEAD.size <= len(out):
        word = int.from_bytes(out[offset:offset + 4], "little")
        nbytes = min(word & LENGTH_MASK, len(out) - offset - FRAME_HEAD.size)
        word = nbytes | (word & DEFLATED)
        payload = bytes(out[offset + FRAME_HEAD.size:offset + FRAME_HEAD.size + nbytes])
        pack_head(memoryview(out)[offset:], word, xxhash.xxh64_intdigest(payload, word >> 31))
        offset += FRAME_HEAD.size + nbytes
    return bytes(out)


def run_atheris(trace: Path, seconds: float) -> None:
    try:
        import atheris
    except ImportError:
        print("\natheris: not installed (pip install atheris); skipped")
        return
    from tracengine.errors import TraceError
    seed_bytes = trace.read_bytes()
    work = trace.with_name("atheris.trace")
    deadline = None
    num_inputs = 0

    def one_input(data: bytes):
        nonlocal num_inputs, deadline
        if deadline is None:     # from the first input: instrumenting takes its own time
            deadline = time.monotonic() + seconds
        if time.monotonic() > deadline:
            print(f"atheris: {num_inputs:,} inputs, no exception but TraceError", flush=True)
            os._exit(0)       # libFuzzer has no clean stop; every figure is printed by now
        num_inputs += 1
        # Half the inputs get their frames' checksums and head checks made valid again, so the
        # mutations reach the inflater, the decoder and the index past the checksums.
        work.write_bytes(reseal(data) if len(data) % 2 else data)
        harness.read_all(work)   # refusals are TraceErrors it returns; anything else is raised
        try:
            check_events(work)
        except TraceError:
            pass

    print(f"\natheris: {seconds:.0f} s of coverage-guided mutation of the trace (libFuzzer's report follows)",
          flush=True)
    from tracengine.replay import fold
    from tracengine.trace import tracelog
    for module in (tracelog, fold):   # the reader's and the checker's Python code, for coverage
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == module.__name__:
                for name, member in vars(value).items():
                    if callable(member) and hasattr(member, "__code__"):
                        setattr(value, name, atheris.instrument_func(member))
            elif callable(value) and getattr(value, "__module__", None) == module.__name__ \
                    and hasattr(value, "__code__"):
                setattr(module, value.__name__, atheris.instrument_func(value))
    corpus = trace.with_name("corpus")   # seeded with the trace itself and a stored-frames one
    corpus.mkdir()
    (corpus / "deflated.trace").write_bytes(seed_bytes)
    harness.recorded_trace(corpus / "stored.trace", deflate=False)
    atheris.Setup([sys.argv[0], "-seed=16", f"-max_len={4 * len(seed_bytes)}", str(corpus)], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    sys.exit(main())

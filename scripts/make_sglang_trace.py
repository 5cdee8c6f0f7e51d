"""Writes traces/sglang.trace: SGLang's own scheduler (the installed SGLang, run on the CPU with a
stand-in worker, tracengine/sglang/drive.py) recorded through tracengine's hooks. 12 requests
sharing a 64-token prefix in a pool of 400 token slots, chunks of 64 tokens: chunked prefill,
radix-cache prefix matches, an abort of a running request and of a waiting one. Kept: its
re-execution needs the SGLang it names (tests/test_sglang.py). With `--overlap`, the same
workload through SGLang's overlap loop (one batch in flight): traces/sglang_overlap.trace.

    python scripts/make_sglang_trace.py [--overlap] [OUT]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracengine.trace.tracelog import write_trace  # noqa: E402


def main(out: Path, loop: str = "normal") -> None:
    from tracengine.sglang.build import default_config
    from tracengine.sglang.drive import RequestSpec, record_workload
    specs = [RequestSpec(f"r{i}", list(range(100, 164)) + [200 + i] * (8 + 3 * i), 4 + i % 5, arrival_step=i // 2)
             for i in range(12)]
    events = record_workload(default_config(max_total_tokens=400, chunked_prefill_size=64, max_running_requests=6,
                                            scheduler_loop=loop), specs, aborts={4: ["r3"], 6: ["r11"]})
    write_trace(out, events)
    print(f"wrote {out}: {sum(1 for e in events if type(e).__name__ == 'StepEnd')} steps")


if __name__ == "__main__":
    args = sys.argv[1:]
    loop = "overlap" if "--overlap" in args else "normal"
    args = [a for a in args if a != "--overlap"]
    name = "sglang_overlap.trace" if loop == "overlap" else "sglang.trace"
    main(Path(args[0]) if args else Path(__file__).resolve().parents[1] / "traces" / name, loop)

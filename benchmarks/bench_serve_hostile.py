"""`tracengine serve` against hostile clients (issue 34), each server a process.

1. A 1 MiB prompt against a concurrent stream: a client streams a completion
   (greedy, EOS ignored) while, once it has its first tokens, other clients send
   prompts of 1 MiB of text (refused once tokenized: far over max_model_len).
   The stream's largest gap between tokens, without the huge prompts and with
   them, rounds alternating on one server; medians. With --before DIR, a
   server run from an older checkout (the code in DIR) is measured alike in
   the same rounds.
2. Shutdown with a stalled client: a client streams, another sends its
   headers and no body, then the server gets SIGTERM. The seconds from the
   signal to the process's exit, and to its trace's end frame.

    python benchmarks/bench_serve_hostile.py [--repeats 5] [--num-huge 1,8] [--before DIR]
"""
import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracengine.trace.tracelog import TraceReader  # noqa: E402

ENGINE_FLAGS = ["--max-model-len", "512", "--num-kvcache-blocks", "256", "--max-num-seqs", "16"]
HUGE_PROMPT = "word " * 200_000          # 1,000,000 bytes of text: the body stays under the 1 MiB bound


class Server:
    """A `tracengine serve` process on a free port, running the code under `code`."""

    def __init__(self, code: Path, *flags: str):
        env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tracengine.cli", "serve", "--port", "0", *ENGINE_FLAGS,
                                      *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     cwd=code)
        line = self.proc.stdout.readline()
        if "http://" not in line:
            self.proc.kill()
            raise SystemExit(f"the server did not start: {line!r} {self.proc.communicate()[1]}")
        self.url = line.split(" on ")[1].split()[0]

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.communicate(timeout=120)[1]


def stream_gaps(url: str, num_huge: int) -> float:
    """The largest gap in seconds between consecutive token chunks of one stream, with
    `num_huge` 1 MiB prompts sent once it has 10 tokens."""
    body = {"model": "embedded", "prompt": list(range(1, 33)), "max_tokens": 200, "ignore_eos": True,
            "temperature": 0, "stream": True}
    times, senders = [], []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter())
                if len(times) == 10:
                    for _ in range(num_huge):
                        sender = threading.Thread(target=httpx.post, args=(url + "/v1/completions",),
                                                  kwargs={"json": {"model": "embedded", "prompt": HUGE_PROMPT,
                                                                   "max_tokens": 4}, "timeout": 300})
                        sender.start()
                        senders.append(sender)
    for sender in senders:
        sender.join()
    if len(times) != 200:
        raise SystemExit(f"the stream got {len(times)} chunks, not 200")
    return max(b - a for a, b in zip(times, times[1:]))


def huge_prompts(args, codes: dict[str, Path]):
    print(f"1. a stream's largest gap between tokens (ms) with 1 MiB prompts sent during it; {args.repeats} "
          "alternating rounds, medians (runs)\n")
    servers = {name: Server(code) for name, code in codes.items()}
    gaps = {(name, n): [] for name in codes for n in [0, *args.num_huge]}
    try:
        for _ in range(args.repeats):
            for name, server in servers.items():
                for n in [0, *args.num_huge]:
                    gaps[(name, n)].append(stream_gaps(server.url, n) * 1e3)
    finally:
        for server in servers.values():
            server.stop()
    for name in codes:
        base = statistics.median(gaps[(name, 0)])
        for n in [0, *args.num_huge]:
            runs = gaps[(name, n)]
            m = statistics.median(runs)
            print(f"  {name:<8} {n} huge: {m:9.1f} ms ({min(runs):.1f}-{max(runs):.1f}), {m / base:6.2f}x "
                  "the stream alone")
    print()


def stalled_shutdown(args, codes: dict[str, Path], tmp: Path):
    print("2. SIGTERM with a client that sent its headers and no body, while another streams (s)\n")
    for name, code in codes.items():
        exits, ends = [], []
        for i in range(args.shutdown_repeats):
            path = tmp / f"{name}-{i}.trace"
            server = Server(code, "--record", str(path))
            got = threading.Event()

            def stream():
                body = {"model": "embedded", "prompt": list(range(1, 33)), "max_tokens": 400, "ignore_eos": True,
                        "stream": True}
                with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=300) as response:
                    for line in response.iter_lines():
                        got.set()
            streamer = threading.Thread(target=stream)
            streamer.start()
            got.wait(60)
            host, port = server.url.removeprefix("http://").rsplit(":", 1)
            with socket.create_connection((host, int(port))) as stalled:
                stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                b"Content-Length: 100\r\n\r\n")
                time.sleep(0.2)
                start = time.perf_counter()
                server.proc.send_signal(signal.SIGTERM)
                ended = None
                while server.proc.poll() is None:
                    if ended is None:
                        with TraceReader(path) as reader:
                            if reader.ended:
                                ended = time.perf_counter() - start
                    time.sleep(0.01)
                exits.append(time.perf_counter() - start)
                ends.append(ended if ended is not None else exits[-1])
                server.proc.communicate()
            streamer.join()
        print(f"  {name:<8} exit {statistics.median(exits):6.2f} s ({min(exits):.2f}-{max(exits):.2f}), "
              f"end frame {statistics.median(ends):6.2f} s after the signal")
    print()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shutdown-repeats", type=int, default=3)
    parser.add_argument("--num-huge", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    parser.add_argument("--before", type=Path, help="a checkout of older code, measured alike")
    parser.add_argument("--only", choices=["huge", "shutdown"])
    args = parser.parse_args()
    codes = {"now": REPO}
    if args.before is not None:
        codes["before"] = args.before.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "huge"):
            huge_prompts(args, codes)
        if args.only in (None, "shutdown"):
            stalled_shutdown(args, codes, Path(tmp))


if __name__ == "__main__":
    main()

"""`tracengine export` on a large trace: peak memory (the child process's peak RSS) and wall
time, the export streamed (analysis/export_stream.py).

    python benchmarks/bench_export_memory.py TRACE [--module FILE]

--module runs `export_perfetto` from another copy of analysis/export.py (an older commit's,
`git show COMMIT:tracengine/analysis/export.py > old_export.py`) for a before/after."""
import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

CHILD = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("export_under_test", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.export_perfetto(sys.argv[2], sys.argv[3])
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("--module", default=os.path.join(ROOT, "tracengine", "analysis", "export.py"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        env = dict(os.environ, PYTHONPATH=ROOT)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", CHILD, args.module, args.trace, out], env=env, check=True)
        wall = time.perf_counter() - start
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"{os.path.basename(args.trace)} ({os.path.getsize(args.trace) / 1e6:,.1f} MB): peak RSS "
              f"{peak_mib:,.0f} MiB, {wall:.1f} s wall, JSON {os.path.getsize(out) / 1e6:,.1f} MB")


if __name__ == "__main__":
    main()

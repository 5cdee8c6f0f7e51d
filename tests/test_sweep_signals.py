"""A local sweep stops with its command: SIGINT or SIGTERM stops it and its worker processes
at once (not after the variants running or queued), a parent that is killed takes its
workers with it, and the rows finished before are kept in the cache."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import SWEEP_MODEL, sweep_of, write_mooncake
from tracengine.cli.common import EXIT_INTERRUPTED, EXIT_TERMINATED
from tracengine.sim.cache import ResultCache, variant_key
from tracengine.sim.executors import run_variants
from tracengine.sim.spec import Variant

ROOT = Path(__file__).resolve().parent.parent
HANG = 20       # seconds: no bound on speed, a check that the command does not run the sweep out

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process table in /proc")


def children(pid: int) -> list[int]:
    """The live (not zombie) processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if int(ppid) == pid and state != "Z":
                found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_sweep(tmp_path) -> tuple[subprocess.Popen, list[int]]:
    """A 2-process sweep far longer than HANG, once both its workers run."""
    (tmp_path / "config.json").write_text(json.dumps(SWEEP_MODEL))
    argv = ["simulate", "--num-prompts", "20000", "--request-rate", "50", "--roofline", "config.json",
            "--peak-tflops", "1", "--bandwidth-tbs", "0.05", "--set", "num_kvcache_blocks=400", "--quiet",
            "--sweep", "max_num_seqs=4,8,16,32,64,128,256,512", "--jobs", "2", "--no-cache"]
    # output to files: a worker left behind would hold a pipe open, and reading it would hang
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tracengine.cli", *argv], cwd=tmp_path,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=out, stderr=err)
    deadline = time.monotonic() + 60
    while len(children(proc.pid)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()
        time.sleep(0.05)
    time.sleep(0.5)      # into their first variants
    return proc, children(proc.pid)


def gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + HANG
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, EXIT_INTERRUPTED), (signal.SIGTERM, EXIT_TERMINATED)])
def test_a_signal_stops_a_sweep_and_its_workers(tmp_path, signum, status):
    proc, workers = start_sweep(tmp_path)
    try:
        proc.send_signal(signum)
        try:
            proc.wait(timeout=HANG)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the sweep ran on after {signal.Signals(signum).name}")
        err = (tmp_path / "err").read_text()
        assert proc.returncode == status, err
        assert err.strip().splitlines()[-1] == f"tracengine: interrupted ({signal.Signals(signum).name})"
        assert gone(workers)
    finally:
        clean_up(proc, workers)


def test_the_workers_of_a_killed_sweep_go_with_it(tmp_path):
    proc, workers = start_sweep(tmp_path)
    try:
        proc.kill()
        proc.wait()
        assert gone(workers)
    finally:
        clean_up(proc, workers)


def clean_up(proc, workers):
    """What a failed test left running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in workers:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


class StoppedAfterOne:
    """An executor whose first variant finishes and whose second is interrupted."""

    def num_workers(self, num_variants):
        return 1

    def run(self, spec, source, variants, timeout, prepared, on_row=None):
        from tracengine.sim.executors import run_one
        on_row(0, run_one(spec, source, variants[0], timeout, prepared))
        raise KeyboardInterrupt


def test_a_stopped_sweep_keeps_its_finished_rows_in_the_cache(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SWEEP_MODEL))
    spec, source, prepared = sweep_of(write_mooncake(tmp_path / "mooncake.jsonl"), str(tmp_path / "config.json"))
    cache = ResultCache(str(tmp_path / "cache"))
    variants = [Variant({"max_num_seqs": 1}), Variant({"max_num_seqs": 4})]
    with pytest.raises(KeyboardInterrupt):
        run_variants(spec, source, variants, StoppedAfterOne(), prepared, cache)
    assert cache.get(variant_key(spec, variants[0])) is not None
    assert cache.get(variant_key(spec, variants[1])) is None and cache.num_written == 1

"""`tracengine events` and `tracengine check` through the CLI entry point."""
import json

import pytest

from helpers import cut_like_a_kill
from test_tracelog import flip_byte, record
from tracengine.analysis.stats import stats
from tracengine.cli import main
from tracengine.trace.events import CPU_TIER_EVENT_TYPES, EVENT_TYPES, FLEET_EVENT_TYPES, HASH_ID_EVENT_TYPES, SPEC_EVENT_TYPES, VLLM_EVENT_TYPES
from tracengine.trace.tracelog import FORMAT_VERSION, TraceReader
from tracengine.trace.frames import FRAME_HEAD, PREAMBLE
from tracengine.tui.trace_index import TraceIndex


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "run.trace"
    header, events, engine = record(path)
    return path, [header] + events, engine


def run(capsys, *argv):
    exit_code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exit_code, out, err


def test_events_json_is_one_object_per_event(trace, capsys):
    path, events, _ = trace
    exit_code, out, err = run(capsys, "events", path, "--json")
    assert exit_code == 0 and err == ""
    objects = [json.loads(line) for line in out.splitlines()]
    assert len(objects) == len(events)
    assert objects[0]["type"] == "TraceHeader" and objects[0]["format_version"] == FORMAT_VERSION
    # only a server aborts (test_serve_abort); one engine writes no fleet event
    assert {o["type"] for o in objects} == set(EVENT_TYPES) - {"SeqAbort", "RunEnd"} - FLEET_EVENT_TYPES - HASH_ID_EVENT_TYPES - VLLM_EVENT_TYPES \
        - SPEC_EVENT_TYPES - CPU_TIER_EVENT_TYPES   # the run finished
    assert all("step" in o for o in objects[1:])
    decision = next(o for o in objects if o["type"] == "ScheduleDecision")
    assert list(decision)[:3] == ["type", "step", "phase"]
    assert decision["seqs"][0] == {"seq_id": 0, "num_tokens": 16, "num_cached_tokens": 0}   # 20 tokens, budget 16


def test_events_listing_is_one_line_per_event(trace, capsys):
    path, events, _ = trace
    exit_code, out, _ = run(capsys, "events", path)
    lines = out.splitlines()
    assert exit_code == 0 and len(lines) == len(events)
    assert lines[0].split()[:2] == ["-", "TraceHeader"]
    step, kind, *fields = lines[1].split()
    assert (step, kind) == ("0", "RequestAdded")
    assert "seq_id=0" in fields
    # the one notation of a scheduled sequence (the step tables' too): s0:16, then s0:4@16 (16 cached)
    decisions = [line for line in lines if line.split()[1] == "ScheduleDecision"]
    assert "seqs=[s0:16]" in decisions[0] and "seqs=[s0:4@16]" in decisions[1]


def test_events_filters_combine(trace, capsys):
    path, events, _ = trace
    exit_code, out, _ = run(capsys, "events", path, "--json", "--step", "3:9", "--seq", "2", "--type", "TokenSample")
    got = [json.loads(line) for line in out.splitlines()]
    expected = [e for e in events if type(e).__name__ == "TokenSample" and 3 <= e.step < 9 and e.seq_id == 2]
    assert exit_code == 0 and len(got) == len(expected) > 0
    assert [(o["step"], o["token_id"]) for o in got] == [(e.step, e.token_id) for e in expected]


def test_events_of_one_step_and_of_one_sequence(trace, capsys):
    path, events, _ = trace
    _, out, _ = run(capsys, "events", path, "--json", "--step", "5")
    assert {json.loads(line)["step"] for line in out.splitlines()} == {5}
    _, out, _ = run(capsys, "events", path, "--json", "--seq", "2")
    got = [json.loads(line) for line in out.splitlines()]
    # seq 2's own events, its preemption, and every decision that scheduled it or stopped on it
    assert {o["type"] for o in got} >= {"RequestAdded", "BlockAllocate", "Preempt", "ScheduleDecision", "SeqFinish"}
    for o in got:
        scheduled = [s["seq_id"] for s in o.get("seqs", [])]
        assert o.get("seq_id") == 2 or 2 in scheduled or o.get("blocked_seq_id") == 2


@pytest.mark.parametrize("argv, message", [
    (["--type", "Bogus"], "unknown event type 'Bogus'"),
    (["--step", "x:3"], "--step expects a step or a range A:B, got 'x:3'"),
])
def test_events_bad_filter_is_a_one_line_error(trace, capsys, argv, message):
    exit_code, out, err = run(capsys, "events", trace[0], *argv)
    assert exit_code == 2 and out == ""
    assert err.startswith(f"tracengine: error: {message}") and err.count("\n") == 1


def test_check_whole_trace(trace, capsys):
    path, events, engine = trace
    exit_code, out, _ = run(capsys, "check", path)
    assert exit_code == 0
    assert f"frames: {engine.num_steps + 1} (header + {engine.num_steps})" in out
    assert f"steps: {engine.num_steps} (0..{engine.num_steps - 1})" in out
    assert f"events: {len(events)}" in out
    assert "TokenSample" in out and "per event" in out
    assert out.splitlines()[-1].endswith(": whole")
    assert "end frame: yes, the writer closed the trace" in out


def test_check_torn_trace_exits_1_and_still_counts(trace, capsys, tmp_path):
    path, _, engine = trace
    torn = tmp_path / "torn.trace"
    torn.write_bytes(path.read_bytes())
    cut_like_a_kill(torn, 7)                           # the last step's frame loses 7 bytes
    with TraceReader(path) as reader:
        last = reader.frames()[-1]
    exit_code, out, _ = run(capsys, "check", torn)
    assert exit_code == 1
    assert f"torn last frame: {last.nbytes + FRAME_HEAD.size - 7} bytes at offset {last.offset}" in out
    assert f"steps: {engine.num_steps - 1}" in out
    assert "end frame: none, the trace is still being written or its writer was killed" in out
    assert out.splitlines()[-1].endswith(": damaged")
    exit_code, out, err = run(capsys, "events", torn, "--type", "StepEnd")
    assert exit_code == 0 and len(out.splitlines()) == engine.num_steps - 1
    assert err.startswith("tracengine: note: torn last frame")
    # one message, wherever a torn tail is reported: check, events, replay, diff, stats and the TUI
    with TraceReader(torn) as reader:
        message = reader.describe_torn_tail()
    assert message in run(capsys, "check", torn)[1] and message in err
    assert message in run(capsys, "replay", torn)[2] and message in run(capsys, "diff", torn, torn)[2]
    assert stats(str(torn))["trace"]["torn_tail"].startswith(message + "; ")
    index = TraceIndex(torn)
    try:
        while index.index_more():
            pass
        assert index.torn_tail == message
    finally:
        index.close()


def test_check_flipped_byte_exits_1_with_offset(trace, capsys):
    path = trace[0]
    with TraceReader(path) as reader:
        bad = reader.frames()[4]
    flip_byte(path, bad.offset + 20)
    exit_code, out, _ = run(capsys, "check", path)
    assert exit_code == 1
    assert f"offset {bad.offset} (after step 2)" in out
    assert "steps: 3 (0..2)" in out                    # what precedes the damage is still counted
    exit_code, out, err = run(capsys, "events", path)
    assert exit_code == 2 and f"offset {bad.offset}" in err and err.count("\n") == 1


def test_check_damaged_header_exits_1(trace, capsys):
    path = trace[0]
    flip_byte(path, PREAMBLE.size + 15)
    exit_code, out, _ = run(capsys, "check", path)
    assert exit_code == 1 and "damaged" in out and f"offset {PREAMBLE.size}" in out


@pytest.mark.parametrize("command", ["check", "events"])
def test_missing_file_not_a_trace_and_other_version_exit_2(tmp_path, capsys, command):
    missing = tmp_path / "missing.trace"
    exit_code, _, err = run(capsys, command, missing)
    assert exit_code == 2 and err.startswith("tracengine: error:") and "missing.trace" in err

    text = tmp_path / "notes.txt"
    text.write_text("just some notes\n")
    exit_code, _, err = run(capsys, command, text)
    assert exit_code == 2 and err == f"tracengine: error: {text}: not a tracengine trace (it does not start with b'TRCE')\n"

    newer = tmp_path / "newer.trace"
    newer.write_bytes(PREAMBLE.pack(b"TRCE", FORMAT_VERSION + 1) + bytes(40))
    exit_code, _, err = run(capsys, command, newer)
    assert exit_code == 2
    assert err == (f"tracengine: error: {newer}: trace format version {FORMAT_VERSION + 1}, "
                   f"this tracengine reads versions 1 to {FORMAT_VERSION}\n")


def test_batch_commands_run_without_collector_passes_and_give_it_back(trace, capsys, tmp_path):
    """A command that reads a trace and writes figures or a trace runs with the collector paused
    (its events are in no reference cycle: a pass over them frees nothing), and leaves it as it
    found it, after an error too."""
    import gc
    import sys
    trace = trace[0]
    passes = []

    def count(phase, info):      # a pass started inside a command (not in parsing its arguments)
        frame = sys._getframe(1)
        while frame is not None and not frame.f_code.co_name.startswith("cmd_"):
            frame = frame.f_back
        if phase == "start" and frame is not None:
            passes.append(frame.f_code.co_name)
    gc.callbacks.append(count)
    try:
        for argv in (["stats", str(trace)], ["replay", str(trace), "--set", "num_kvcache_blocks=64"],
                     ["export", str(trace), "--perfetto", str(tmp_path / "p.json")], ["check", str(trace)]):
            gc.collect()
            passes.clear()
            assert main(argv) == 0, argv
            assert passes == [] and gc.isenabled(), argv
        assert main(["stats", str(tmp_path / "missing.trace")]) == 2 and gc.isenabled()
        gc.disable()       # a caller that had it off finds it off
        assert main(["stats", str(trace)]) == 0 and not gc.isenabled()
    finally:
        gc.enable()
        gc.callbacks.remove(count)
    capsys.readouterr()


def test_a_batch_command_run_as_its_process_runs_no_collector_pass_to_the_exit(trace):
    """Run as the process's own command line (main without arguments), a batch command keeps the
    collector paused from its parser's imports to the process's exit, and freezes what is left
    for the exit's own passes: its objects live to the end, and a pass over them after the run
    would walk them all for nothing."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    code = ("import gc, sys\n"
            "from tracengine.cli.main import main\n"
            "passes = []\n"
            "gc.callbacks.append(lambda phase, info: phase == 'start' and passes.append(info['generation']))\n"
            f"sys.argv = ['tracengine', 'stats', {str(trace[0])!r}]\n"
            "code = main()\n"
            "garbage = [[[]] for _ in range(100_000)]     # what would start a pass, were the collector on\n"
            "print(code, passes, gc.get_freeze_count() > 0, file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert result.stderr.strip() == "0 [] True", result.stderr[-2000:]
    # a process that loaded a package with finalizers of its own leaves its objects to the exit's passes
    code = code.replace("code = main()", "sys.modules.setdefault('vllm', None); code = main()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert result.stderr.strip() == "0 [] False", result.stderr[-2000:]

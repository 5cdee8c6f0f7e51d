"""The trace compacted at close: frames stored while the run goes on and
deflated when the writer closes, and at every instant a whole trace at the
path: a killed writer, a compaction killed or failing, and a reader following
the file across it."""
import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import record_every_event_type, write_trace
from tracengine.replay.reexec import reexecute
from tracengine.testing import every_event_type, every_event_type_config
from tracengine.trace import writer as trace_writer
from tracengine.trace.events import StepEnd
from tracengine.trace.tracelog import TraceReader, TraceWriter, compact, compaction_temp, make_header, open_trace
from tracengine.trace.frames import DEFLATED, deflate_frame, primed_deflater

REPO = Path(__file__).resolve().parents[1]


def frames(path) -> list[tuple[int, bytes]]:
    """(length word, stored payload) of every frame but the end frame."""
    with TraceReader(path) as reader:
        return list(reader.stored_frames())


def assert_whole(path, events=None, deflated: bool | None = None):
    """A trace that ends with its end frame, reads without damage, holds `events` and replays."""
    with TraceReader(path) as reader:
        assert reader.ended and reader.corruption is None and reader.torn_tail is None
    words = [word for word, _ in frames(path)]
    if deflated is not None:
        assert all(word & DEFLATED for word in words) if deflated else not any(word & DEFLATED for word in words)
    if events is not None:
        assert list(open_trace(path)) == events
    assert reexecute(open_trace(path)).ok


def test_frames_are_stored_while_written_and_deflated_at_close(tmp_path):
    path = tmp_path / "run.trace"
    writer = TraceWriter(path, make_header(every_event_type_config()))
    engine = every_event_type(writer)
    live = frames(path)                      # a reader while the writer is open: every frame stored
    assert len(live) == 1 + engine.num_steps and not any(word & DEFLATED for word, _ in live)
    writer.close()
    closed = frames(path)
    # the same frames, each deflated as `deflate_frame` does it (here every one gains)
    assert closed == [deflate_frame(primed_deflater(), payload) for _, payload in live]
    assert all(word & DEFLATED for word, _ in closed)
    assert sum(len(p) for _, p in closed) < 0.8 * sum(len(p) for _, p in live)   # the heads are the same
    assert not os.path.exists(compaction_temp(path))
    assert_whole(path)


def test_deflate_false_keeps_the_frames_stored(tmp_path):
    header, events, _ = record_every_event_type(tmp_path / "stored.trace", deflate=False)
    assert_whole(tmp_path / "stored.trace", [header] + events, deflated=False)


def test_compaction_of_a_compacted_trace_changes_nothing(tmp_path):
    path = tmp_path / "run.trace"
    record_every_event_type(path)
    before = path.read_bytes()
    compact(path)
    assert path.read_bytes() == before


def test_a_link_stays_a_link_to_the_compacted_trace(tmp_path):
    target = tmp_path / "real.trace"
    link = tmp_path / "link.trace"
    link.symlink_to(target.name)
    header, events, _ = record_every_event_type(link)
    assert link.is_symlink()
    assert_whole(target, [header] + events, deflated=True)
    assert sorted(os.listdir(tmp_path)) == ["link.trace", "real.trace"]


def test_a_device_is_written_and_never_replaced(tmp_path, capsys):
    with TraceWriter(os.devnull, make_header(every_event_type_config())) as writer:
        writer.emit(StepEnd(0, 1, 2, 3, 4))
    assert capsys.readouterr().err == ""
    assert Path(os.devnull).is_char_device()


def fsync_fails(fd):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where", ["in the copy", "at its sync"])
def test_a_failed_compaction_leaves_the_stored_trace_and_one_warning(tmp_path, monkeypatch, capsys, where):
    num_deflated = []

    def deflate_fails_at_the_third_frame(deflater, payload):
        num_deflated.append(1)
        if len(num_deflated) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return deflate_frame(deflater, payload)

    if where == "in the copy":
        monkeypatch.setattr(trace_writer, "deflate_frame", deflate_fails_at_the_third_frame)
    else:
        monkeypatch.setattr(trace_writer.os, "fsync", fsync_fails)
    path = tmp_path / "full.trace"
    header, events, _ = record_every_event_type(path)       # the writer's close: no error raised
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tracengine: warning: {path} is kept with its frames stored")
    assert "No space left on device" in err
    monkeypatch.undo()
    assert_whole(path, [header] + events, deflated=False)
    assert os.listdir(tmp_path) == ["full.trace"]            # no copy left beside it


def test_generate_whose_compaction_fails_exits_0_with_the_stored_trace(tmp_path, monkeypatch, capsys):
    from tracengine.cli import main
    monkeypatch.setattr(trace_writer.os, "fsync", fsync_fails)
    path = tmp_path / "run.trace"
    assert main(["generate", "--quiet", "--prompt-lens", "25,8,6", "--max-tokens", "3", "--temperature", "0",
                 "--record", str(path)]) == 0
    err = capsys.readouterr().err
    assert "tracengine: warning:" in err and "error" not in err
    monkeypatch.undo()
    assert_whole(path, deflated=False)
    assert main(["check", str(path)]) == 0


def test_a_follower_reads_the_old_file_to_its_end_frame_across_the_compaction(tmp_path):
    path = tmp_path / "live.trace"
    writer = TraceWriter(path, make_header(every_event_type_config()))
    engine = every_event_type(writer)
    follower = open_trace(path, follow=True, poll_interval=0.001)   # no stop: only the end frame ends it
    followed = [next(follower)]
    while not (type(followed[-1]) is StepEnd and followed[-1].step == engine.num_steps - 1):
        followed.append(next(follower))                   # every finished step, as written (stored)
    before = os.stat(path).st_ino
    writer.close()                                        # the end frame, then the compacted copy renamed over
    assert os.stat(path).st_ino != before
    followed += list(follower)                            # the old file's end frame: the follower returns
    assert followed == list(open_trace(path))
    assert all(word & DEFLATED for word, _ in frames(path))


CHILD = """
import sys, time
from tracengine.testing import every_event_type, every_event_type_config
from tracengine.trace import writer as trace_writer
from tracengine.trace.tracelog import TraceWriter, make_header

def slow(deflater, payload, _deflate=trace_writer.deflate_frame):
    print("compacting", flush=True)
    time.sleep(60)                     # killed here, its copy begun
    return _deflate(deflater, payload)

writer = TraceWriter(sys.argv[1], make_header(every_event_type_config()))
every_event_type(writer)
trace_writer.deflate_frame = slow
writer.close()
"""


def test_a_compaction_killed_leaves_the_stored_trace_and_the_next_one_clears_its_copy(tmp_path):
    path = tmp_path / "killed.trace"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert child.stdout.readline() == "compacting\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    temp = Path(compaction_temp(path))
    assert temp.exists()                                  # the killed copy, never read as the trace
    assert_whole(path, deflated=False)
    events = list(open_trace(path))
    compact(path)                                         # over the killed copy's name
    assert not temp.exists()
    assert_whole(path, events, deflated=True)

    temp.write_bytes(b"TRCE")                             # a killed copy again: a writer of the path clears it
    write_trace(path, events)
    assert not temp.exists()
    assert_whole(path, deflated=True)

"""The server's trace writer: frames written on a thread while the next step runs, the same
bytes as TraceWriter's, and a killed process loses at most its last finished step."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tracengine.engine.sampling_params import SamplingParams
from tracengine.replay.reexec import reexecute
from tracengine.testing import every_event_type, every_event_type_config
from tracengine.trace.events import without_wall_clock
from tracengine.trace.tracelog import TraceReader, TraceWriter, make_header, open_trace
from tracengine.trace.writer_thread import ThreadedTraceWriter

REPO = Path(__file__).resolve().parents[1]


def test_threaded_frames_hold_what_the_step_writer_writes(tmp_path):
    header = make_header(every_event_type_config())
    with TraceWriter(tmp_path / "step.trace", header) as writer:
        every_event_type(writer)
    with ThreadedTraceWriter(tmp_path / "thread.trace", header) as writer:
        engine = every_event_type(writer)
        engine.add_request(list(range(80, 84)), SamplingParams(max_tokens=4))   # after the last step: kept by close
    with TraceReader(tmp_path / "step.trace") as step, TraceReader(tmp_path / "thread.trace") as thread:
        assert thread.ended and thread.corruption is None and thread.torn_tail is None
        assert thread.num_frames == step.num_frames + 1            # the last: the request after the last step
        for i in range(step.num_frames):                           # frame for frame, but for the clock
            assert [without_wall_clock(e) for e in thread.read_frame(i)] == \
                [without_wall_clock(e) for e in step.read_frame(i)]
    assert reexecute(open_trace(tmp_path / "thread.trace")).ok


def test_a_failed_write_is_raised_in_the_step_loop(tmp_path):
    class Failing(ThreadedTraceWriter):
        def _write_frame(self, events):
            if len(events) > 1:
                raise OSError(28, "No space left on device")
            super()._write_frame(events)

    writer = Failing(tmp_path / "full.trace", make_header(every_event_type_config()))
    with pytest.raises(OSError, match="No space left"):
        every_event_type(writer)          # the failure of step 0's frame surfaces at a later StepEnd
    with pytest.raises(OSError, match="No space left"):
        writer.close()
    assert writer._file.closed


CHILD = """
import sys, time
from tracengine.engine.llm_engine import LLMEngine
from tracengine.engine.sampling_params import SamplingParams
from tracengine.replay.runners import SyntheticRunner
from tracengine.testing import every_event_type_config
from tracengine.trace.tracelog import make_header
from tracengine.trace.writer_thread import ThreadedTraceWriter

class SlowDisk(ThreadedTraceWriter):
    # each frame takes 20 ms to write, far longer than a step: a writer that let frames
    # queue up would be many steps behind when the process is killed
    def _write_frame(self, events):
        time.sleep(0.02)
        super()._write_frame(events)

config = every_event_type_config().replace(num_kvcache_blocks=512, max_model_len=1024)
writer = SlowDisk(sys.argv[1], make_header(config))
engine = LLMEngine(config, SyntheticRunner(eos=config.eos), writer)
for i in range(4):
    engine.add_request(list(range(100 * i + 1, 100 * i + 9)), SamplingParams(max_tokens=400, ignore_eos=True))
while True:
    engine.step()
    print(engine.num_steps, flush=True)    # steps 0 .. num_steps - 1 have finished
"""


def test_a_killed_process_loses_at_most_its_last_finished_step(tmp_path):
    path = tmp_path / "killed.trace"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    num_finished = 0
    try:
        for line in proc.stdout:
            num_finished = int(line)
            if num_finished == 30:
                break
        assert num_finished == 30, "the child stopped early"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    with TraceReader(path) as reader:
        assert not reader.ended and reader.corruption is None
        num_steps = reader.num_frames - 1
    # 30 steps had finished when the kill was sent; the child may have run on a little
    assert num_steps >= 30 - 1
    assert reexecute(open_trace(path)).ok

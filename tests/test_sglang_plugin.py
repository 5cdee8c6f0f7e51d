"""tracengine's SGLang plugin loaded by SGLang's own mechanism: `sglang.srt.plugins.load_plugins`
finds the entry point `tracengine` in the group `sglang.srt.plugins` (pyproject.toml), runs its
`register`, and applies the hooks it registered; with TRACENGINE_RECORD set, the Scheduler built
next records to that path from the end of its construction, and the trace replays exactly
(skipped where SGLang is not installed)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracengine.trace.events import RequestAdded, StepEnd
from tracengine.trace.sglang_events import PolicyOrder

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed")
REPO = Path(__file__).resolve().parents[1]

# A process as SGLang's scheduler process starts: the plugins loaded first, then the Scheduler built
# (here by the CPU driver's build_scheduler, which records nothing itself) and run.
SCHEDULER_PROCESS = """
from sglang.srt.plugins import load_plugins
load_plugins()
from tracengine.sglang.build import build_scheduler, default_config
from tracengine.sglang.drive import RequestSpec, Tokens, run
from tracengine.sglang.recorder import stop_recording
specs = [RequestSpec(f"r{i}", [7] * 40 + [i] * (5 + i), 4 + i, arrival_step=i // 2) for i in range(6)]
scheduler = build_scheduler(default_config(max_total_tokens=400, chunked_prefill_size=32,
                                           schedule_policy="lpm"), Tokens(specs))
assert scheduler.tracengine is not None, "the plugin did not start recording"
run(scheduler, specs)
stop_recording(scheduler)
"""


def test_sglangs_load_plugins_starts_recording_and_the_trace_replays(tmp_path):
    from importlib.metadata import entry_points

    from tracengine.sglang.replay import reexecute
    from tracengine.trace.tracelog import open_trace
    assert [ep.value for ep in entry_points(group="sglang.srt.plugins") if ep.name == "tracengine"] == \
        ["tracengine.sglang.plugin:register"]
    path = tmp_path / "plugin.trace"
    env = {**os.environ, "TRACENGINE_RECORD": str(path), "SGLANG_PLUGINS": "tracengine",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", SCHEDULER_PROCESS], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    events = list(open_trace(path))
    assert events[0].engine == "sglang" and events[0].config["schedule_policy"] == "lpm"
    assert sum(type(e) is RequestAdded for e in events) == 6 and any(type(e) is PolicyOrder for e in events)
    result = reexecute(events)
    assert result.ok and result.num_steps == sum(type(e) is StepEnd for e in events)

"""What each command that reads a trace runs, by the backend the trace's header names
(trace/header.backend_of, the one place that reads it): tracengine's engine, vLLM's scheduler,
or a fleet of engines. A command asks the trace for its commands and calls them; it never asks
what kind of trace it holds. A backend brings only what is its own: vLLM's scheduler differs
from tracengine's engine in `replay` alone (it re-executes through vLLM), a fleet in each."""
import os
from dataclasses import dataclass, replace
from typing import Callable

from tracengine.cli import engine_commands as engine
from tracengine.cli import fleet_commands as fleet
from tracengine.cli.replay_runs import replay_engine_trace, replay_fleet_trace
from tracengine.cli.sglang_backend import run_replay as replay_sglang_trace
from tracengine.cli.vllm_backend import run_replay as replay_vllm_trace
from tracengine.sglang.check import SglangEventCheck as sglang_event_check
from tracengine.trace.header import ENGINE, FLEET, SGLANG, VLLM, backend_of
from tracengine.trace.tracelog import TraceReader


@dataclass(frozen=True)
class TraceCommands:
    replay: Callable        # (args) -> exit code: re-execution, --state, what-ifs, sweeps
    stats: Callable         # (path, slo, as_json) -> exit code
    step_tables: Callable   # (reader, steps, seq) -> the step tables `render` prints
    export: Callable        # (path, out) -> exit code
    tui: Callable           # (path, follow) -> exit code
    event_check: Callable   # (header) -> the frame-by-frame checker `check` runs
    diff: Callable          # (args, reader_a, reader_b) -> exit code


ENGINE_COMMANDS = TraceCommands(replay_engine_trace, engine.stats_command, engine.step_tables,
                                engine.export_command, engine.tui_command, engine.event_check, engine.diff_command)
BACKENDS = {
    ENGINE: ENGINE_COMMANDS,
    VLLM: replace(ENGINE_COMMANDS, replay=replay_vllm_trace),
    SGLANG: replace(ENGINE_COMMANDS, replay=replay_sglang_trace, event_check=sglang_event_check),
    FLEET: TraceCommands(replay_fleet_trace, fleet.fleet_stats_command, fleet.fleet_step_tables,
                         fleet.fleet_export_command, fleet.fleet_tui_command, fleet.fleet_event_check,
                         fleet.fleet_diff_of_readers),
}


def commands_of(header) -> TraceCommands:
    return BACKENDS[backend_of(header)]


def commands_for_trace(path) -> TraceCommands:
    """The commands of the trace at `path`; a missing or empty file gets the engine's, whose own
    reading says what is wrong, in the command's words."""
    if not (os.path.isfile(path) and os.path.getsize(path)):
        return ENGINE_COMMANDS
    with TraceReader(path) as reader:
        return commands_of(reader.header)


def diff_commands(header_a, header_b) -> TraceCommands:
    """Two traces are compared as a fleet's when either is one (a fleet of one against one
    engine reads as its replica 0), else as one engine's."""
    backends = {backend_of(header_a), backend_of(header_b)}
    return BACKENDS[FLEET] if FLEET in backends else ENGINE_COMMANDS

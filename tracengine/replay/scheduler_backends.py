"""Another engine's own scheduler (vLLM's, SGLang's) as the verbs reach it: one record a backend
(`SchedulerBackend`: the module paths of what it brings) and, written once over that record, the
makers of its sweeps' variants (sim/spec.py names a maker in a SweepSpec, so a worker, local or
Ray, makes the same variant object from the same source: `module:VLLM.timed_runner`), what
prepares a sweep of a trace's what-ifs, and the check of the installed engine's version. A third
backend is one more record here. The paths are imported only when used: replay/ sits below the
backends' folders (docs/architecture.md), as sim/spec.py names fleet/'s maker."""
from dataclasses import dataclass

from tracengine.engine.user_classes import resolve
from tracengine.errors import TraceVersionError
from tracengine.sim.spec import PreparedSources, Source, SweepSpec, step_time_of


def check_engine_version(engine: str, require, recorded: str) -> str:
    """The installed `engine`'s version (`require(needed_by, version)`: the package's require_vllm
    or require_sglang, which raises where it is not installed), which must be the `recorded` one:
    its scheduler's decisions are that version's."""
    version = require(f"the trace was recorded with {engine} {recorded}", recorded)
    if version != recorded:
        raise TraceVersionError(f"the trace was recorded with {engine} {recorded}; the installed {engine} is "
                                f"{version} (a replay needs the recorded version)")
    return version


@dataclass(frozen=True)
class SchedulerBackend:
    """One engine's scheduler, each piece by its `module:name` path."""
    label: str           # the name of this record in this module (its makers' paths)
    name: str            # the engine as messages name it
    a_trace: str         # and one of its traces
    timed: str           # its replay/timed.TimedWorkload of a trace: (events, step_time, trace_name)
    steps: str           # its what-if at recorded steps, replay/timed.StepVariant's replay: (events)
    simulation: str      # its engine in simulated time, sim/sweep.SimulateVariant's
    check_version: str   # (header) -> the installed version, which must be the recorded one
    reexecute: str       # (events, config=None) -> ReplayResult: re-execution through its scheduler
    whatif: str          # (events, overrides) -> WhatIfResult: the what-if at recorded steps
    timed_whatif: str    # (events, overrides, step_time, trace_name): the what-if in simulated time

    @classmethod
    def of(cls, package: str, prefix: str, name: str, a_trace: str) -> "SchedulerBackend":
        """The record of a backend laid out as tracengine/vllm/ is: `tracengine.<package>`'s
        modules, its classes' names starting with `prefix`, the record named `package` upper-cased."""
        p = f"tracengine.{package}"
        return cls(package.upper(), name, a_trace, timed=f"{p}.timed:{prefix}TimedReplay",
                   steps=f"{p}.whatif:{prefix}StepReplay", simulation=f"{p}.simulate:{prefix}Simulation",
                   check_version=f"{p}.replay:check_{package}_version", reexecute=f"{p}.replay:reexecute",
                   whatif=f"{p}.whatif:whatif", timed_whatif=f"{p}.timed:timed_whatif")

    @property
    def TIMED(self) -> str:
        return f"{__name__}:{self.label}.timed_runner"

    @property
    def STEPS(self) -> str:
        return f"{__name__}:{self.label}.step_runner"

    @property
    def SIMULATE(self) -> str:
        return f"{__name__}:{self.label}.simulate_runner"

    def timed_runner(self, spec: SweepSpec, events: list):
        """replay/timed.TimedVariant over this scheduler."""
        from tracengine.replay.timed import TimedVariant
        return TimedVariant(resolve(self.timed)(events, step_time_of(spec.step_time)), spec.base, spec.slo)

    def step_runner(self, spec: SweepSpec, events: list):
        """replay/timed.StepVariant over this scheduler."""
        from tracengine.replay.timed import StepVariant
        return StepVariant(resolve(self.steps)(events), spec.base)

    def simulate_runner(self, spec: SweepSpec, requests):
        """`simulate --scheduler NAME`'s variants."""
        from tracengine.sim.sweep import SimulateVariant
        return SimulateVariant(requests, spec.base, step_time_of(spec.step_time), spec.slo, resolve(self.simulation))

    def prepare_timed(self, prepared: PreparedSources, source: Source, events: list, step_time, trace_name: str,
                      base: dict, slo, policy=None):
        """As replay/sweeps.prepare_timed (`policy` is tracengine's: this scheduler's trace has none). The
        caller checked the trace's engine version (cli/scheduler_backend.run_scheduler_replay)."""
        from tracengine.replay.timed import prepare_timed_sweep
        return prepare_timed_sweep(prepared, source, events, resolve(self.timed)(events, step_time, trace_name),
                                   self.TIMED, base, slo)

    def prepare_steps(self, prepared: PreparedSources, source: Source, events: list, base: dict,
                      policy=None) -> SweepSpec:
        """As replay/sweeps.prepare_steps."""
        prepared.add(source, events)
        return SweepSpec(self.STEPS, source.digest, base, None)


VLLM = SchedulerBackend.of("vllm", "Vllm", "vLLM", "a vLLM trace")
SGLANG = SchedulerBackend.of("sglang", "Sglang", "SGLang", "an SGLang trace")

"""The what-if in simulated time (`replay --set` on a trace with arrival times): the
recorded workload at its recorded arrival times through the simulated engine, under the
recorded config (the self-check: how far the step-time model is from the recording) and
under the new one; and the sweep variants of a trace, timed and step-exact."""
import time
from dataclasses import dataclass

import msgspec

from tracengine.engine.config import Config
from tracengine.errors import TraceError
from tracengine.replay.whatif import OutputRunner, changed_fields, extract_workload, requests_under, whatif_in_steps
from tracengine.sim.engine import run_timed, with_kv_bytes
from tracengine.sim.runners import check_requests
from tracengine.sim.spec import PreparedSources, Source, SweepSpec, step_time_of
from tracengine.sim.steptime import calibrate
from tracengine.sim.sweep import IN_STEPS, IN_TIME, row_of, step_row_of
from tracengine.trace.events import RequestAdded, StepEnd


def calibrated_step_time(events: list, trace_name: str,
                         instead: str = "--step-time or --roofline, or --arrivals steps"):
    """The step-time model fitted to a trace's own steps, for a what-if given no model; when it
    cannot be fitted, the error names what to give `instead`."""
    try:
        return calibrate(events, trace_name)
    except TraceError as exc:
        raise TraceError(f"{exc}: give {instead}") from None


@dataclass
class TimedWhatIf:
    step_time: object            # the model the runs were timed with
    recorded: list               # the recorded events
    self_check: list | None      # the recorded config in simulated time (None: not run, checks_itself)
    new: list                    # the what-if in simulated time
    changes: list[tuple[str, object, object]]
    num_past_output: int


def has_arrivals(events) -> bool:
    """Whether every request of the trace has a recorded arrival time (format 2 and later)."""
    seen = False
    for e in events:
        if type(e) is RequestAdded:
            if e.arrival_ns < 0:
                return False
            seen = True
    return seen


class TimedWorkload:
    """What every backend's workload ready to run in simulated time shares (TimedReplay's, vLLM's,
    SGLang's, a fleet's): the step-time model, fitted to the trace's own steps unless given one, and the
    policy the recorded config runs under (None: the backend's own scheduler decides), and whether
    its what-if runs the recorded config beside the new one (the self-check, `checks_itself`)."""
    events: list
    step_time: object
    trace_name: str
    checks_itself = True

    def ensure_step_time(self):
        if self.step_time is None:
            self.step_time = calibrated_step_time(self.events, self.trace_name)
        return self.step_time

    def recorded_policy(self, policy):
        return None

    def row(self, events: list, slo: dict | None) -> dict:
        """A sweep's row of a run's events: its figures in simulated time."""
        from tracengine.analysis.stats import stats
        return row_of(stats(events, slo))


class TimedReplay(TimedWorkload):
    """A trace's workload ready to run in simulated time under any config: `run(overrides)`
    gives the events of one run. Calibrates on the trace itself unless given a model."""

    def __init__(self, events, step_time=None, trace_name: str = ""):
        self.events = events = list(events)
        self.workload = workload = extract_workload(events)
        if any(r.arrival_ns < 0 for r in workload.requests):
            raise TraceError("the trace has no arrival times (format 1, or recorded without them); "
                             "use --arrivals steps")
        self.recorded = Config.from_dict(workload.header.config)
        self.step_time = step_time
        self.trace_name = trace_name
        # Where the recorded step 0 started: what came before it was the engine's start-up
        # (tokenizing and adding the requests), not scheduling, so no simulated run starts
        # earlier, and every request that arrived during the start-up meets step 0 as recorded.
        self.first_step_ns = next((e.gap_ns for e in events if type(e) is StepEnd), 0)

    def config(self, overrides: dict) -> Config:
        """The config of a variant; a request that could never run under it is refused here."""
        from tracengine.engine.scheduler import Scheduler
        config = self.recorded.replace(**overrides)
        check_requests(Scheduler(config), requests_under(self.workload, config))
        return config

    def recorded_policy(self, policy):
        """The policy the recorded config runs under: replay --policy when the recorded one is a
        user's own (never imported on its own), else the recorded built-in."""
        from tracengine.engine.config import BUILTIN_POLICY_NAMES
        return None if self.recorded.scheduling_policy in BUILTIN_POLICY_NAMES else policy

    def changes(self, config: Config) -> list[tuple[str, object, object]]:
        return changed_fields(self.recorded, config)

    def run(self, config: Config, policy=None) -> tuple[list, int]:
        """The events of the workload under `config` in simulated time (header first), and how
        many sequences ran past their recorded output."""
        step_time = self.ensure_step_time()
        config = with_kv_bytes(config, step_time)
        if policy is not None:      # the header names the policy that runs
            from tracengine.engine.policies import block_rules, policy_path, scheduler_class
            cls = scheduler_class(config, policy)
            config = config.replace(scheduling_policy=policy if isinstance(policy, str) else policy_path(policy))
            config = config.replace(block_rules=block_rules(cls, config))    # and the block rules it runs
        header = msgspec.structs.replace(self.workload.header, config=config.to_dict(),
                                         device=f"simulated ({step_time.kind})", created_at=time.time())
        runner = OutputRunner(self.workload.outputs, self.workload.middle, 0 if config.eos != 0 else 1)
        events = run_timed(config, requests_under(self.workload, config), step_time, runner, header=header,
                           policy=policy, first_step_ns=self.first_step_ns)
        return events, len(runner.past_output_seq_ids)


def whatif_in_time(timed, overrides: dict, policy=None) -> TimedWhatIf:
    """The what-if in simulated time of any engine's trace, `timed` being its workload ready to
    run (TimedReplay; vllm/timed.VllmTimedReplay, sglang/timed.SglangTimedReplay,
    fleet/whatif.FleetTimedReplay): the recorded config in simulated time (the self-check: how
    far the step-time model is from the recording; none where the workload does not check
    itself and `overrides` change something) and the one with `overrides`. `policy` (replay
    --policy): the recorded policy when it is a user's own, and the new run's unless
    `overrides` names one (as whatif's)."""
    config = timed.config(overrides)     # before calibrating: say the plainer problem first
    self_check = None
    if timed.checks_itself or not overrides:
        self_check, num_past_output = timed.run(timed.recorded, timed.recorded_policy(policy))
    new = self_check
    if overrides:
        new, num_past_output = timed.run(config, overrides.get("scheduling_policy", policy))
    return TimedWhatIf(timed.step_time, timed.events, self_check, new, timed.changes(config), num_past_output)


def timed_whatif(events, overrides: dict, step_time=None, trace_name: str = "", policy=None) -> TimedWhatIf:
    """whatif_in_time of tracengine's engine: the workload of `events` at its recorded arrival
    times; `step_time` defaults to a model calibrated on the trace itself."""
    return whatif_in_time(TimedReplay(events, step_time, trace_name), overrides, policy)


def _variant_policy(overrides: dict, policy):
    """replay --policy, unless the variant names its own scheduling_policy (a swept one wins)."""
    return overrides.get("scheduling_policy", policy)


class TimedVariant:
    """A what-if in simulated time under base + overrides, of any engine's trace (`timed`: as
    whatif_in_time's, a fleet's included), its row the workload's (TimedWorkload.row).
    `policy`: replay --policy (a trace of one's own policy needs it)."""
    figures = IN_TIME

    def __init__(self, timed, base: dict, slo: dict | None = None, policy=None):
        self.timed, self.base, self.slo, self.policy = timed, base, slo, policy
        timed.ensure_step_time()      # fitted once, before the workers fork

    def check(self, overrides: dict):
        self.timed.config({**self.base, **overrides})

    def __call__(self, overrides: dict) -> dict:
        merged = {**self.base, **overrides}
        events, _ = self.timed.run(self.timed.config(merged), _variant_policy(merged, self.policy))
        return self.timed.row(events, self.slo)


def prepare_timed_sweep(prepared: PreparedSources, source: Source, events: list, timed, runner: str, base: dict,
                        slo, policy=None, **spec_fields) -> tuple[SweepSpec, object]:
    """(spec, step-time model) of a sweep of what-ifs in simulated time of `timed` (as
    whatif_in_time's; `runner`: the maker of its variants in a worker), its variant object made
    here once: the model fitted on the trace unless given, and shipped as data (to_dict), which
    every process, this one too, runs with."""
    model = timed.ensure_step_time()
    spec = SweepSpec(runner, source.digest, base, model.to_dict(), slo, policy, **spec_fields)
    timed.step_time = step_time_of(spec.step_time)
    prepared.add(source, events)
    prepared.add_runner(spec, TimedVariant(timed, base, slo, policy))
    return spec, timed.step_time


class StepVariant:
    """A what-if at recorded steps (replay/whatif.whatif_in_steps) under base + overrides, of any
    engine's trace (`replay`: its StepReplay, VllmStepReplay or SglangStepReplay), its figures
    in steps (IN_STEPS); `policy`: as TimedVariant's."""
    figures = IN_STEPS

    def __init__(self, replay, base: dict, policy=None):
        self.replay, self.base, self.policy = replay, base, policy

    def check(self, overrides: dict):
        self.replay.check({**self.base, **overrides})

    def __call__(self, overrides: dict) -> dict:
        merged = {**self.base, **overrides}
        return step_row_of(whatif_in_steps(self.replay, merged, _variant_policy(merged, self.policy)).new)

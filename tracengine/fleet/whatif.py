"""What-if of a fleet (docs/cluster.md): a trace's workload (a fleet's, or one engine's with
arrival times) through another fleet in simulated time: other replicas, routers, transfers or
replica config. Each request arrives when it reached the recorded fleet's router (or the
recorded engine), with its recorded output tokens (OutputRunner; a decode replica's count
from the second, as its prompt holds the first)."""
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import msgspec

from tracengine.fleet.stats import fleet_stats, replica_streams
from tracengine.engine.config import Config
from tracengine.errors import TraceError
from tracengine.replay.timed import TimedVariant, TimedWorkload, prepare_timed_sweep, whatif_in_time
from tracengine.replay.whatif import OutputRunner, changed_fields, extract_workload
from tracengine.fleet.engine import fleet_header, simulate_fleet
from tracengine.fleet.spec import FleetSpec, header_fields
from tracengine.engine.request import Request
from tracengine.sim.spec import PreparedSources, Source, SweepSpec, step_time_of
from tracengine.trace.events import KVTransfer, ReplicaScope, RouteDecision, SeqAbort, StepEnd


@dataclass
class FleetWhatIf:
    step_time: object
    recorded: dict          # fleet_stats of the trace
    new: dict               # fleet_stats of the what-if
    events: list            # the what-if's trace, header first
    changes: list[tuple[str, object, object]]
    num_past_output: int    # sequences that ran past their recorded output


def fleet_workload(events) -> tuple[list[Request], dict[int, list[int]], dict]:
    """(requests as they reached the fleet, kept output tokens by seq_id, middle-chunk samples)
    of a fleet trace or of one engine's."""
    header = events[0]
    if not header.fleet:
        workload = extract_workload(events)
        if any(r.arrival_ns < 0 for r in workload.requests):
            raise TraceError("the trace has no arrival times (format 1, or recorded without them): a fleet "
                             "what-if runs in time")
        return workload.requests, workload.outputs, workload.middle
    _, streams = replica_streams(events)
    arrivals = {e.seq_id: e.arrival_ns for e in events if type(e) is RouteDecision and e.pool != "decode"}
    left_idle = _left_idle(events)
    requests: dict[int, Request] = {}
    outputs: dict[int, list[int]] = {}
    middle: dict = {}
    for replica, stream in streams.items():
        workload = extract_workload(stream)
        for r in workload.requests:
            if left_idle.get(r.seq_id) == replica:
                # its client left at a step its replica then had nothing to take: after the step before
                end_ns = workload.timeline.end_ns(r.abort_step - 1) if r.abort_step > 0 else r.arrival_ns
                r.abort_ns = max(r.arrival_ns, end_ns)
            seen = requests.get(r.seq_id)
            if seen is None:
                requests[r.seq_id] = r
                outputs[r.seq_id] = list(workload.outputs[r.seq_id])
                continue
            if len(r.prompt) > len(seen.prompt):   # the decode side's: prompt and first token
                prefill, decode = seen, r
                outputs[r.seq_id] += workload.outputs[r.seq_id]
            else:                                                      # the prefill side's, met second
                prefill, decode = r, seen
                requests[r.seq_id] = r
                outputs[r.seq_id] = workload.outputs[r.seq_id] + outputs[r.seq_id]
            prefill.max_tokens = decode.max_tokens + 1
            if decode.abort_ns >= 0:     # its client left on the decode side
                prefill.abort_ns, prefill.abort_step, prefill.abort_reason = \
                    decode.abort_ns, decode.abort_step, decode.abort_reason
        middle.update(workload.middle)
    for r in requests.values():
        r.arrival_ns = arrivals.get(r.seq_id, r.arrival_ns)
    return [requests[k] for k in sorted(requests)], outputs, middle


def _left_idle(events) -> dict[int, int]:
    """seq_id -> replica of each SeqAbort among a replica's events that end without a step: the
    departures left it nothing to take (the time of that step's start, which the recording
    never took, comes after the replica's step before; Fleet.step)."""
    left, replica, segment = {}, None, []

    def close():
        if segment and type(segment[-1]) is not StepEnd:
            left.update((e.seq_id, replica) for e in segment if type(e) is SeqAbort)

    for e in events[1:]:
        t = type(e)
        if t is ReplicaScope or t is RouteDecision or t is KVTransfer:
            close()
            replica, segment = (e.replica if t is ReplicaScope else None), []
        else:
            segment.append(e)
    close()
    return left


class FleetConfig(NamedTuple):
    """What a fleet what-if's run changes: every replica's config, and the fleet (its replicas'
    and pools' own fields in spec.replica_config)."""
    config: Config
    spec: FleetSpec


class FleetTimedReplay(TimedWorkload):
    """A trace's workload (a fleet's, or one engine's) ready to run through a fleet in simulated
    time (replay/timed.whatif_in_time's, as TimedReplay's): its config names every replica's
    config fields, a pool's or a replica's, and the fleet's own (fleet/overrides.py), over the
    recorded config and `spec` (the recorded fleet unless given; one replica for one engine's
    trace). `policy` (replay --policy) is every replica's unless the overrides name one.
    Calibrates on the trace (its replica 0) unless given a model."""
    # The what-if's table sets the recording's figures beside the new run's: the recorded
    # config is run only when nothing changes (then it is the what-if).
    checks_itself = False

    def __init__(self, events, step_time=None, trace_name: str = "", spec: FleetSpec | None = None, policy=None):
        self.events = events = list(events)
        self.header = header = events[0]
        self.requests, self.outputs, self.middle = fleet_workload(events)
        self.recorded_config = Config.from_dict(header.config)
        self.recorded_spec = FleetSpec.from_dict(header.fleet) if header.fleet else FleetSpec()
        self.spec = spec if spec is not None else self.recorded_spec
        self.policy = policy
        self.step_time = step_time
        self.trace_name = trace_name
        # a recorded engine's start-up came before its step 0: no run starts earlier (TimedReplay's rule)
        self.first_step_ns = 0 if header.fleet else next((e.gap_ns for e in events if type(e) is StepEnd), 0)

    def ensure_step_time(self):
        if self.step_time is None:
            from tracengine.replay.timed import calibrated_step_time
            self.step_time = calibrated_step_time(replica_streams(self.events)[1][0], self.trace_name,
                                                  "--step-time or --roofline")
        return self.step_time

    @cached_property
    def recorded(self) -> FleetConfig:
        """The recorded config through the fleet `spec`: the run when nothing changes."""
        return self.config({})

    def config(self, overrides: dict) -> FleetConfig:
        """The config and fleet of a variant; a request a replica could never run is refused here."""
        from tracengine.fleet.engine import check_fleet_requests
        from tracengine.fleet.overrides import resolve
        fields, spec = resolve(self.spec, overrides, self.step_time)
        if "kv_bytes_per_token" in overrides:     # the config's too (a CPU tier's), as its flag is
            fields = {**fields, "kv_bytes_per_token": overrides["kv_bytes_per_token"]}
        config = self.recorded_config.replace(**fields)
        if self.policy is not None and "scheduling_policy" not in fields:
            config = config.replace(scheduling_policy=self.policy)
        check_fleet_requests(config, spec, self.requests)
        return FleetConfig(config, spec)

    def changes(self, config: FleetConfig) -> list[tuple[str, object, object]]:
        """The config's changed fields, then the fleet's as the headers name them (each pool's
        router resolved; one engine's trace: one replica)."""
        from tracengine.fleet.routers import router_classes
        changes = changed_fields(self.recorded_config, config.config)
        before = self.header.fleet or {"num_replicas": 1}
        after = header_fields(config.spec, router_classes(config.spec)) or {"num_replicas": 1}
        return changes + [(f"fleet {name}", before.get(name), after.get(name))
                          for name in dict.fromkeys([*before, *after]) if before.get(name) != after.get(name)]

    def run(self, config: FleetConfig, policy=None) -> tuple[list, int]:
        """The events of the workload through the fleet (header first), and how many sequences
        ran past their recorded output. `policy`: the config's already (config())."""
        step_time = self.ensure_step_time()
        config, spec = config
        filler = 0 if config.eos != 0 else 1
        shifted = {seq_id: out[1:] for seq_id, out in self.outputs.items()}
        runners = []

        def make_runner(index: int):
            decode = spec.disaggregated and index >= spec.num_prefill_replicas
            runners.append(OutputRunner(shifted if decode else self.outputs, self.middle, filler))
            return runners[-1]

        new = simulate_fleet(config, self.requests, step_time, spec, make_runner=make_runner,
                             first_step_ns=self.first_step_ns)
        new[0] = msgspec.structs.replace(fleet_header(config, step_time, spec), model=self.header.model)
        return new, len(set().union(*(r.past_output_seq_ids for r in runners)))

    def row(self, events: list, slo: dict | None) -> dict:
        """A sweep's row of a run: the fleet's figures (fleet/sweep.fleet_row_of)."""
        from tracengine.fleet.sweep import fleet_row_of
        return fleet_row_of(fleet_stats(events, slo))


def fleet_whatif(events, spec: FleetSpec | None, overrides: dict, step_time=None, trace_name: str = "",
                 policy=None) -> FleetWhatIf:
    """replay/timed.whatif_in_time of `events`' workload through the fleet `spec` (the recorded
    one if None) with `overrides` (FleetTimedReplay's names); `step_time` defaults to a model
    calibrated on the trace (its replica 0)."""
    timed = FleetTimedReplay(events, step_time, trace_name, spec, policy)
    result = whatif_in_time(timed, overrides)
    return FleetWhatIf(result.step_time, fleet_stats(timed.events), fleet_stats(result.new), result.new,
                       result.changes, result.num_past_output)


def fleet_trace_runner(spec: SweepSpec, events: list):
    """The maker of a fleet what-if's variants (`replay TRACE --sweep ...` of a fleet): the
    fleet the variants change travels in the spec as data (spec.fleet)."""
    timed = FleetTimedReplay(events, step_time_of(spec.step_time), spec=FleetSpec.from_dict(spec.fleet),
                             policy=spec.policy)
    return TimedVariant(timed, spec.base, spec.slo)


FLEET_TRACE = f"{__name__}:fleet_trace_runner"


def prepare_fleet(prepared: PreparedSources, source: Source, events: list, step_time, trace_name: str, base: dict,
                  slo, policy):
    """(spec, step-time model) of a sweep of fleet what-ifs of a trace (a fleet's, or one engine's
    through a fleet), as prepare_timed's: the model fitted on the trace (its replica 0) unless
    given; the fleet every variant starts from, the recorded one (one replica for one engine's)."""
    timed = FleetTimedReplay(events, step_time, trace_name, policy=policy)
    return prepare_timed_sweep(prepared, source, events, timed, FLEET_TRACE, base, slo, policy,
                               fleet=timed.recorded_spec.to_dict())

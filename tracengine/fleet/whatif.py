"""What-if of a fleet (docs/cluster.md): a trace's workload (a fleet's, or one engine's with
arrival times) through another fleet in simulated time: other replicas, routers, transfers or
replica config. Each request arrives when it reached the recorded fleet's router (or the
recorded engine), with its recorded output tokens (OutputRunner; a decode replica's count
from the second, as its prompt holds the first)."""
from dataclasses import dataclass

import msgspec

from tracengine.fleet.stats import fleet_stats, replica_streams
from tracengine.engine.config import Config
from tracengine.errors import TraceError
from tracengine.replay.whatif import OutputRunner, changed_fields, extract_workload
from tracengine.fleet.engine import fleet_header, simulate_fleet
from tracengine.fleet.spec import FleetSpec
from tracengine.engine.request import Request
from tracengine.sim.spec import PreparedSources, Source, SweepSpec, step_time_of
from tracengine.sim.sweep import IN_TIME
from tracengine.trace.events import KVTransfer, ReplicaScope, RouteDecision, SeqAbort, StepEnd


@dataclass
class FleetWhatIf:
    step_time: object
    spec: FleetSpec
    recorded: dict          # fleet_stats of the trace
    new: dict               # fleet_stats of the what-if
    events: list            # the what-if's trace, header first
    changes: list[tuple[str, object, object]]


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


class FleetReplay:
    """A trace's workload ready to run through any fleet in simulated time (TimedReplay's, for
    fleets): `run(config, spec)` gives the events of one run. Calibrates on the trace (its
    replica 0) unless given a model."""

    def __init__(self, events, step_time=None, trace_name: str = ""):
        self.events = events = list(events)
        self.header = header = events[0]
        self.requests, self.outputs, self.middle = fleet_workload(events)
        self.recorded = Config.from_dict(header.config)
        self.recorded_spec = FleetSpec.from_dict(header.fleet) if header.fleet else FleetSpec()
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

    def config(self, overrides: dict, policy=None) -> Config:
        """The recorded config with `overrides`; `policy` (replay --policy) unless they name one."""
        config = self.recorded.replace(**overrides)
        if policy is not None and "scheduling_policy" not in overrides:
            config = config.replace(scheduling_policy=policy)
        return config

    def run(self, config: Config, spec: FleetSpec) -> list:
        step_time = self.ensure_step_time()
        filler = 0 if config.eos != 0 else 1
        shifted = {seq_id: out[1:] for seq_id, out in self.outputs.items()}

        def make_runner(index: int):
            decode = spec.disaggregated and index >= spec.num_prefill_replicas
            return OutputRunner(shifted if decode else self.outputs, self.middle, filler)

        new = simulate_fleet(config, self.requests, step_time, spec, make_runner=make_runner,
                             first_step_ns=self.first_step_ns)
        new[0] = msgspec.structs.replace(fleet_header(config, step_time, spec), model=self.header.model)
        return new


def fleet_whatif(events, spec: FleetSpec, overrides: dict, step_time=None, trace_name: str = "",
                 policy=None) -> FleetWhatIf:
    """`events`' workload through the fleet `spec` with the recorded config changed by `overrides`;
    `step_time` defaults to a model calibrated on the trace (its replica 0)."""
    replay = FleetReplay(events, step_time, trace_name)
    config = replay.config(overrides, policy)
    new = replay.run(config, spec)
    header, recorded = replay.header, replay.recorded
    changes = changed_fields(recorded, config)
    # the fleets as their headers name them (each pool's router resolved); one engine's: one replica
    before = header.fleet or {"num_replicas": 1}
    after = new[0].fleet or {"num_replicas": 1}
    changes += [(f"fleet {name}", before.get(name), after.get(name)) for name in dict.fromkeys([*before, *after])
                if before.get(name) != after.get(name)]
    return FleetWhatIf(replay.step_time, spec, fleet_stats(replay.events), fleet_stats(new), new, changes)


class FleetTraceVariant:
    """A fleet what-if of a trace (FleetReplay) under base + overrides, for a sweep: config
    fields of every replica, of a pool or of one replica, and the fleet's own fields
    (fleet/overrides.py), over the recorded fleet (one replica for one engine's trace)."""
    figures = IN_TIME

    def __init__(self, replay: FleetReplay, base: dict, slo: dict | None = None, policy=None, spec=None):
        self.replay, self.base, self.slo, self.policy = replay, base, slo, policy
        self.spec = spec if spec is not None else replay.recorded_spec
        replay.ensure_step_time()      # fitted once, before the workers fork

    def _resolve(self, overrides: dict) -> tuple[Config, FleetSpec]:
        from tracengine.fleet.overrides import resolve
        fields, spec = resolve(self.spec, {**self.base, **overrides}, self.replay.step_time)
        return self.replay.config(fields, self.policy), spec

    def check(self, overrides: dict):
        from tracengine.fleet.engine import check_fleet_requests
        config, spec = self._resolve(overrides)
        check_fleet_requests(config, spec, self.replay.requests)

    def __call__(self, overrides: dict) -> dict:
        from tracengine.fleet.sweep import fleet_row_of
        config, spec = self._resolve(overrides)
        return fleet_row_of(fleet_stats(self.replay.run(config, spec), self.slo))


def fleet_trace_runner(spec: SweepSpec, events: list):
    """The maker of a fleet what-if's variants (`replay TRACE --sweep ...` of a fleet): the
    fleet the variants change travels in the spec as data (spec.fleet)."""
    from tracengine.fleet.spec import FleetSpec
    return FleetTraceVariant(FleetReplay(events, step_time_of(spec.step_time)), spec.base, spec.slo, spec.policy,
                             FleetSpec.from_dict(spec.fleet))


FLEET_TRACE = f"{__name__}:fleet_trace_runner"


def prepare_fleet(prepared: PreparedSources, source: Source, events: list, step_time, trace_name: str, base: dict,
                  slo, policy):
    """(spec, step-time model) of a sweep of fleet what-ifs of a trace (a fleet's, or one engine's
    through a fleet), as prepare_timed's: the model fitted on the trace (its replica 0) unless
    given; the fleet every variant starts from, the recorded one (one replica for one engine's)."""
    replay = FleetReplay(events, step_time, trace_name)
    model = replay.ensure_step_time()
    spec = SweepSpec(FLEET_TRACE, source.digest, base, model.to_dict(), slo, policy, fleet=replay.recorded_spec.to_dict())
    replay.step_time = step_time_of(spec.step_time)
    prepared.add(source, events)
    prepared.add_runner(spec, FleetTraceVariant(replay, base, slo, policy))
    return spec, replay.step_time

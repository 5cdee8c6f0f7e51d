"""Re-execution of a fleet trace (fleet/engine.py): every replica's real Scheduler and
BlockManager and every pool's router, driven in the trace's own order, each event they
emit checked against the recorded one, stopping at the first difference.

The order is the recording's: a RouteDecision asks the router again, with the replicas as
the replay has them at that point; a ReplicaScope runs that replica's step (the requests
routed to it enter first), fed the tokens the trace recorded; a KVTransfer lands the
prefilled request on the decode replica the replay routed it to. No step-time model is
needed: the clock decided the order, and the order is in the trace. A routing change shows
at the request it concerns (the RouteDecision differs); a scheduling change at the replica
and step where it first acts."""
import msgspec

from tracengine.engine.config import Config
from tracengine.engine.hash_id_prompt import request_prompt
from tracengine.engine.request import Request
from tracengine.errors import ConfigError
from tracengine.replay.reexec import RecordedRunner
from tracengine.replay.reexecution import ADD, OWN, STEP, ComparingSink, Diverged, ReplayResult, replay
from tracengine.sim.clock import NoTime
from tracengine.sim.engine import SimulatedEngine
from tracengine.fleet.engine import Fleet
from tracengine.fleet.spec import FleetSpec
from tracengine.fleet.routers import BUILTIN_ROUTERS
from tracengine.trace.events import (BlockFree, KVTransfer, ReplicaScope, RequestAdded, RouteDecision,
                                     SeqAbort, StepEnd, TokenSample)
from tracengine.trace.tracelog import split_header
from tracengine.workload.sessions import session_fields


def fleet_routers(header, routers: dict | None) -> dict:
    """The router classes a replay runs: those given (by pool), else the recorded built-ins; a
    recorded router of one's own is never imported on its own."""
    routers = dict(routers or {})
    fleet = header.fleet
    first = "prefill" if fleet.get("num_prefill_replicas") else "all"
    for pool, key in ((first, "router"), ("decode", "decode_router")):
        if pool == "decode" and first == "all":
            continue
        name = fleet.get(key) or fleet.get("router")
        if pool not in routers and name not in BUILTIN_ROUTERS:
            raise ConfigError(f"this fleet used the router {name!r}, which is not built in; pass it to replay it "
                              f"(replay --router {name})")
        routers.setdefault(pool, BUILTIN_ROUTERS.get(name))
    return routers


def reexecute_fleet(events, policy=None, routers: dict | None = None) -> ReplayResult:
    """Re-execute a fleet trace's events (TraceHeader first). `policy`: as reexecute's; `routers`:
    {pool: Router class} to replay with instead of the recorded ones ("all", "prefill", "decode").
    A divergence's index is the event's in the trace, the header being 0."""
    header, it = split_header(events)
    return replay(ReplayingFleet(header, [header, *it], policy, routers))


class ReplayingFleet:
    """A fleet as a replaying engine (replay/reexecution.py): the trace's events in order, each
    a call: a RouteDecision routes its request again (ADD; a decode pool's hands the prefilled
    request over), a KVTransfer lands it, a ReplicaScope steps that replica (STEP), fed the
    tokens its step sampled and the departures it began with. Each call must emit events."""
    no_abort = ""     # a departure is taken by its replica's step (Replica.run_step)

    def __init__(self, header, recorded: list, policy=None, routers: dict | None = None):
        config = Config.from_dict(header.config)
        spec = FleetSpec.from_dict(header.fleet)
        self.recorded = recorded
        self.sink = sink = ComparingSink(recorded, 1)
        self.runners: dict[int, RecordedRunner] = {}

        def make_engine(index: int, replica_config: Config):
            self.runners[index] = RecordedRunner()
            return SimulatedEngine(replica_config, self.runners[index], NoTime, sink, policy=policy)

        self.fleet = Fleet(config, spec, make_engine, sink, fleet_routers(header, routers))
        self.requests = _recorded_requests(recorded, spec.disaggregated)
        self.prefilled, self.transfers = {}, {}     # seq_id -> (seq, its prefill replica); seq_id -> (src, dst)
        self.replica = None
        self.num_steps = 0
        self.ends: dict[int, int] = {}       # replica -> the recorded end of its last step
        self.at = 0                          # the index of the ReplicaScope of the step to run

    def calls(self):
        recorded, sink = self.recorded, self.sink
        while sink.index < len(recorded):
            i = sink.index
            e = recorded[i]
            t = type(e)
            if t is RouteDecision and e.pool != "decode":
                yield ADD, e
            elif t is RouteDecision or t is KVTransfer:
                yield OWN, e
            elif t is ReplicaScope:
                yield STEP, i
            else:
                raise Diverged(e, None, "the trace has an event the replay did not emit")
            if sink.index == i:
                raise Diverged(e, None, "the replay emitted nothing here")

    def add(self, index: int, e: RouteDecision) -> None:
        if e.seq_id not in self.requests:
            raise Diverged(e, None, f"the trace never adds s{e.seq_id}")
        r = self.requests[e.seq_id]
        self.fleet.arrive(Request(request_prompt(r), r.max_tokens, e.arrival_ns, r.temperature, r.ignore_eos,
                                  seq_id=r.seq_id, **session_fields(r)), e.arrival_ns)

    def own(self, e) -> None:
        if type(e) is RouteDecision:      # the decode pool's
            if e.seq_id not in self.prefilled:
                raise Diverged(e, None, f"the replay has not prefilled s{e.seq_id}")
            seq, src = self.prefilled.pop(e.seq_id)
            self.transfers[e.seq_id] = (src, self.fleet.handoff(seq, e.arrival_ns)[0])
        else:
            if e.seq_id not in self.transfers:
                raise Diverged(e, None, f"the replay has routed no transfer of s{e.seq_id}")
            src, dst = self.transfers.pop(e.seq_id)
            self.fleet.land(e.seq_id, src, dst, 0)

    def feed(self, i: int) -> None:
        e = self.recorded[i]
        if not 0 <= e.replica < len(self.fleet.replicas):
            raise Diverged(e, None, f"the fleet has no replica {e.replica}")
        self.replica, self.at = self.fleet.replicas[e.replica], i

    @property
    def nothing_left(self) -> str:
        return f"the replay has nothing to schedule on replica {self.replica.index}"

    def is_finished(self) -> bool:
        return not self.replica.queued and self.replica.engine.is_finished()

    def step(self) -> None:
        recorded, i, replica = self.recorded, self.at, self.replica
        self.runners[replica.index].tokens = _step_tokens(recorded, i + 1)
        # its clock past every routed arrival, so they enter now (no time is compared); a
        # CPU tier's transfers count the recorded time: the step starts where its StepEnd says
        start_ns = _recorded_start(recorded, i + 1, self.ends, replica.index)
        replica.engine.now_ns = start_ns if replica.engine.scheduler.cpu_tier is not None else \
            max([replica.engine.now_ns] + [r.arrival_ns for _, r in replica.queued])
        stepped = replica.run_step(_segment_aborts(recorded, i + 1))
        if stepped.ran:
            self.num_steps += 1
            for seq in self.fleet.prefilled_seqs(replica, stepped.finished):
                self.prefilled[seq.seq_id] = (seq, replica)

    def diverged(self, d: Diverged):
        recorded, index, replica = self.recorded, self.sink.index, self.replica
        at = recorded[min(index, len(recorded) - 1)] if d.expected is None else d.expected
        in_replica = type(at) not in (RouteDecision, KVTransfer)
        return {"step": getattr(at, "step", None), "index": index,
                "replica": (replica.index if replica is not None else 0) if in_replica else None,
                "seq_id": None if in_replica else at.seq_id}, self.num_steps, index - 1

    def replayed(self):
        return self.num_steps, self.sink.index - 1, 0


def _recorded_start(recorded: list, start: int, ends: dict[int, int], replica: int) -> int:
    """The recorded start of the replica step whose events begin at `start` (its StepEnd's gap
    after the end of the replica's step before), and its end kept in `ends`."""
    for i in range(start, len(recorded)):     # by index: a slice would copy the rest of the trace
        e = recorded[i]
        if type(e) is StepEnd:
            begin = ends.get(replica, 0) + e.gap_ns
            ends[replica] = begin + e.schedule_ns + e.model_ns + e.postprocess_ns
            return begin
        if type(e) is ReplicaScope:
            break
    return ends.get(replica, 0)


def _recorded_requests(recorded: list, disaggregated: bool) -> dict[int, RequestAdded]:
    """Each request as it first entered (the prefill side's, when disaggregated, with the
    max_tokens of the whole request: its decode side's and one)."""
    requests: dict[int, RequestAdded] = {}
    for e in recorded:
        if type(e) is RequestAdded:
            if e.seq_id not in requests:
                requests[e.seq_id] = e
            elif disaggregated:
                first = requests[e.seq_id]
                requests[e.seq_id] = msgspec.structs.replace(first, max_tokens=e.max_tokens + 1)
    return requests


def _segment_aborts(recorded: list, start: int) -> list[tuple[int, str]]:
    """(seq_id, reason) of the SeqAborts among the events that a replica's step begins with at
    `start` (the requests entering, then the clients that left): applied where recorded."""
    aborts = []
    for i in range(start, len(recorded)):     # by index: a slice would copy the rest of the trace
        e = recorded[i]
        t = type(e)
        if t is SeqAbort:
            aborts.append((e.seq_id, e.reason))
        elif t is not RequestAdded and t is not BlockFree:
            break
    return aborts


def _step_tokens(recorded: list, start: int) -> dict[int, int]:
    """The tokens the step beginning at `start` sampled, by seq_id."""
    tokens = {}
    for i in range(start, len(recorded)):
        e = recorded[i]
        t = type(e)
        if t is TokenSample:
            tokens[e.seq_id] = e.token_id
        elif t is StepEnd:
            break
    return tokens


class FleetEventCheck:
    """EventCheck (replay/fold.py) of a fleet trace: each replica's events checked by a checker
    of its own, one ReplicaScope's events at a time (a fleet's frame is the routers' and
    transfers' events and one replica's step; a replica that a client's departure left idle
    ends its events without a step). A KVTransfer goes to the checker of the decode replica it
    lands on, whose fold takes its blocks in (replay/fold_transfer.py). `step` names the step
    of the replica last checked."""

    def __init__(self, header):
        from tracengine.fleet.stats import replica_headers
        self.header = header
        self.headers = replica_headers(header)      # each replica's config
        self.num_replicas = len(self.headers)
        self.checkers: dict = {}
        self.step = 0

    def _checker(self, replica: int):
        from tracengine.errors import TraceError
        from tracengine.replay.event_check import EventCheck
        if not 0 <= replica < self.num_replicas:
            raise TraceError(f"the fleet has no replica {replica} (it has {self.num_replicas})")
        checker = self.checkers.get(replica)
        if checker is None:
            checker = self.checkers[replica] = EventCheck(self.headers[replica])
        return checker

    def frame(self, events) -> None:
        from tracengine.errors import TraceError
        replica, segment = None, []
        for e in events:
            t = type(e)
            if t is ReplicaScope:
                self._check(replica, segment)
                replica, segment = e.replica, []
            elif t is KVTransfer or t is RouteDecision:     # the fleet's own, between replica steps
                self._check(replica, segment)
                replica, segment = None, []
                if t is RouteDecision:
                    continue
                checker = self._checker(e.replica)
                if e.step != checker.step:
                    raise TraceError(f"replica {e.replica}, step {checker.step}: a KVTransfer stamped step {e.step}")
                checker.state.handlers[KVTransfer](e)
            else:
                if replica is None:
                    raise TraceError("a fleet frame with engine events and no ReplicaScope")
                segment.append(e)
        self._check(replica, segment)

    def _check(self, replica, segment: list) -> None:
        if not segment:
            return
        checker = self._checker(replica)
        try:
            checker.frame(segment)
        finally:
            self.step = checker.step
        # a replica's events may end between its steps: the next ones are its own all the same
        checker.open_frame = False

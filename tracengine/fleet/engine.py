"""A fleet in simulated time: replicas behind a router (docs/cluster.md).

Each replica is the simulated engine (sim/engine.py): the real Scheduler and BlockManager
with a KV cache of its own, under any policy. One clock: a replica's step starts its loop gap
after its last one ended, or, idle, its wake-up time after the first request routed to it;
every request routed to a replica by a step's start enters before that step. A request meets
the router when it arrives, and the router sees the replicas as they are then (a step is
taken whole at its start, so a replica mid-step shows the state its step left).

Disaggregated (`num_prefill_replicas`, `num_decode_replicas`): a request is prefilled on a
prefill replica (max_tokens 1: its first token, so TTFT is the prefill side's), handed to the
decode pool's router when that step ends, and its prompt's KV lands on the chosen decode
replica `latency + bytes / bandwidth` later: the prompt's full blocks enter that replica's
prefix cache, and the request (prompt and first token, max_tokens - 1) enters there as an
arrival. Admitted, it finds the full blocks cached and its last, partial block's tokens
computed (the replica's KV connector, fleet/kv_transfer.LandedPrompts, as vLLM's KV connectors
report external computed tokens), so its first step computes one token: the first token, whose KV the prefill
replica did not compute.

Events: one trace. A fleet of one replica writes exactly what one simulated engine writes;
otherwise each replica step (and the requests it adds) follows a ReplicaScope, and the
routers' choices and the transfers are RouteDecision and KVTransfer events."""
import dataclasses
import functools
import heapq
from typing import Any

from tracengine.engine.config import Config
from tracengine.engine.sequence import Sequence
from tracengine.errors import TracengineError
from tracengine.engine.request import Request
from tracengine.fleet.departures import FleetDepartures
from tracengine.fleet.overrides import replica_configs
from tracengine.fleet.kv_transfer import LandedPrompts, install_prompt_kv
from tracengine.fleet.replica import Replica
from tracengine.sim.clock import NoTime, Stepped, in_arrival_order, run_in_time
from tracengine.fleet.routers import RoutedRequest, Router, router_classes
from tracengine.fleet.spec import FleetSpec, header_fields
from tracengine.trace.events import KVTransfer, RouteDecision
from tracengine.trace.sinks import NULL_SINK
from tracengine.workload.sessions import SessionRelease, has_sessions, session_fields

HANDOFF, LANDING = 1, 2     # what the fleet's own clock holds besides its replicas' steps


class Fleet:
    """The replicas and their routers, an engine made of engines (the engine interface,
    engine/interface.py): `run_in_time` drives it in simulated time, and re-execution
    (fleet/replay.py) drives its routing, steps and transfers in a trace's order."""

    def __init__(self, config: Config, spec: FleetSpec, make_engine, sink=NULL_SINK, routers=None,
                 step_time=None, first_step_ns: int = 0):
        """`make_engine(index, config)`: a replica's engine under its config (FleetSpec.replica_config's
        over `config`), sending its events to `sink`. `routers`: {pool: Router class} instead of the
        spec's names (a user's classes, loaded once). `step_time`: the model its replicas' loop gaps
        and wake-ups come from; `first_step_ns`: as ClockedEngine's."""
        self.config = config
        self.spec = spec
        self.sink = sink
        roles = spec.roles
        self.configs = replica_configs(config, spec)
        self.departures = FleetDepartures([])    # the clients that leave (set_departures)
        step_time = step_time if step_time is not None else NoTime
        self.replicas = [Replica(i, role, make_engine(i, self.configs[i]), step_time, first_step_ns, None,
                                 not spec.is_single)
                         for i, role in enumerate(roles)]
        self.pools = {pool: [r for r in self.replicas if r.role == pool] for pool in dict.fromkeys(roles)}
        options = {"seed": spec.router_seed, "prefix_weight": spec.prefix_weight, "load_weight": spec.load_weight}
        self.routers: dict[str, Router] = {pool: cls(**options) for pool, cls in router_classes(spec, routers).items()}
        self.prefilled: dict[int, tuple[Sequence, Request]] = {}   # handed off, KV not landed yet
        self.max_tokens: dict[int, int] = {}     # a disaggregated request's own max_tokens
        self.session_ids: dict[int, str] = {}    # a disaggregated request's session, for the decode pool's router
        self.clock: list[tuple[int, int, int, Any]] = []     # heap of (time, order, kind, what): handoffs, landings
        self.num_clock_entries = 0

    def set_departures(self, requests: list[Request]) -> None:
        """The clients of `requests` that leave (each with its abort_ns), as they left the recording."""
        self.departures = FleetDepartures(requests)
        # a replica asks who leaves before each of its steps only where some client does
        for replica in self.replicas:
            replica.leaving = functools.partial(self._leaving, replica.index) if self.departures.num_leaving else None

    def _leaving(self, index: int, now_ns: int) -> list[tuple[int, str]]:
        return self.departures.leaving(index, now_ns)

    # -- the engine interface --------------------------------------------------------------

    def add(self, index: int, request: Request) -> None:
        """A request from the workload arrives (a request without a seq_id: its index)."""
        if request.seq_id is None:
            request = dataclasses.replace(request, seq_id=index)
        self.arrive(request, request.arrival_ns)

    def abort(self, seq_id: int, reason: str) -> bool:
        """Its client leaves, from the replica that holds it (a request whose KV is in flight
        leaves its decode replica when it lands, as FleetDepartures has it)."""
        return any(replica.abort(seq_id, reason) for replica in self.replicas)

    def next_step_ns(self) -> int | None:
        """The start of its replicas' next step, or the time of its next handoff or landing."""
        replica = self._first_to_step()
        start = replica.start_ns if replica is not None else None
        if self.clock and (start is None or self.clock[0][0] < start):
            return self.clock[0][0]
        return start

    def _first_to_step(self) -> Replica | None:
        """The replica whose next step starts first (the first of them in order at a tie), if any
        has a step to run. Asked before every step: one pass, nothing built."""
        first, first_ns = None, 0
        for replica in self.replicas:
            start_ns = replica.start_ns
            if start_ns is not None and (first is None or start_ns < first_ns):
                first, first_ns = replica, start_ns
        return first

    def is_finished(self) -> bool:
        return not self.clock and all(r.is_finished() for r in self.replicas)

    def step(self) -> Stepped:
        """The fleet's next event: a handoff or a landing due no later than any replica's next
        step, else the step of the replica that starts first."""
        replica = self._first_to_step()
        start_ns = replica.start_ns if replica is not None else None
        if self.clock and (start_ns is None or self.clock[0][0] <= start_ns):
            now_ns, _, kind, what = heapq.heappop(self.clock)
            if kind == HANDOFF:
                src, seq = what
                dst, duration_ns = self.handoff(seq, now_ns)
                self._at(now_ns + duration_ns, LANDING, (seq.seq_id, src, dst))
            else:
                seq_id, src, dst = what
                self.land(seq_id, src, dst, now_ns)
            return Stepped([], [], False, now_ns)
        assert replica is not None, "a fleet stepped with nothing to run"     # run_in_time asks next_step_ns first
        stepped = replica.step()
        if not stepped.ran:
            return stepped
        handed = self.prefilled_seqs(replica, stepped.finished)
        finished = stepped.finished
        if handed:      # a prefill replica's: they go on to decode, not finished yet
            for seq in handed:
                self._at(stepped.end_ns, HANDOFF, (replica, seq))
            handed_ids = {seq.seq_id for seq in handed}
            finished = [seq for seq in finished if seq.seq_id not in handed_ids]
            stepped = stepped._replace(finished=finished)
        for seq in finished:
            self.departures.finished(seq.seq_id)
        return stepped

    def stuck_reason(self) -> str:
        stuck = next(r for r in self.replicas if not r.is_finished())
        return f"replica {stuck.index}: {stuck.stuck_reason()}"

    def _at(self, when: int, kind: int, what) -> None:
        heapq.heappush(self.clock, (when, self.num_clock_entries, kind, what))
        self.num_clock_entries += 1

    # -- routing and transfers -------------------------------------------------------------

    def route(self, request: Request, pool: str, now_ns: int) -> Replica:
        """The router of `pool` chooses a replica for `request`, arriving there at `now_ns`."""
        replicas = self.pools[pool]
        routed = RoutedRequest(request.seq_id, request.prompt, request.max_tokens, now_ns,
                               self.config.kvcache_block_size, session_id=request.session_id)
        scores = self.routers[pool].route(routed, replicas)
        if len(scores) != len(replicas):
            raise TracengineError(f"router {type(self.routers[pool]).__name__} gave {len(scores)} scores "
                                  f"for {len(replicas)} replicas")
        chosen = replicas[min(range(len(replicas)), key=scores.__getitem__)]
        if self.sink.enabled and not self.spec.is_single:
            self.sink.emit(RouteDecision(chosen.engine.num_steps, request.seq_id, chosen.index,
                                         [r.index for r in replicas], [float(s) for s in scores],
                                         pool, now_ns))
        return chosen

    def arrive(self, request: Request, now_ns: int) -> Replica:
        """A request from the workload: routed, and queued on its replica (as a prefill, when disaggregated)."""
        if self.spec.disaggregated:
            self.max_tokens[request.seq_id], self.session_ids[request.seq_id] = request.max_tokens, request.session_id
            request = Request(request.prompt, 1, request.arrival_ns, request.temperature, request.ignore_eos,
                              seq_id=request.seq_id, **session_fields(request))
        replica = self.route(request, "prefill" if self.spec.disaggregated else "all", now_ns)
        replica.add(request.seq_id, request)
        self.departures.moved(request.seq_id, replica.index)
        return replica

    def prefilled_seqs(self, replica: Replica, finished: list[Sequence]) -> list[Sequence]:
        """The sequences of a prefill replica's step that go on to decode (those with tokens left)."""
        if replica.role != "prefill":
            return []
        return [seq for seq in finished
                if seq.finish_reason == "length" and self.max_tokens.get(seq.seq_id, 1) > 1]

    def handoff(self, seq: Sequence, now_ns: int) -> tuple[Replica, int]:
        """A prefilled sequence to the decode pool: (its decode replica, the transfer's ns)."""
        # the prompt and the first token, as token ids (a hash-id prompt's twin: the same block hashes)
        request = Request([*seq.prompt_token_ids, *seq.completion[:1]], self.max_tokens[seq.seq_id] - 1, now_ns,
                          seq.temperature, seq.ignore_eos, seq_id=seq.seq_id,
                          session_id=self.session_ids.get(seq.seq_id, ""))    # for a router's session affinity
        replica = self.route(request, "decode", now_ns)
        self.prefilled[seq.seq_id] = (seq, request)
        self.departures.moved(seq.seq_id, None)
        return replica, self.spec.transfer_ns(seq.num_prompt_tokens)[1]

    def land(self, seq_id: int, src: Replica, dst: Replica, now_ns: int):
        """The KV of a handed-off request lands on `dst`: its prompt's full blocks enter dst's
        prefix cache, and the request is queued there, arriving now."""
        seq, request = self.prefilled.pop(seq_id)
        block_manager = dst.scheduler.block_manager
        num_blocks = install_prompt_kv(block_manager, seq_id, seq.prompt_token_ids)
        if block_manager.kv_connector is None:
            block_manager.kv_connector = LandedPrompts(block_manager.block_size)
        block_manager.kv_connector.landed(seq_id, seq.num_prompt_tokens)
        num_bytes, duration_ns = self.spec.transfer_ns(seq.num_prompt_tokens)
        if self.sink.enabled:
            self.sink.emit(KVTransfer(dst.engine.num_steps, seq_id, src.index, dst.index, seq.num_prompt_tokens,
                                      num_bytes, duration_ns, num_blocks))
        request.arrival_ns = now_ns
        dst.add(seq_id, request)
        self.departures.moved(seq_id, dst.index)


def run_fleet(fleet: Fleet, requests: list[Request], max_steps: int = 10_000_000, on_progress=None) -> None:
    """The fleet serves `requests` (each with arrival_ns) in simulated time; its events go to the
    fleet's sink. `on_progress(num_done, now_ns)`: as run_in_time's, per replica step."""
    # a request without an id has its index in the workload, as run_timed's
    numbered = [r if r.seq_id is not None else dataclasses.replace(r, seq_id=i) for i, r in enumerate(requests)]
    fleet.set_departures(numbered)
    sessions = SessionRelease(numbered) if has_sessions(numbered) else None
    take = sessions.pop if sessions is not None else in_arrival_order(numbered)
    run_in_time(fleet, take, sessions, max_steps, on_progress)


def simulate_fleet(config: Config, requests: list[Request], step_time, spec: FleetSpec, sink=None, header=None,
                   on_progress=None, routers=None, make_runner=None, first_step_ns: int = 0) -> list:
    """`requests` (each with its arrival_ns) through a fleet in simulated time, tokens from
    SyntheticRunner (the same token for a sequence's position on any replica); the events
    (header first), or, with `sink` (a TraceWriter made with `header`: fleet_header's), the
    header alone. `make_runner(index)`: a replica's runner instead (a what-if's recorded
    outputs, a benchmark's that watches the batches). `first_step_ns`: the earliest start of a
    replica's step 0 (run_timed's)."""
    from tracengine.sim.engine import SimulatedEngine, check_token_prompts
    from tracengine.sim.runners import SyntheticRunner
    from tracengine.trace.sinks import ListSink
    check_token_prompts(requests)
    events_sink = sink if sink is not None else ListSink()
    # a replica's own sink where the fleet's gives one (a live fold's per replica: fleet/stats.py)
    replica_sink = getattr(events_sink, "replica_sink", None)

    def make_engine(index: int, replica_config: Config):
        runner = make_runner(index) if make_runner else SyntheticRunner(eos=replica_config.eos,
                                                                        seed=replica_config.seed)
        return SimulatedEngine(replica_config, runner, step_time,
                               replica_sink(index) if replica_sink is not None else events_sink,
                               policy=replica_config.scheduling_policy)

    check_fleet_requests(config, spec, requests)
    fleet = Fleet(config, spec, make_engine, events_sink, routers, step_time, first_step_ns)
    run_fleet(fleet, requests, on_progress=on_progress)
    head = header if header is not None else fleet_header(config, step_time, spec, routers)
    return [head] if sink is not None else [head, *events_sink.events]


def check_fleet_requests(config: Config, spec: FleetSpec, requests: list[Request]):
    """Refuse, before the run, a request that a replica of its pool could never run under its
    config (a prefill replica runs its prompt and first token)."""
    from tracengine.engine.scheduler import Scheduler
    from tracengine.sim.runners import check_requests
    checked = set()
    for index, (role, replica_config) in enumerate(zip(spec.roles, replica_configs(config, spec))):
        key = (role, tuple(replica_config.to_dict().items()))
        if key in checked:
            continue
        checked.add(key)
        asked = [dataclasses.replace(r, max_tokens=1) for r in requests] if role == "prefill" else requests
        check_requests(Scheduler(replica_config), asked,
                       f"replica {index}'s config" if spec.replica_config else "the config")


def fleet_header(config: Config, step_time, spec: FleetSpec, routers: dict | None = None):
    """simulation_header's, with the fleet's fields (none for one replica)."""
    import msgspec

    from tracengine.sim.engine import simulation_header
    return msgspec.structs.replace(simulation_header(config, step_time),
                                   fleet=header_fields(spec, router_classes(spec, routers)))

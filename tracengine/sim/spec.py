"""A sweep's variants as data: what every variant of a sweep shares (`SweepSpec`: what makes
its runs, the source's digest, the --set fields, the step-time model, the objectives, the
policy), what one variant changes (`Variant`: config fields, and for a capacity search a
request rate), and the input they all read (`Source`: a trace or workload file, or the
flags of a synthetic workload, named by a digest of its content).

A variant is a function of (spec, source, variant) alone, so any process that holds the
source gives the same row: a forked worker, a Ray worker on another node, this process.
The source is read once per process (`PreparedSources`): from its path on this machine, or
from the bytes a worker elsewhere was sent."""
import dataclasses
import hashlib
import json
import math
import os
import tempfile
from dataclasses import dataclass, field

from tracengine.engine.user_classes import resolve
from tracengine.errors import TracengineError
from tracengine.workload.sources import WorkloadSpec


@dataclass(frozen=True)
class Source:
    """The input of every variant: `kind` "trace" (a trace file) or "workload" (a workload
    file, or none for a synthetic one) at `path` on the machine that made it; `params` how it
    is read; `digest` of the file's bytes and the params. Another machine reads no path: it is
    sent the bytes (`read_bytes`)."""
    kind: str
    path: str | None
    params: dict = field(default_factory=dict)
    digest: str = ""

    @classmethod
    def of(cls, kind: str, path: str | None, params: dict | None = None) -> "Source":
        params = dict(params or {})
        h = hashlib.sha256()
        if path is not None:
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        h.update(json.dumps([kind, params], sort_keys=True).encode())
        return cls(kind, None if path is None else os.fspath(path), params, h.hexdigest())

    def read_bytes(self) -> bytes:
        if self.path is None:
            return b""
        with open(self.path, "rb") as f:
            return f.read()


def workload_source(workload: WorkloadSpec, vocab_size: int) -> Source:
    """The Source of a workload (a file's bytes, or a synthetic workload's flags): every field
    of its WorkloadSpec but the file's path, and the vocabulary its token ids stay below."""
    params = dataclasses.asdict(workload)
    del params["workload"]
    params["vocab_size"] = vocab_size
    if math.isinf(params["request_rate"]):
        params["request_rate"] = None        # JSON has no inf: None is the flag's default, all at once
    return Source.of("workload", workload.workload, params)


@dataclass(frozen=True)
class Variant:
    """One run of a sweep: config fields over the spec's base, and a capacity search's request rate."""
    overrides: dict
    request_rate: float | None = None


@dataclass(frozen=True)
class SweepSpec:
    """What every variant of a sweep shares; small, so it travels with each task."""
    maker: str                    # module:function making the variant object of a source (make_runner)
    source: str                   # the Source's digest
    base: dict                    # the --set fields
    step_time: dict | None        # the step-time model's to_dict() (None for a step-exact what-if)
    slo: dict | None = None       # objectives in seconds
    policy: str | None = None     # replay --policy
    fleet: dict | None = None     # a fleet's FleetSpec.to_dict() (fleet/engine.py); None: one engine

    def key(self) -> dict:
        return dataclasses.asdict(self)


def step_time_of(d: dict):
    from tracengine.sim.roofline import RooflineStepTime
    from tracengine.sim.steptime import LinearStepTime
    return RooflineStepTime.from_dict(d) if d["kind"] == "roofline" else LinearStepTime.from_dict(d)


def read_sent_source(source: Source, data: bytes):
    """A source read from the bytes a worker was sent: the readers read files, so they go to
    a file of this process's own, removed once read (nothing is left on the node, and no
    process reads a file another could have put there)."""
    if not data:
        return read_source(source, None)
    fd, path = tempfile.mkstemp(prefix="tracengine-source-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return read_source(source, path)
    finally:
        os.unlink(path)


def read_source(source: Source, path: str | None):
    """What the variants of a source read: a trace's events, or a workload's timed requests."""
    if source.kind == "trace":
        from tracengine.trace.tracelog import TraceReader
        with TraceReader(path) as reader:
            return list(reader.events())
    from tracengine.sim.engine import check_token_prompts
    from tracengine.workload.sources import workload_requests
    params = dict(source.params)
    vocab_size = params.pop("vocab_size")
    if params["request_rate"] is None:
        params["request_rate"] = math.inf
    requests = workload_requests(WorkloadSpec(**params, workload=path), vocab_size)
    check_token_prompts(requests)
    return requests


class PreparedSources:
    """A source as read, and the variant objects made of it, by digest (a digest names the
    content, so an entry is never another source's). A sweep's own holds its one source; a Ray
    worker's, the last source it was sent (a new one replaces it, so a long-lived worker keeps
    one)."""

    def __init__(self):
        self._read: dict[str, object] = {}
        self._runs: dict[str, object] = {}

    def add(self, source: Source, value):
        if source.digest not in self._read:
            self._read.clear()
            self._runs.clear()
        self._read[source.digest] = value

    def get(self, source: Source, fetch):
        """The source as read: from its path on this machine, or, given `fetch` (a source
        made elsewhere), from the bytes it fetches."""
        if source.digest not in self._read:
            self.add(source, read_source(source, source.path) if fetch is None else read_sent_source(source, fetch()))
        return self._read[source.digest]

    def add_runner(self, spec: SweepSpec, runner):
        """The variant object of `spec`, where its maker's caller made it already."""
        self._runs[json.dumps(spec.key(), sort_keys=True)] = runner

    def runner(self, spec: SweepSpec, source: Source, fetch):
        """The sweep's variant object (make_runner) over this source, made once per spec."""
        key = json.dumps(spec.key(), sort_keys=True)
        if key not in self._runs:
            read = self.get(source, fetch)
            self._runs[key] = make_runner(spec, read)
        return self._runs[key]


def make_runner(spec: SweepSpec, read):
    """The variant object (`check(overrides)`, `__call__(overrides) -> row`, `figures`) that
    `spec.maker` makes of the source as read. A maker is named, not passed, so that a spec stays
    data; the what-ifs of a trace have theirs in replay/sweeps.py (sim imports nothing of replay)."""
    return resolve(spec.maker)(spec, read)     # `module:record.method` too: a method of a module-level record


def simulate_runner(spec: SweepSpec, requests):
    """The maker of `tracengine simulate`'s variants."""
    from tracengine.sim.sweep import SimulateVariant
    return SimulateVariant(requests, spec.base, step_time_of(spec.step_time), spec.slo)


SIMULATE = f"{__name__}:simulate_runner"
FLEET = "tracengine.fleet.sweep:fleet_runner"     # `simulate --replicas N --sweep ...`


def run_variant(spec: SweepSpec, source: Source, variant: Variant, prepared: PreparedSources, fetch=None) -> dict:
    """The row of one variant: the figures of sim/sweep.py (row_of or step_row_of); a
    capacity search's probe (a request rate) adds the share of requests that met every objective."""
    runner = prepared.runner(spec, source, fetch)
    if variant.request_rate is None:
        return runner(variant.overrides)
    from tracengine.analysis.stats import stats
    from tracengine.sim.sweep import SimulateVariant, row_of
    if not isinstance(runner, SimulateVariant):
        raise TracengineError("a capacity search runs `simulate` workloads")
    requests = at_rate(runner.requests, variant.request_rate, source.params)
    # through the runner's engine: tracengine's, or another's own scheduler (simulate --scheduler)
    s = stats(runner.engine.run({**spec.base, **variant.overrides}, requests, runner.step_time), spec.slo)
    return {**row_of(s), "good_request_share": s.goodput.good_request_share if s.goodput is not None else None}


def native_rate(requests, params: dict) -> float | None:
    """A workload's own rate: --request-rate's, or for a file whose arrivals are spread out, its
    arrivals after the first over their span; None when all arrive at once. A sessions file's
    arrivals are its sessions' first turns (a later turn is sent when its session releases it),
    so its rate is sessions per second."""
    if params.get("request_rate") is not None:
        return params["request_rate"]
    arrivals = [r.arrival_ns for r in requests if not r.depends_on]
    span_s = (max(arrivals) - min(arrivals)) / 1e9
    return (len(arrivals) - 1) / span_s if span_s > 0 else None


def at_rate(requests, rate: float, params: dict) -> list:
    """The requests arriving at `rate` per second: a file's own arrivals scaled in time, or
    (a synthetic workload, or one given --request-rate) drawn at the rate as --request-rate draws
    them. Of a sessions file only the first turns' arrivals move: `rate` is sessions per second,
    and a later turn still follows its session's finishes by its own think time."""
    from tracengine.workload.arrivals import arrival_times
    own = native_rate(requests, params) if params.get("request_rate") is None else None
    starting = [i for i, r in enumerate(requests) if not r.depends_on]
    if own is not None:
        factor = own / rate
        arrivals = [round(requests[i].arrival_ns * factor) for i in starting]
    else:
        arrivals = [round(t * 1e9) for t in arrival_times(len(starting), rate, params.get("burstiness") or 1.0,
                                                          params.get("seed") or 0)]
    moved = dict(zip(starting, arrivals))
    return [dataclasses.replace(r, arrival_ns=moved[i]) if i in moved else dataclasses.replace(r)
            for i, r in enumerate(requests)]

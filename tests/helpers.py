"""Builders the tests share: the real scheduler on a tiny config (no model), canned runs,
traces written whole or cut as a kill would leave them."""
import shutil
from pathlib import Path

from tracengine.engine.config import Config
from tracengine.trace.sinks import ListSink
from tracengine.engine.sampling_params import SamplingParams
from tracengine.engine.scheduler import Scheduler
from tracengine.engine.sequence import Sequence
from tracengine.trace.tracelog import write_trace  # noqa: F401  (re-exported for the tests)

EOS = 999

def make_config(**overrides) -> Config:
    values = dict(num_kvcache_blocks=64, kvcache_block_size=4, max_num_batched_tokens=64,
                  max_num_seqs=16, max_model_len=1024, eos=EOS)
    values.update(overrides)
    return Config(**values)


def make_scheduler(sink=None, **overrides) -> Scheduler:
    config = make_config(**overrides)
    return Scheduler(config, sink if sink is not None else ListSink())


def make_seqs(lengths, block_size=4, max_tokens=8, ignore_eos=False, start_id=0, prefix=()):
    """Sequences with distinct token ids (so no accidental prefix hits) after an optional shared prefix."""
    seqs = []
    for i, n in enumerate(lengths):
        seq_id = start_id + i
        body = [1000 + seq_id * 10000 + j for j in range(n - len(prefix))]
        seqs.append(Sequence(seq_id, list(prefix) + body, block_size,
                             SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)))
    return seqs


def step_scheduler(scheduler, token=7):
    """One step with a fabricated token for every scheduled sequence."""
    seqs, is_prefill = scheduler.schedule()
    scheduler.postprocess(seqs, [token] * len(seqs), is_prefill)
    return seqs, is_prefill


def run_canned(name):
    """The events of a canned workload (tracengine.sim.runners) run through the engine."""
    from tracengine.sim.runners import run_workload
    from tracengine.testing import canned_workload
    config, requests, runner = canned_workload(name)
    return run_workload(config, requests, runner)


class Tee:
    """One sink feeding several: a trace writer and an in-memory list to compare with."""
    enabled = True

    def __init__(self, *sinks):
        self.sinks = sinks

    def emit(self, event):
        for sink in self.sinks:
            sink.emit(event)


def record_every_event_type(path, deflate: bool = True):
    """Records the every-event-type run to `path`; returns the header, the events emitted, the engine."""
    from tracengine.testing import every_event_type, every_event_type_config
    from tracengine.trace.tracelog import TraceWriter, make_header
    header = make_header(every_event_type_config())
    events = ListSink()
    with TraceWriter(path, header, deflate=deflate) as writer:
        engine = every_event_type(Tee(writer, events))
    return header, events.events, engine


def cut_like_a_kill(path, nbytes: int) -> bytes:
    """Rewrites a closed trace as a writer killed mid-frame leaves it: no end
    frame, and the last step's frame short by `nbytes`. Returns the new bytes."""
    from tracengine.trace.tracelog import END_FRAME
    path = Path(path)
    data = path.read_bytes()
    assert data.endswith(END_FRAME)
    data = data[:len(data) - len(END_FRAME) - nbytes]
    path.write_bytes(data)
    return data


def batched_and_alone(llm, prompts, params) -> tuple[list, list]:
    """The token ids of `prompts` generated together (with the run's summary in
    llm.last_run), and of each generated alone on a reset engine."""
    batched = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False, summary=True)]
    summary = llm.last_run
    alone = []
    for prompt, sp in zip(prompts, params):
        llm.reset()
        alone.append(llm.generate([prompt], sp, use_tqdm=False)[0]["token_ids"])
    llm.last_run = summary
    return batched, alone


# -- sweeps (test_sweeps.py, test_sweeps_ray.py) ---------------------------------------------

SWEEP_MODEL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "intermediate_size": 128, "vocab_size": 1000, "torch_dtype": "bfloat16"}
# a slow device, so that a few dozen short requests queue at a few hundred requests/s
SLOW_DEVICE = ["--peak-tflops", "1", "--bandwidth-tbs", "0.05"]
SWEEP_SLO = {"ttft": 0.2, "tpot": 0.02}


def write_mooncake(path, num_requests: int = 60, seed: int = 0) -> str:
    """A Mooncake-format workload: arrivals in ms, lengths, and hash ids that share blocks."""
    import json
    import random
    rng = random.Random(seed)
    t = 0
    with open(path, "w") as f:
        for _ in range(num_requests):
            t += rng.randint(1, 40)
            num_blocks = rng.randint(1, 4)
            f.write(json.dumps({"timestamp": t, "input_length": num_blocks * 512 - rng.randint(0, 300),
                                "output_length": rng.randint(4, 40),
                                "hash_ids": [rng.randint(0, 30) for _ in range(num_blocks)]}) + "\n")
    return str(path)


def simulate_argv(workload, roofline, *extra) -> list[str]:
    """`simulate` of the workload on the slow device, with SWEEP_SLO's objectives."""
    return ["simulate", workload, "--roofline", roofline, *SLOW_DEVICE, "--length-scale", "0.25",
            "--set", "num_kvcache_blocks=400", "--slo", "ttft=200ms", "--slo", "tpot=20ms", *extra]


def table_of(out: str) -> list[str]:
    """A sweep's table: its lines but the one that says how long it took and where."""
    return [line for line in out.splitlines() if " variants in " not in line]


def sweep_of(workload, roofline):
    """(spec, source, prepared) of simulate_argv's sweep, as the command makes them."""
    from tracengine.sim.roofline import ModelShape, RooflineStepTime
    from tracengine.sim.spec import SIMULATE, PreparedSources, SweepSpec, workload_source
    from tracengine.workload.sources import WorkloadSpec
    source = workload_source(WorkloadSpec(workload=workload, length_scale=0.25), 1000)
    step_time = RooflineStepTime.for_hardware(ModelShape.from_file(roofline), None, 1.0, 0.05)
    spec = SweepSpec(SIMULATE, source.digest, {"num_kvcache_blocks": 400}, step_time.to_dict(), SWEEP_SLO)
    return spec, source, PreparedSources()


def good_share(spec, source, prepared, overrides: dict, rate: float) -> float:
    """The share of good requests of one run at `rate`, made alone: no executor, no cache."""
    from tracengine.analysis.stats import stats
    from tracengine.sim.engine import simulate, simulate_config
    from tracengine.sim.spec import at_rate
    runner = prepared.runner(spec, source, None)
    requests = at_rate(runner.requests, rate, source.params)
    config = simulate_config({**spec.base, **overrides}, requests)
    return stats(simulate(config, requests, runner.step_time), spec.slo)["goodput"]["good_request_share"]


def blocks_needed(manager, seq) -> tuple[int, int]:
    """(prefix-cache hits, free blocks needed) for seq's first allocation."""
    hits = manager.cached_block_ids(seq)
    return len(hits), manager.num_blocks_needed(seq, hits)


def allocate_with_hits(manager, seq, num_cached_blocks: int, *more):
    """Allocates seq with its prefix-cache hits, which must be `num_cached_blocks` blocks."""
    hits = manager.cached_block_ids(seq)
    assert len(hits) == num_cached_blocks
    manager.allocate(seq, hits, *more)


def user_project(pytester, conftest: str, tests: str, trace: str):
    """A user's project in `pytester`: its conftest, its tests as test_scheduling.py, and
    traces/`trace` copied from the repository's traces."""
    # pytest-asyncio, installed here, warns without this setting (and warnings are errors in this suite)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_scheduling=tests)
    (pytester.path / "traces").mkdir()
    shutil.copy(Path(__file__).parent.parent / "traces" / trace, pytester.path / "traces")
    return pytester


def stored_snapshot(project, test: str, name: str) -> Path:
    """Where the user's project stores snapshot `name` of test_scheduling.py's `test`."""
    return project.path / "snapshots" / "test_scheduling" / test / name

"""Builders the tests share: the real scheduler on a tiny config (no model), canned runs,
traces written whole or cut as a kill would leave them."""
from pathlib import Path

from tracengine.engine.config import Config
from tracengine.trace.events import ListSink
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

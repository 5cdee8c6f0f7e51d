"""The step loop: schedule -> run -> postprocess -> StepEnd.

`LLMEngine` is model-agnostic: it takes any runner with `run(seqs,
is_prefill) -> token ids`, so the replayer drives this same loop with the
recorded tokens. `LLM` builds the real model runner; torch is imported only
there."""
from time import perf_counter_ns

from tracengine.engine.config import Config
from tracengine.errors import ConfigError
from tracengine.trace.events import NULL_SINK, RequestAdded, StepEnd
from tracengine.engine.sampling_params import SamplingParams
from tracengine.engine.scheduler import Scheduler
from tracengine.engine.sequence import Sequence


class LLMEngine:

    def __init__(self, config: Config, runner, sink=NULL_SINK, tokenizer=None):
        self.config = config
        self.runner = runner
        self.tokenizer = tokenizer
        self.reset(sink)

    def reset(self, sink=NULL_SINK):
        """A fresh scheduler and block manager (empty prefix cache), steps and ids from 0."""
        self.sink = sink
        self.scheduler = Scheduler(self.config, sink)
        self.num_steps = 0
        self.next_seq_id = 0
        self.num_batched_tokens = 0   # tokens computed in the last step
        self.start_ns = perf_counter_ns()   # the run's time origin: arrivals and step starts count from it
        self.last_step_end_ns = self.start_ns

    def add_request(self, prompt: str | list[int], sampling_params: SamplingParams | None = None,
                    seq_id: int | None = None, arrival_time: float | None = None) -> Sequence:
        """`arrival_time`: seconds from the start of the run (default: now)."""
        sp = sampling_params if sampling_params is not None else SamplingParams()
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        seq = Sequence(self.next_seq_id if seq_id is None else seq_id, token_ids,
                       self.config.kvcache_block_size, sp)
        self.scheduler.add(seq)
        self.next_seq_id = max(self.next_seq_id, seq.seq_id + 1)
        if self.sink.enabled:
            arrival_ns = perf_counter_ns() - self.start_ns if arrival_time is None else round(arrival_time * 1e9)
            self.sink.emit(RequestAdded(self.num_steps, seq.seq_id, token_ids, sp.max_tokens,
                                        sp.temperature, sp.ignore_eos, 0.0, arrival_ns))
        return seq

    def abort_request(self, seq_id: int, reason: str) -> Sequence | None:
        """Between steps: see Scheduler.abort. None when the sequence is in no queue."""
        self.scheduler.begin_step(self.num_steps)   # its events belong to the step they precede
        return self.scheduler.abort(seq_id, reason)

    def step(self) -> tuple[list[Sequence], list[Sequence], bool]:
        """One engine step; returns (scheduled, finished, is_prefill)."""
        self.scheduler.begin_step(self.num_steps)
        t0 = perf_counter_ns()
        seqs, is_prefill = self.scheduler.schedule()
        t1 = perf_counter_ns()
        self.num_batched_tokens = sum(seq.num_scheduled_tokens for seq in seqs)
        token_ids = self.runner.run(seqs, is_prefill)
        t2 = perf_counter_ns()
        finished = self.scheduler.postprocess(seqs, token_ids, is_prefill)
        t3 = perf_counter_ns()
        if self.sink.enabled:
            self.sink.emit(StepEnd(self.num_steps, self.scheduler.block_manager.num_free_blocks,
                                   t1 - t0, t2 - t1, t3 - t2, t0 - self.last_step_end_ns))
        self.last_step_end_ns = t3
        self.num_steps += 1
        return seqs, finished, is_prefill

    def is_finished(self) -> bool:
        return self.scheduler.is_finished()


def build_config(model: str = "", **kwargs) -> Config:
    """Config from keyword arguments; an unknown keyword is an error, not silently dropped."""
    known = Config.__dataclass_fields__
    unknown = sorted(k for k in kwargs if k not in known)
    if unknown:
        raise ConfigError(f"unknown engine argument {unknown[0]!r}")
    return Config(model=model, **kwargs)

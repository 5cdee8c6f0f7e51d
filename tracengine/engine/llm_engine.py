"""The step loop: schedule -> run -> postprocess -> StepEnd.

`LLMEngine` is model-agnostic: it takes any runner with `run(seqs,
is_prefill) -> token ids`, so the replayer drives this same loop with the
recorded tokens. `LLM` builds the real model runner; torch is imported only
there.

Requests may arrive over time: `add_request(..., arrival_ns=t)` with t in
the future holds the request until the clock (from the run's start) reaches
it; each step first adds the requests that have arrived, and when nothing is
runnable it sleeps until the next arrival instead of running empty steps."""
import heapq
from time import perf_counter_ns, sleep

import msgspec

from tracengine.engine.config import Config
from tracengine.errors import ConfigError
from tracengine.trace.events import RequestAdded, StepEnd
from tracengine.trace.sinks import NULL_SINK, EventSink
from tracengine.engine.sampling_params import SamplingParams
from tracengine.engine.policies import block_rules, policy_path, scheduler_class
from tracengine.engine.sequence import Sequence
from tracengine.engine.spec_decode import spec_decoding


class LLMEngine:

    def __init__(self, config: Config, runner, sink: EventSink = NULL_SINK, tokenizer=None,
                 policy: type | str | None = None):
        """`policy`: a Scheduler subclass or a name to load (engine/policies.py); None: the built-in
        policy `config.scheduling_policy` names. The config records the policy's name and block rules."""
        self.scheduler_class = scheduler_class(config, policy)
        name, rules = policy_path(self.scheduler_class), block_rules(self.scheduler_class, config)
        if (config.scheduling_policy, config.block_rules) != (name, rules):
            config = config.replace(scheduling_policy=name, block_rules=rules)
        self.config = config
        self.runner = runner
        self.tokenizer = tokenizer
        # speculative decoding: None when off; drafts come from the runner's proposer where it
        # has one (re-execution feeds the recorded drafts back), else from the config's
        self.spec = spec_decoding(config)
        self.proposer = getattr(runner, "proposer", None) or self.spec
        self.reset(sink)

    def reset(self, sink=NULL_SINK):
        """A fresh scheduler and block manager (empty prefix cache), steps and ids from 0."""
        self.sink = sink
        self.scheduler = self.scheduler_class(self.config, sink)
        self.num_steps = 0
        self.next_seq_id = 0
        self.num_batched_tokens = 0   # tokens computed in the last step
        self.start_ns = perf_counter_ns()   # the run's time origin: arrivals and step starts count from it
        self.last_step_start_ns = self.last_step_end_ns = self.start_ns
        self.pending: list[tuple[int, int, Sequence]] = []   # heap of (arrival_ns, seq_id, seq) still to come
        self.session_turns: dict[int, tuple] = {}   # seq_id -> its session turn, recorded when it enters

    def restart_clock(self):
        """Time from now: an idle engine that has run no step yet starts its run's clock again."""
        assert self.num_steps == 0 and self.is_finished()
        self.start_ns = self.last_step_end_ns = perf_counter_ns()

    def add_request(self, prompt: str | list[int], sampling_params: SamplingParams | None = None,
                    seq_id: int | None = None, arrival_ns: int | None = None, session: tuple | None = None) -> Sequence:
        """`arrival_ns`: ns from the start of the run (default: now). A request whose
        arrival time is still to come enters the waiting queue at the first step that starts
        after it; one that arrived earlier (a server's queue) enters now, and keeps its time.
        `session`: a turn of a session, (session_id, turn, depends_on, think_ns) as its
        RequestAdded records it (workload/sessions.session_turn); None: not in one."""
        sp = sampling_params if sampling_params is not None else SamplingParams()
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt   # Sequence copies it
        seq = Sequence(self.next_seq_id if seq_id is None else seq_id, token_ids,
                       self.config.kvcache_block_size, sp)
        self.scheduler.check_request(seq.num_prompt_tokens, seq.max_tokens)
        self.next_seq_id = max(self.next_seq_id, seq.seq_id + 1)
        if session is not None:
            self.session_turns[seq.seq_id] = session
        now_ns = self.clock_ns()
        arrival_ns = now_ns if arrival_ns is None else arrival_ns
        if arrival_ns > now_ns:
            heapq.heappush(self.pending, (arrival_ns, seq.seq_id, seq))
        else:
            self.enter(seq, arrival_ns)
        return seq

    def clock_ns(self) -> int:
        """Now, in ns from the run's start: what decides whether a request has arrived yet."""
        return perf_counter_ns() - self.start_ns

    def abort_request(self, seq_id: int, reason: str) -> Sequence | None:
        """Between steps: see Scheduler.abort. None when the sequence is in no queue. A request
        whose arrival is still to come is dropped before it enters (the trace never saw it)."""
        for i, (_, pending_id, seq) in enumerate(self.pending):
            if pending_id == seq_id:
                self.session_turns.pop(seq_id, None)
                self.pending.pop(i)
                heapq.heapify(self.pending)
                return seq
        self.scheduler.begin_step(self.num_steps)   # its events belong to the step they precede
        return self.scheduler.abort(seq_id, reason)

    def enter(self, seq: Sequence, arrival_ns: int):
        self.scheduler.add(seq)
        session = self.session_turns.pop(seq.seq_id, None) if self.session_turns else None
        if self.sink.enabled:
            prompt = seq.prompt_token_ids
            hash_ids = (prompt.hash_ids, prompt.num_tokens, prompt.block_tokens) if not seq.has_tokens else ([], 0, 0)
            event = RequestAdded(self.num_steps, seq.seq_id, [] if hash_ids[0] else prompt, seq.max_tokens,
                                 seq.temperature, seq.ignore_eos, 0.0, arrival_ns, seq.top_k, seq.top_p,
                                 -1 if seq.seed is None else seq.seed, *hash_ids)
            if session is not None:
                session_id, turn, depends_on, think_ns = session
                event = msgspec.structs.replace(event, session_id=session_id, turn=turn,
                                                depends_on=depends_on, think_ns=think_ns)
            self.sink.emit(event)

    def admit_arrivals(self, now: int) -> int:
        """Add the requests that have arrived by `now` (perf_counter ns); when nothing is
        runnable, first sleep until the next arrival. Returns the time the step starts."""
        pending = self.pending
        if self.scheduler.is_finished():
            wake = self.start_ns + pending[0][0]
            while now < wake:       # idle: no empty steps, no spinning
                sleep((wake - now) / 1e9)
                now = perf_counter_ns()
        arrived_ns = now - self.start_ns
        while pending and pending[0][0] <= arrived_ns:
            arrival_ns, _, seq = heapq.heappop(pending)
            self.enter(seq, arrival_ns)
        return now

    def step(self) -> tuple[list[Sequence], list[Sequence], bool]:
        """One engine step; returns (scheduled, finished, is_prefill)."""
        self.scheduler.begin_step(self.num_steps)
        t0 = perf_counter_ns()
        if self.pending:
            t0 = self.admit_arrivals(t0)
        tier = self.scheduler.cpu_tier
        if tier is not None:
            tier.begin_step(self.num_steps, self.transfer_clock_ns(t0))
        seqs, is_prefill = self.scheduler.schedule()
        t1 = perf_counter_ns()
        self.num_batched_tokens = sum(seq.num_scheduled_tokens for seq in seqs)
        token_ids = self.runner.run(seqs, is_prefill)
        t2 = perf_counter_ns()
        if self.spec is None:
            finished = self.scheduler.postprocess(seqs, token_ids, is_prefill)
        else:
            finished = self.postprocess_with_drafts(seqs, token_ids, is_prefill)
        t3 = perf_counter_ns()
        if self.sink.enabled:
            self.sink.emit(StepEnd(self.num_steps, self.scheduler.block_manager.num_free_blocks,
                                   t1 - t0, t2 - t1, t3 - t2, t0 - self.last_step_end_ns))
        self.last_step_start_ns, self.last_step_end_ns = t0, t3
        self.num_steps += 1
        return seqs, finished, is_prefill

    def is_finished(self) -> bool:
        return not self.pending and self.scheduler.is_finished()

    def postprocess_with_drafts(self, seqs: list[Sequence], token_ids: list, is_prefill: bool) -> list[Sequence]:
        """postprocess for a config that drafts (`postprocess_drafting`)."""
        return postprocess_drafting(self.scheduler, self.spec, self.proposer, seqs, token_ids, is_prefill)

    def transfer_clock_ns(self, t0: int) -> int:
        """The start of the step (`t0`, perf_counter ns) in ns from the run's start, as a CPU
        tier's transfers count time (re-execution gives the recorded one)."""
        return t0 - self.start_ns


def postprocess_drafting(scheduler, spec, proposer, seqs: list[Sequence], token_ids: list,
                         is_prefill: bool) -> list[Sequence]:
    """`scheduler`'s postprocess for a config that drafts: a sequence that verified drafts has from the
    runner the model's token at each of its positions, of which it keeps what `spec` says;
    then each sequence that sampled and goes on gets its drafts for its next step from `proposer`."""
    for i, seq in enumerate(seqs):
        if seq.spec_token_ids:
            token_ids[i] = spec.kept_tokens(seq, token_ids[i])
    sampled = [seq for seq in seqs if seq.num_cached_tokens + seq.num_scheduled_tokens >= seq.num_tokens]
    finished = scheduler.postprocess(seqs, token_ids, is_prefill)
    scheduler.update_draft_token_ids(sampled, proposer)
    return finished


def build_config(model: str = "", **kwargs) -> Config:
    """Config from keyword arguments; an unknown keyword is an error, not silently dropped."""
    known = Config.__dataclass_fields__
    unknown = sorted(k for k in kwargs if k not in known)
    if unknown:
        raise ConfigError(f"unknown engine argument {unknown[0]!r}")
    return Config(model=model, **kwargs)

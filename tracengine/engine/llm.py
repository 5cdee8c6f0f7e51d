"""`LLM`: the engine on a real model, in the spirit of vLLM and nano-vllm."""
import time
from pathlib import Path

from tracengine.version import __version__
from tracengine.errors import ConfigError, ModelError, RequestError, TracengineError
from tracengine.trace.events import ModelInfo, TraceHeader
from tracengine.trace.sinks import NULL_SINK
from tracengine.engine.llm_engine import LLMEngine, build_config
from tracengine.engine.sampling_params import SamplingParams


class LLM(LLMEngine):

    def __init__(self, model: str = "", record: str | None = None, scheduling_policy: type | str = "prefill_first",
                 **kwargs):
        """`scheduling_policy`: prefill_first, mixed, a Scheduler subclass or its module:Class."""
        requested = build_config(model, **kwargs)
        if requested.num_speculative_tokens and requested.speculative_method == "synthetic":
            raise ConfigError("speculative_method=synthetic drafts no tokens a model can verify: it is for "
                              "simulate and what-ifs; a model drafts with ngram")
        if requested.kv_offloading_size and requested.tensor_parallel_size > 1:
            # each rank holds a shard of the KV heads: its copies would have to travel on the wire too
            raise ConfigError("kv_offloading_size with tensor_parallel_size > 1: the CPU tier copies one "
                              "process's KV cache; run it on one rank")
        from tracengine.model.loader import load_hf_config, resolve_model_dir
        from tracengine.model.registry import check_max_model_len
        from tracengine.runner import make_runner
        self.model_dir = resolve_model_dir(requested.model)
        self.hf_config = load_hf_config(self.model_dir)
        tokenizer = load_tokenizer(self.model_dir)
        eos = tokenizer.eos_token_id if requested.eos == -1 and tokenizer.eos_token_id is not None else requested.eos
        requested = requested.replace(max_model_len=min(requested.max_model_len, self.hf_config.max_position_embeddings),
                                      eos=eos)
        check_max_model_len(self.hf_config, requested.max_model_len)   # before any tensor-parallel worker starts
        runner = make_runner(requested, self.hf_config)
        try:
            # the config the engine runs and records: the requested one with the KV cache the runner sized
            config = requested.replace(num_kvcache_blocks=runner.num_kvcache_blocks)
            if config.kv_offloading_size and not config.kv_bytes_per_token:   # the model's own, every layer
                config = config.replace(kv_bytes_per_token=runner.block_bytes // config.kvcache_block_size)
            super().__init__(config, runner, NULL_SINK, tokenizer, policy=scheduling_policy)
            self.writer = None
            self.last_run = None   # the figures (Stats) of the last generate(summary=True)
            if record:
                self.start_recording(record)
        except BaseException:
            runner.exit()   # tensor-parallel workers must not outlive a failed start
            raise

    def reset(self, sink=NULL_SINK):
        super().reset(sink)
        tier = self.scheduler.cpu_tier
        if tier is not None:       # the tier's blocks are real memory: copied to a host buffer and back
            tier.copier = self.runner.host_kv_buffer(tier.num_blocks)

    def prompt_token_ids(self, prompt, sampling_params: SamplingParams) -> list[int]:
        """The prompt's token ids, checked as the scheduler will check them (vocabulary,
        length, fit), so that a workload can be refused before anything is recorded."""
        if isinstance(prompt, str):
            token_ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)):
            vocab_size = self.hf_config.vocab_size
            bad = next((t for t in prompt if isinstance(t, bool) or not (isinstance(t, int) and 0 <= t < vocab_size)),
                       None)
            if bad is not None:
                raise RequestError(f"token id {bad!r} is outside the model's vocabulary of {vocab_size}")
            token_ids = list(prompt)
        else:
            raise RequestError(f"a prompt is a string or a list of token ids, got {type(prompt).__name__}")
        self.scheduler.check_request(len(token_ids), sampling_params.max_tokens)
        return token_ids

    def add_request(self, prompt, sampling_params=None, seq_id=None, arrival_ns=None, session=None):
        sp = sampling_params if sampling_params is not None else SamplingParams()
        return super().add_request(self.prompt_token_ids(prompt, sp), sp, seq_id, arrival_ns, session)

    def step(self):
        tp = self.runner.tp
        if tp is None:
            return super().step()
        # A worker that dies mid-step breaks a collective: say which one, as a WorkerError.
        with tp.guard(f"step {self.num_steps}"):
            return super().step()

    def trace_header(self) -> TraceHeader:
        import torch
        from tracengine.trace.tracelog import FORMAT_VERSION
        from tracengine.model.registry import architecture_of
        return TraceHeader(
            FORMAT_VERSION, __version__, self.config.to_dict(),
            ModelInfo(Path(self.model_dir).name, str(self.runner.dtype).removeprefix("torch."),
                      architecture_of(self.hf_config)),
            str(self.runner.device), str(torch.__version__), self.config.seed, time.time(),
            self.config.tensor_parallel_size)

    def start_recording(self, path: str):
        """Record from a clean start (empty prefix cache, step 0), so the trace replays on its own."""
        if not self.is_finished():
            raise TracengineError("cannot start recording while requests are in flight")
        from tracengine.trace.tracelog import TraceWriter
        self.writer = TraceWriter(path, self.trace_header())
        self.reset(self.writer)

    def stop_recording(self, error: BaseException | None = None):
        """Close the trace; `error`, the exception that ended the run, is recorded as why (its
        end frame then says failed or interrupted, and `check` tells it from a whole run)."""
        if self.writer is not None:
            if error is not None:
                self.writer.end_with(error)
            self.writer.close()
            self.writer = None
            self.set_sink(NULL_SINK)

    def flush_recording(self):
        """Writes what came between steps since the last one (requests added or aborted) to the
        trace now, not with the next step: a server whose abort leaves the engine idle has no
        next step to wait for (TraceWriter.flush)."""
        if self.writer is not None:
            self.writer.flush()

    def set_sink(self, sink):
        """Where the engine, the scheduler and the block manager emit from now on (no reset)."""
        self.sink = self.scheduler.sink = self.scheduler.block_manager.sink = sink

    def generate(self, prompts: str | list[str] | list[int] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 record: str | None = None, use_tqdm: bool = True, summary: bool = False,
                 arrival_ns: list[int] | None = None, sessions: list | None = None) -> list[dict]:
        """`summary`: leave this run's figures, `tracengine stats`' dict
        (analysis/stats.py), in `last_run` (otherwise None): read back from the
        trace `record` wrote, after the run, or else folded as the events come
        (built only because the summary was asked for: about 2.7 us per sequence
        per step, BENCHMARKS.md; an unasked-for summary costs the step loop nothing).
        `arrival_ns`: each request's arrival in ns from the start of this call
        (default: all at once); the engine adds each when its time comes and sleeps while
        nothing is runnable. `sessions`: a sessions workload's turns (workload/sessions.py), a
        Request per prompt: a first turn is sent at its arrival_ns (from the start of this call),
        a later turn its think time after the turns it depends on finished, on the wall clock,
        its prompt (the turn's own input) after its session's history; a turn never sent (its
        session ended) has no output but a finish_reason of None.

        One output per prompt, in order: prompt, prompt_token_ids, text, token_ids,
        finish_reason, ttft_s and latency_s (seconds from the request's arrival). A string,
        or a list of token ids, is one prompt. Every request is checked before recording
        starts: a refused workload writes nothing."""
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                        and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if not isinstance(sampling_params, list):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise TracengineError(f"{len(prompts)} prompts but {len(sampling_params)} sampling params")
        if arrival_ns is not None:
            if len(arrival_ns) != len(prompts):
                raise TracengineError(f"{len(prompts)} prompts but {len(arrival_ns)} arrival times")
            bad = next((t for t in arrival_ns if isinstance(t, bool) or not isinstance(t, int) or t < 0), None)
            if bad is not None:
                raise TracengineError(f"arrival times are ns from the start, ints >= 0; got {bad!r}")
        self.last_run = None
        token_ids = [self.prompt_token_ids(prompt, sp) for prompt, sp in zip(prompts, sampling_params)]
        if record:
            self.start_recording(record)
        folding = None
        if summary and not record:
            from tracengine.analysis.timeline_sink import RequestTimelineSink
            folding = RequestTimelineSink(self.trace_header(), inner=self.sink, first_step=self.num_steps,
                                          origin_ns=self.last_step_end_ns - self.start_ns if self.num_steps else 0)
            self.set_sink(folding)
        error = None
        try:
            outputs = self._generate(token_ids, sampling_params, use_tqdm, arrival_ns) if sessions is None else \
                self._generate_sessions(token_ids, sampling_params, use_tqdm, sessions)
            for output, prompt in zip(outputs, prompts):
                output["prompt"] = prompt
        except BaseException as exc:
            error = exc
            raise
        finally:
            if folding is not None:
                self.set_sink(folding.inner if folding.inner is not None else NULL_SINK)
            if record:
                self.stop_recording(error)
        if summary:
            from tracengine.analysis.stats import stats
            self.last_run = stats(folding.timeline if folding is not None else record)
        return outputs

    def _generate(self, prompts, sampling_params, use_tqdm, arrival_ns):
        from tracengine.engine.progress import GenerateProgress
        # Times count from this call: a fresh run starts its clock now (not when the model
        # loaded); a run already under way (a recording with earlier steps) offsets them by its age.
        if self.num_steps == 0 and self.is_finished():
            self.restart_clock()
            origin_ns = 0
        else:
            origin_ns = time.perf_counter_ns() - self.start_ns
        if arrival_ns is None:
            added_ns = time.perf_counter_ns()
            seqs = [self.add_request(prompt, sp) for prompt, sp in zip(prompts, sampling_params)]
            arrived_ns = [added_ns] * len(seqs)
        else:
            seqs = [self.add_request(prompt, sp, arrival_ns=origin_ns + t)
                    for prompt, sp, t in zip(prompts, sampling_params, arrival_ns)]
            arrived_ns = [self.start_ns + origin_ns + t for t in arrival_ns]
        first_token_ns: dict[int, int] = {}
        finish_ns: dict[int, int] = {}
        with GenerateProgress(len(seqs), enabled=use_tqdm) as progress:
            while not self.is_finished():
                scheduled, finished, is_prefill = self.step()
                seconds = (self.last_step_end_ns - self.last_step_start_ns) / 1e9   # without idle waits
                progress.update(self.num_batched_tokens, is_prefill, seconds, len(finished))
                if is_prefill:   # a first token ends a prompt; a decode-only step samples none
                    for seq in scheduled:
                        if seq.seq_id not in first_token_ns and seq.num_completion_tokens:
                            first_token_ns[seq.seq_id] = self.last_step_end_ns
                for seq in finished:
                    finish_ns[seq.seq_id] = self.last_step_end_ns

        def since_arrival(times: dict[int, int], seq, arrived_ns: int) -> float | None:
            return (times[seq.seq_id] - arrived_ns) / 1e9 if seq.seq_id in times else None

        return [{"prompt_token_ids": seq.prompt_token_ids,
                 "text": completion_text(self.tokenizer, seq.completion_token_ids),
                 "token_ids": seq.completion_token_ids,
                 "finish_reason": seq.finish_reason, "ttft_s": since_arrival(first_token_ns, seq, t),
                 "latency_s": since_arrival(finish_ns, seq, t)} for seq, t in zip(seqs, arrived_ns)]

    def _generate_sessions(self, prompts, sampling_params, use_tqdm, turns):
        """_generate for a sessions workload: each turn added when its session releases it."""
        from dataclasses import replace

        from tracengine.engine.progress import GenerateProgress
        from tracengine.workload.sessions import SessionRelease, session_turn
        if len(turns) != len(prompts):
            raise TracengineError(f"{len(prompts)} prompts but {len(turns)} session turns")
        if self.num_steps == 0 and self.is_finished():
            self.restart_clock()
            origin_ns = 0
        else:
            origin_ns = time.perf_counter_ns() - self.start_ns
        first_seq_id = self.next_seq_id
        # on the engine's clock: a first turn at its arrival from this call; a later one when released
        release = SessionRelease([replace(r, prompt=p, seq_id=first_seq_id + i, arrival_ns=origin_ns + r.arrival_ns
                                          if not r.depends_on else r.arrival_ns) for i, (r, p) in enumerate(zip(turns, prompts))])
        seqs, arrived_ns, first_token_ns, finish_ns = {}, {}, {}, {}

        def send(index, request):
            seqs[index] = self.add_request(request.prompt, sampling_params[index], seq_id=request.seq_id,
                                           arrival_ns=request.arrival_ns, session=session_turn(request))
            arrived_ns[index] = self.start_ns + request.arrival_ns

        for index, request in iter(release.pop, (0, None)):
            send(index, request)
        with GenerateProgress(len(turns), enabled=use_tqdm) as progress:
            while not self.is_finished():
                scheduled, finished, is_prefill = self.step()
                progress.update(self.num_batched_tokens, is_prefill,
                                (self.last_step_end_ns - self.last_step_start_ns) / 1e9, len(finished))
                if is_prefill:
                    for seq in scheduled:
                        if seq.seq_id not in first_token_ns and seq.num_completion_tokens:
                            first_token_ns[seq.seq_id] = self.last_step_end_ns
                for seq in finished:
                    finish_ns[seq.seq_id] = self.last_step_end_ns
                    for index, request in release.finished(seq, self.last_step_end_ns - self.start_ns):
                        send(index, request)

        def output(index):
            seq = seqs.get(index)
            if seq is None:
                return {"prompt_token_ids": [], "text": "", "token_ids": [], "finish_reason": None,
                        "ttft_s": None, "latency_s": None}
            since = {name: (times[seq.seq_id] - arrived_ns[index]) / 1e9 if seq.seq_id in times else None
                     for name, times in (("ttft_s", first_token_ns), ("latency_s", finish_ns))}
            return {"prompt_token_ids": seq.prompt_token_ids, "text": completion_text(self.tokenizer,
                    seq.completion_token_ids), "token_ids": seq.completion_token_ids,
                    "finish_reason": seq.finish_reason, **since}
        return [output(i) for i in range(len(turns))]

    def close(self):
        self.stop_recording()
        self.runner.exit()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def completion_text(tokenizer, token_ids: list[int]) -> str:
    """A completion's text, as `generate` gives it and `serve` streams it: special tokens
    (the EOS that ends it, among them) mark the text's end, they are not part of it."""
    return tokenizer.decode(token_ids, skip_special_tokens=True)


def load_tokenizer(model_dir: str):
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load the tokenizer of {model_dir}: {str(exc).splitlines()[0]}") from None

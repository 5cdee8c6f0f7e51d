"""Driving SGLang's real scheduler as its normal event loop (`event_loop_normal`) does, with no
model: each iteration takes the requests that have arrived, `get_next_batch_to_run`, and, for a
batch, `run_batch` (the stand-in worker's tokens) and `process_batch_result`; with no batch, the
idle iteration (`on_idle`). A step is an iteration that ran a batch.

    python -m tracengine.sglang.drive WORKLOAD --record PATH [--set NAME=VALUE ...]

runs a workload (simulate's workload flags) through it and records the trace."""
from dataclasses import dataclass

FIRST_TOKEN_ID = 100      # made-up tokens are FIRST_TOKEN_ID .. FIRST_TOKEN_ID + NUM_TOKEN_IDS - 1
NUM_TOKEN_IDS = 900
EOS_TOKEN_ID = 2
FILLER_TOKEN_ID = 0       # past a recorded output


@dataclass
class RequestSpec:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_step: int = 0
    eos_after: int = 0                       # > 0: the model gives EOS as this output token (1: the first)
    output_token_ids: list[int] | None = None    # a recorded request's tokens (what-if), in order
    arrival_ns: int = -1                     # in simulated time (timed.py): when it arrives; -1: not known
    abort_ns: int | None = None              # in simulated time: when its client leaves


def generate_request(rid: str, prompt_token_ids, max_tokens: int, *, ignore_eos: bool = True, temperature: float = 0.0,
                     top_k: int = -1, top_p: float = 1.0, min_tokens: int = 0, stop_token_ids=()):
    """The TokenizedGenerateReqInput SGLang's tokenizer manager sends its scheduler."""
    from array import array

    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams
    params = SamplingParams(max_new_tokens=max_tokens, ignore_eos=ignore_eos, temperature=temperature, top_k=top_k,
                            top_p=top_p, min_new_tokens=min_tokens, stop_token_ids=list(stop_token_ids) or None)
    params.normalize(None)
    return TokenizedGenerateReqInput(
        rid=rid, input_text=None, input_ids=array("q", prompt_token_ids), input_embeds=None, mm_inputs=None,
        token_type_ids=None, sampling_params=params, return_logprob=False, logprob_start_len=-1, top_logprobs_num=0,
        token_ids_logprob=None, stream=False)


def abort_request(rid: str):
    from sglang.srt.managers.io_struct import AbortReq
    return AbortReq(rid=rid)


def has_work(scheduler) -> bool:
    """Whether the next iteration has something to do: requests waiting, running, mid-prefill, in
    the last batch (a prefill batch joins the running batch in the next get_next_batch_to_run),
    or, in the overlap loop, a result not processed yet."""
    return bool(scheduler.waiting_queue) or not scheduler.running_batch.is_empty() \
        or scheduler.chunked_req is not None or scheduler.last_batch is not None \
        or bool(getattr(scheduler, "result_queue", None))


def iterate(scheduler) -> bool:
    """One iteration of SGLang's loop (normal or overlap) after its requests are in: whether it ran a batch."""
    if scheduler.enable_overlap:
        return iterate_overlap(scheduler)
    plan = scheduler.get_next_batch_to_run(running_batch=scheduler.running_batch, last_batch=scheduler.last_batch)
    scheduler.running_batch = plan.running_batch
    batch = plan.batch_to_run
    scheduler.cur_batch_for_debug = batch
    if batch:
        result = scheduler.run_batch(batch)
        scheduler.process_batch_result(batch, result)
    else:
        scheduler._sched_idled = True
        scheduler.on_idle()
    scheduler.last_batch = batch
    return bool(batch)


def iterate_overlap(scheduler) -> bool:
    """One iteration of SGLang's overlap loop (event_loop_overlap's body after ingest_requests):
    the batch chosen is launched, then the last one's result is processed (before the launch
    where the two batches may not overlap); whether it ran a batch."""
    plan = scheduler.get_next_batch_to_run(running_batch=scheduler.running_batch, last_batch=scheduler.last_batch)
    scheduler.running_batch = plan.running_batch
    batch = plan.batch_to_run
    scheduler.cur_batch_for_debug = batch
    disable_overlap = scheduler.is_disable_overlap_for_batch(batch, last_batch=scheduler.last_batch)
    if disable_overlap:
        _process_oldest(scheduler)
    result = None
    if batch:
        result = scheduler.run_batch(batch)
        scheduler._apply_war_barrier()
        scheduler.result_queue.append((batch.copy(), result))
    else:
        scheduler._sched_idled = True
    if scheduler.last_batch:
        if not disable_overlap:
            _process_oldest(scheduler)
    elif batch is None:
        scheduler.on_idle()
    if scheduler.is_generation:
        scheduler.launch_batch_sample_if_needed(result, batch)
    scheduler.last_batch = batch
    return bool(batch)


def _process_oldest(scheduler) -> None:
    batch, result = scheduler.result_queue.popleft()
    scheduler.process_batch_result(batch, result)


class Tokens:
    """The token a request's model gives at each output position: a spec's recorded tokens, EOS
    where a spec says, else a made-up token that stops nothing."""

    def __init__(self, specs: list[RequestSpec]):
        self.by_id = {spec.request_id: (i, spec) for i, spec in enumerate(specs)}
        self.past_output: set[str] = set()   # requests that asked for a token past their recorded output

    def __call__(self, req, position: int) -> int:
        index, spec = self.by_id[req.rid]
        if spec.output_token_ids is not None:
            if position < len(spec.output_token_ids):
                return spec.output_token_ids[position]
            self.past_output.add(req.rid)
            return FILLER_TOKEN_ID
        if spec.eos_after and position + 1 >= spec.eos_after:
            return EOS_TOKEN_ID
        return FIRST_TOKEN_ID + (index * 31 + position) % NUM_TOKEN_IDS


def run(scheduler, specs: list[RequestSpec], *, aborts: dict | None = None, max_steps: int = 100_000) -> int:
    """Runs `specs` through `scheduler` (built with `Tokens(specs)`) until nothing is left; returns
    the number of steps. A request arrives before the step its `arrival_step` names (an idle
    scheduler skips ahead to the next arrival); `aborts[k]`: request ids aborted before step k."""
    from tracengine.errors import ConfigError
    aborts = aborts or {}
    pending = sorted(specs, key=lambda s: s.arrival_step)
    num_steps = tick = 0
    while num_steps < max_steps:
        if not has_work(scheduler):
            if not pending:
                return num_steps
            iterate(scheduler)           # the idle iteration before the next arrival
            tick = max(tick, pending[0].arrival_step)
        arrived = []
        while pending and pending[0].arrival_step <= tick:
            spec = pending.pop(0)
            arrived.append(generate_request(spec.request_id, spec.prompt_token_ids, spec.max_tokens,
                                            ignore_eos=not spec.eos_after))
        arrived += [abort_request(rid) for rid in aborts.pop(num_steps, ())]
        if arrived:
            scheduler.process_input_requests(arrived)
        if not has_work(scheduler):
            continue
        in_flight = bool(getattr(scheduler, "result_queue", None))   # the overlap loop's: its frees may be due
        if iterate(scheduler):
            num_steps += 1
            tick += 1
        elif scheduler.waiting_queue and scheduler.running_batch.is_empty() and scheduler.chunked_req is None \
                and not pending and not in_flight:
            request = scheduler.waiting_queue[0]
            raise ConfigError(f"SGLang's scheduler can never run request {request.rid} "
                              f"({len(request.origin_input_ids)} tokens) with {scheduler.max_total_num_tokens} "
                              f"token slots: give more max_total_tokens")
    raise RuntimeError(f"the scheduler did not finish in {max_steps} steps")


def record_workload(config: dict, specs: list[RequestSpec], **drive) -> list:
    """The events (header first) of `specs` through SGLang's scheduler for `config` (build.default_config's)."""
    from tracengine.sglang.build import build_scheduler
    from tracengine.sglang.header import trace_header
    from tracengine.sglang.recorder import record_to, stop_recording
    from tracengine.trace.sinks import ListSink
    scheduler = build_scheduler(config, Tokens(specs))
    header = trace_header(scheduler)
    sink = ListSink()
    recorder = record_to(scheduler, sink, header.created_at)
    recorder.arrival_ns.update((spec.request_id, spec.arrival_ns) for spec in specs)
    try:
        run(scheduler, specs, **drive)
    finally:
        stop_recording(scheduler)
    return [header] + sink.events


if __name__ == "__main__":
    # The command's front end (its flags are the other commands') is the command line's, a layer
    # above this one: run as its own process, so that this module reads only the layers below it.
    import os
    import sys
    os.execv(sys.executable, [sys.executable, "-m", "tracengine.cli.sglang_drive", *sys.argv[1:]])

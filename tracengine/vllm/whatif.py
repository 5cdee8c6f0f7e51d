"""What-if with vLLM's own scheduler: a vLLM trace's workload (prompts, the
steps they arrived at, their sampling parameters, aborts and each request's
recorded output tokens) run again through vLLM's scheduler under another
config, driven as vLLM's engine core drives it (drive.py). The outputs do not
depend on the schedule, so only the scheduling changes, and the new trace is
the one vLLM's scheduler would record running that workload under that
config.

An abort comes back at the step it came; one that came while a step was in
flight (between its schedule and its update, with as many steps in flight as
the engine core keeps) comes back in flight again. Requests arrive before the
step they arrived at in the recording."""
import time
from dataclasses import dataclass

import msgspec

from tracengine.replay.whatif import StepWorkload, WhatIfResult, whatif_in_steps
from tracengine.trace.events import RequestAdded, SeqAbort, TokenSample
from tracengine.trace.tracelog import split_header
from tracengine.vllm.answers import refuse_whatif
from tracengine.vllm.drive import RequestSpec
from tracengine.vllm.replay import lora_request


@dataclass
class VllmWorkload:
    header: object
    specs: list[RequestSpec]
    aborts: dict[int, list[str]]            # step -> request ids aborted before it is scheduled
    in_step_aborts: dict[int, list[str]]    # step -> request ids aborted while it is in flight
    events: list                            # the recording, TraceHeader first


def extract_workload(events, in_time: bool = False) -> VllmWorkload:
    """`in_time`: for a what-if in simulated time (which runs native CPU offloading's connector)."""
    events = list(events)
    header, it = split_header(events)
    refuse_whatif(header, events, in_time)   # a connector's and grammars' answers hold for the recorded schedule
    batch_queue_size = 2 if header.config.get("scheduler_kind") == "async" else 1
    specs: dict[int, RequestSpec] = {}
    aborts: dict[int, list[str]] = {}
    in_step_aborts: dict[int, list[str]] = {}
    last_kept = None
    for e in it:
        t = type(e)
        if t is TokenSample:
            # one not kept after a kept one of its step: an accepted draft past the request's stop,
            # which vLLM cut (a step's output not kept at all: a preempted request's, dropped)
            if e.kept or last_kept == (e.step, e.seq_id):
                specs[e.seq_id].output_token_ids.append(e.token_id)
                last_kept = (e.step, e.seq_id)
        elif t is RequestAdded:
            specs[e.seq_id] = RequestSpec(
                e.request_id, list(e.prompt_token_ids), e.max_tokens, arrival_step=e.step, priority=e.priority,
                output_token_ids=[], arrival_time=e.arrival_time, arrival_ns=e.arrival_ns, sampling=dict(
                    ignore_eos=e.ignore_eos, eos_token_id=None if e.eos_token_id == -1 else e.eos_token_id,
                    temperature=e.temperature, top_k=max(e.top_k, 0), top_p=e.top_p,
                    seed=None if e.seed == -1 else e.seed, min_tokens=e.min_tokens,
                    stop_token_ids=list(e.stop_token_ids)), request_options=lora_request(e) or None)
        elif t is SeqAbort:
            request_id = specs[e.seq_id].request_id
            if e.num_steps_in_flight >= batch_queue_size:
                in_step_aborts.setdefault(e.step - e.num_steps_in_flight, []).append(request_id)
            else:
                aborts.setdefault(e.step, []).append(request_id)
    if header.config.get("speculative_method"):      # each request's recorded drafts (spec.py)
        from tracengine.vllm.spec import Drafts, recorded_drafts
        drafts = recorded_drafts(events, batch_queue_size > 1)
        for seq_id, spec in specs.items():
            spec.drafts = drafts.get(seq_id) or Drafts()
    return VllmWorkload(header, list(specs.values()), aborts, in_step_aborts, events)


def run_workload(workload: VllmWorkload, config: dict, past_output: set | None = None) -> list:
    """The workload through vLLM's scheduler under `config` (a header's): the new trace's events."""
    from tracengine.trace.sinks import ListSink
    from tracengine.vllm.build import build_scheduler
    from tracengine.vllm.header import trace_header
    from tracengine.vllm.drive import run
    scheduler = build_scheduler(config)
    header = trace_header(scheduler)
    sink = ListSink()
    scheduler.record_to(sink, header.created_at)
    max_steps = 100 * max(sum(1 for e in workload.events if type(e).__name__ == "StepEnd"), 1) + 10_000
    run(scheduler, workload.specs, aborts=workload.aborts, in_step_aborts=workload.in_step_aborts,
        max_steps=max_steps, past_output=past_output)
    scheduler.shutdown()
    # the recorded model, as what-if keeps it (the scheduler built here has none)
    return [msgspec.structs.replace(header, model=workload.header.model, created_at=time.time())] + sink.events


class VllmStepReplay(StepWorkload):
    """A vLLM trace's workload ready to run at recorded steps through vLLM's scheduler under
    any config (replay/whatif.whatif_in_steps), driven as its engine core drives it."""

    def __init__(self, events):
        from tracengine.vllm.replay import check_vllm_version
        self.workload = extract_workload(events)
        check_vllm_version(self.workload.header)
        self.header = self.workload.header
        self.recorded_run = self.workload.events

    def config(self, overrides: dict) -> dict:
        from tracengine.vllm.build import apply_overrides
        return apply_overrides(self.header.config, overrides)

    def check(self, overrides: dict) -> None:
        """A config vLLM refuses is refused here (its scheduler built once)."""
        from tracengine.vllm.build import build_scheduler
        build_scheduler(self.config(overrides), record="").shutdown()

    def run(self, config: dict, policy=None) -> tuple[list, int]:
        """`policy` is tracengine's, never given here."""
        past_output: set = set()
        return run_workload(self.workload, config, past_output), len(past_output)


def whatif(events, overrides: dict) -> WhatIfResult:
    return whatif_in_steps(VllmStepReplay(events), overrides)

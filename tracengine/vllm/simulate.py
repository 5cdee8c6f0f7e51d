"""`tracengine simulate WORKLOAD --scheduler vllm`: a workload through vLLM's
own scheduler in simulated time, recorded as a trace of vLLM's scheduler.

The loop is sim/engine.py's, with vLLM's Scheduler (synchronous: a simulated
step is schedule, model, update) in place of tracengine's: a step starts the
step-time model's gap after the last one ended, or, when nothing is queued,
its wake-up time after the next arrival; every request that has arrived by a
step's start is added before it; each step lasts what the step-time model
says for its batch. Tokens are made up (no EOS: each request runs to its
max_tokens). Each StepEnd holds the simulated durations and gap, each
RequestAdded its arrival time, so stats, tui, diff and export read the trace,
and `tracengine replay` re-executes it through vLLM's scheduler."""
from tracengine.sim.steptime import step_shape
from tracengine.trace.events import prefill_flags


def simulate(config: dict, requests, step_time, sink) -> int:
    """Runs `requests` (engine.request.Request, token prompts with arrival_ns) through vLLM's scheduler
    under `config` (a vLLM header's); the events go to `sink` (its TraceHeader is the caller's:
    `header(config)`). Returns the number of steps."""
    from tracengine.vllm.build import build_scheduler
    from tracengine.vllm.drive import make_request, model_output, sampling_req_ids
    scheduler = build_scheduler({**config, "scheduler_kind": "sync"})
    recorder = scheduler.record_to(sink, created_at=0.0)
    clock = {"now_ns": 0, "last_end_ns": 0}

    def step_times(decision) -> tuple[int, int, int, int]:
        flags = prefill_flags(decision)
        is_prefill = any(flags)
        shape = step_shape((s.num_tokens, s.num_cached_tokens) for s in decision.seqs)
        schedule_ns, model_ns, postprocess_ns = step_time.predict(is_prefill, *shape,
                                                                  mixed=is_prefill and not all(flags))
        gap_ns = clock["now_ns"] - clock["last_end_ns"]
        clock["last_end_ns"] = clock["now_ns"] = clock["now_ns"] + schedule_ns + model_ns + postprocess_ns
        return schedule_ns, model_ns, postprocess_ns, gap_ns

    recorder.step_times = step_times
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_ns)
    hash_algo, block_size = config["prefix_caching_hash_algo"], config["block_size"]
    i = num_steps = 0
    while i < len(order) or scheduler.has_requests():
        start = clock["now_ns"] + step_time.gap_ns if num_steps else step_time.gap_ns
        if not scheduler.has_requests():       # it sleeps until the next arrival, and wakes late
            start = max(start, requests[order[i]].arrival_ns + step_time.wake_ns)
        clock["now_ns"] = start
        while i < len(order) and requests[order[i]].arrival_ns <= start:
            r = requests[order[i]]
            scheduler.add_request(make_request(f"r{order[i]}", r.prompt, max_tokens=r.max_tokens,
                                               arrival_time=r.arrival_ns / 1e9, block_size=block_size,
                                               hash_algo=hash_algo, temperature=r.temperature))
            i += 1
        out = scheduler.schedule()
        tokens = {req_id: [100 + scheduler.requests[req_id].num_output_tokens % 900]
                  for req_id in sampling_req_ids(scheduler, out)}
        scheduler.update_from_output(out, model_output(out.num_scheduled_tokens, tokens))
        num_steps += 1
    scheduler.shutdown()
    return num_steps


def header(config: dict, step_time):
    """The TraceHeader of a simulation: vLLM's scheduler for `config`, the step-time model's source."""
    import msgspec

    from tracengine.trace.events import ModelInfo
    from tracengine.vllm.build import build_scheduler, trace_header
    head = trace_header(build_scheduler({**config, "scheduler_kind": "sync"}))
    source = getattr(step_time, "source", None) or {}
    return msgspec.structs.replace(head, created_at=0.0, device=f"simulated ({step_time.kind})", model=ModelInfo(
        source.get("model", "") or "synthetic", source.get("dtype", "none"), "simulated"))

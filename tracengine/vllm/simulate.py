"""`tracengine simulate WORKLOAD --scheduler vllm`: a workload through vLLM's
own scheduler in simulated time (timed.py's loop), recorded as a trace of
vLLM's scheduler. Tokens are made up (no EOS: each request runs to its
max_tokens). Each StepEnd holds the simulated durations and gap, each
RequestAdded its arrival time, so stats, tui, diff and export read the trace,
and `tracengine replay` re-executes it through vLLM's scheduler."""
from tracengine.vllm.drive import RequestSpec


def workload_specs(requests) -> list[RequestSpec]:
    """engine.request.Request (token prompts with arrival_ns) as the specs timed.py runs: request
    r{i} for the workload's i-th, vLLM's arrival_time on the simulation's clock."""
    return [RequestSpec(f"r{i}", list(r.prompt), r.max_tokens, arrival_ns=r.arrival_ns,
                        arrival_time=r.arrival_ns / 1e9, sampling=dict(temperature=r.temperature))
            for i, r in enumerate(requests)]


def simulate(config: dict, requests, step_time) -> list:
    """Runs `requests` through vLLM's scheduler under `config` (a vLLM header's): the events,
    header first."""
    from tracengine.vllm.offloading import with_model_kv_bytes
    from tracengine.vllm.timed import run_config
    return run_config(with_model_kv_bytes(config, step_time), workload_specs(requests), step_time)


class VllmSimulation:
    """How `simulate --scheduler vllm` runs vLLM's scheduler, for sim/sweep.SimulateVariant."""

    @staticmethod
    def check(fields: dict, requests: list) -> None:
        from tracengine.vllm.build import build_scheduler
        build_scheduler(fields, record="", live_offloading=True).shutdown()

    @staticmethod
    def run(fields: dict, requests: list, step_time) -> list:
        return simulate(fields, requests, step_time)

"""`tracengine simulate WORKLOAD --scheduler sglang`: a workload through SGLang's own scheduler
in simulated time (timed.py's loop), recorded as a trace of SGLang's scheduler. Tokens are made
up (no EOS: each request runs to its max_tokens). Each StepEnd holds the simulated durations
and gap, each RequestAdded its arrival time, so stats, tui, diff and export read the trace, and
`tracengine replay` re-executes it through SGLang's scheduler."""
from tracengine.sglang.drive import RequestSpec


def workload_specs(requests) -> list[RequestSpec]:
    """engine.request.Request (token prompts with arrival_ns) as the specs timed.py runs: request
    r{i} for the workload's i-th, its number zero-padded (SGLang aborts every request whose id
    starts with the id given: r1's would take r10 with it)."""
    width = len(str(max(len(requests) - 1, 0)))
    return [RequestSpec(f"r{i:0{width}d}", list(r.prompt), r.max_tokens, arrival_ns=r.arrival_ns)
            for i, r in enumerate(requests)]


def simulate(config: dict, requests, step_time) -> list:
    """Runs `requests` through SGLang's scheduler under `config` (an SGLang header's): the events,
    header first."""
    from tracengine.sglang.timed import run_config
    return run_config(config, workload_specs(requests), step_time)[0]


class SglangSimulation:
    """How `simulate --scheduler sglang` runs SGLang's scheduler, for sim/sweep.SimulateVariant."""

    @staticmethod
    def check(fields: dict, requests: list) -> None:
        from tracengine.sglang.build import check_config
        check_config(fields)

    @staticmethod
    def run(fields: dict, requests: list, step_time) -> list:
        return simulate(fields, requests, step_time)

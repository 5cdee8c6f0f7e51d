"""`python -m tracengine.sglang.drive WORKLOAD --record PATH [--set NAME=VALUE ...]`: a workload
(simulate's workload flags) through SGLang's real scheduler on the CPU with no model
(tracengine/sglang/drive.py), recorded as a trace. A request arrives before step
arrival_ns // --step-ms (0 for a workload with no arrival times)."""
import argparse
import sys

from tracengine.cli.common import EXIT_OK
from tracengine.cli.flags import DEFAULT_VOCAB_SIZE, add_synthetic_arguments, add_workload_arguments, workload_spec
from tracengine.errors import TracengineError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tracengine.sglang.drive",
                                description="Run a workload through SGLang's scheduler on the CPU, no model, "
                                            "and record its trace.")
    p.add_argument("workload_file", nargs="?", metavar="WORKLOAD", help="a workload file (docs/workloads.md)")
    p.add_argument("--record", metavar="PATH", required=True, help="the trace to write")
    p.add_argument("--force", action="store_true", help="overwrite the --record file if it exists")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="an SGLang config field (tracengine/sglang/build.py: chunked_prefill_size, "
                        "max_total_tokens, max_running_requests, schedule_policy, ...)")
    p.add_argument("--step-ms", type=float, default=10.0, help="ms of arrival time per step (default 10)")
    add_synthetic_arguments(p.add_argument_group("synthetic workload"))
    add_workload_arguments(p)
    return p


def run(args) -> int:
    from tracengine.cli.outputs import check_outputs
    from tracengine.cli.sglang_backend import sglang_overrides
    from tracengine.sglang import require_sglang
    from tracengine.sglang.build import default_config
    from tracengine.sglang.drive import RequestSpec, record_workload
    from tracengine.trace.tracelog import write_trace
    from tracengine.workload.sources import workload_requests
    require_sglang("python -m tracengine.sglang.drive runs SGLang's scheduler")
    workload = args.workload_file or args.workload
    if not workload and args.num_prompts is None and not args.prompt_lens:
        raise TracengineError("give a WORKLOAD file, --num-prompts or --prompt-lens")
    check_outputs({"--record": args.record}, {"WORKLOAD": workload}, args.force)
    config = default_config()
    config = {**config, **sglang_overrides(args.set, config)}
    requests = workload_requests(workload_spec(args, workload=workload), DEFAULT_VOCAB_SIZE)
    step_ns = args.step_ms * 1e6
    specs = []
    for i, request in enumerate(requests):
        if not isinstance(request.prompt, list):
            raise TracengineError(f"request {i} has a text prompt; the driver takes token ids")
        arrival_step = int(request.arrival_ns // step_ns) if request.arrival_ns > 0 else 0
        specs.append(RequestSpec(f"r{i}", list(request.prompt), request.max_tokens, arrival_step=arrival_step,
                                 eos_after=0 if request.ignore_eos else request.max_tokens + 1))
    events = record_workload(config, specs)
    write_trace(args.record, events)
    num_steps = sum(1 for e in events if type(e).__name__ == "StepEnd")
    print(f"ran {len(specs):,} requests through SGLang {events[0].engine_version}'s scheduler in {num_steps:,} steps; "
          f"wrote {args.record}")
    return EXIT_OK


def main(argv=None) -> int:
    from tracengine.cli.main import exit_code_of
    args = build_parser().parse_args(argv)
    return exit_code_of(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())

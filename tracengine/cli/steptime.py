"""The step-time flags of the commands that run in simulated time (replay's what-if,
simulate, sweeps): which model times a step (a calibrated one or a roofline), and how the
commands name it."""
import os
import sys

from tracengine.errors import TracengineError


def add_step_time_arguments(p):
    g = p.add_argument_group("step time (simulated time; docs/simulation.md)")
    g.add_argument("--step-time", metavar="FILE", help="a step-time model from `tracengine calibrate` (JSON)")
    g.add_argument("--roofline", metavar="CONFIG", help="a roofline from a model's config.json (or its directory)")
    g.add_argument("--hardware", help="roofline hardware preset: H200, H100, H100-PCIe, A100 (any case)")
    g.add_argument("--peak-tflops", type=float, metavar="X", help="roofline peak dense TFLOP/s (overrides the preset)")
    g.add_argument("--bandwidth-tbs", type=float, metavar="X", help="roofline memory bandwidth in TB/s")
    g.add_argument("--overhead-ms", type=float, metavar="X", help="roofline fixed time per step (default 1 ms)")


def input_files(args) -> dict:
    """The files a replay or simulate command reads, by name, for check_outputs: no output is one of them."""
    roofline = getattr(args, "roofline", None)
    if roofline and os.path.isdir(roofline):
        roofline = os.path.join(roofline, "config.json")
    workload = getattr(args, "workload_file", None) or getattr(args, "workload", None)
    return {"trace": getattr(args, "trace", None), "workload file": workload,
            "step-time model": getattr(args, "step_time", None), "model config": roofline}


def step_time_from_args(args):
    """The model the flags name, or None (a what-if then calibrates on its own trace)."""
    from tracengine.sim.steptime import load_step_time
    hardware_flags = any(getattr(args, name, None) is not None
                         for name in ("hardware", "peak_tflops", "bandwidth_tbs", "overhead_ms"))
    if args.step_time and args.roofline:
        raise TracengineError("give one of --step-time and --roofline")
    if args.step_time:
        if hardware_flags:
            raise TracengineError("--hardware, --peak-tflops, --bandwidth-tbs and --overhead-ms shape a --roofline")
        return load_step_time(args.step_time)
    if args.roofline:
        from tracengine.sim.roofline import ModelShape, RooflineStepTime    # only a roofline's run reads a model config
        return RooflineStepTime.for_hardware(ModelShape.from_file(args.roofline), args.hardware, args.peak_tflops,
                                             args.bandwidth_tbs, args.overhead_ms)
    if hardware_flags:
        raise TracengineError("--hardware, --peak-tflops, --bandwidth-tbs and --overhead-ms shape a --roofline")
    return None


def describe_step_time(model, trace_path: str = "") -> str:
    if model.kind == "roofline":
        return (f"roofline of {model.model.name or 'the model'} on {model.hardware} "
                f"({model.peak_flops / 1e12:g} TFLOP/s, {model.bandwidth / 1e12:g} TB/s, "
                f"{model.overhead_ns / 1e6:g} ms per step)")
    src = model.source
    where = f"calibrated on {src.get('trace') or trace_path or 'a trace'}"
    return f"linear model {where} ({src.get('model', '?')} on {src.get('device', '?')}, {src.get('dtype', '?')})"


def print_unvaried_note(model):
    """The features the model's calibration recording never varied: the self-check cannot show
    what a what-if that varies them gets wrong. And on stderr, a fit that misses its own recording."""
    from tracengine.sim.fit_check import poor_fit_warning
    from tracengine.sim.steptime import unvaried_note
    note = unvaried_note(model)
    if note:
        print(note)
    warning = poor_fit_warning(model)
    if warning:
        print(f"tracengine: warning: {warning}", file=sys.stderr)


def step_time_json(model, trace_path: str = "") -> dict:
    return {"kind": model.kind, "description": describe_step_time(model, trace_path), **model.to_dict()}

"""`tracengine calibrate`: a step-time model fitted to a recorded trace."""
import os
import sys

from tracengine.cli.common import EXIT_OK, add_parser
from tracengine.cli.outputs import check_outputs, note_torn_tail


def add_to(sub):
    p = add_parser(sub, "calibrate", "fit a step-time model to a recorded trace",
                   "Fit each step's duration (schedule + model + postprocess, and each part) to its shape\n"
                   "per phase: tokens computed, sequences, context tokens read, (query, key) pairs scored.\n"
                   "Prints the error per step and on the total, on held-out steps (docs/simulation.md).")
    p.add_argument("trace", help="the recorded trace")
    p.add_argument("-o", "--output", metavar="FILE", help="write the model as JSON (for --step-time)")
    p.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    p.set_defaults(run=run)


def run(args) -> int:
    from tracengine.sim.fit_check import poor_fit_warning, simulated_trace_warning
    from tracengine.sim.steptime import FEATURES, PARTS, PHASES, calibrate, save, unvaried_note
    from tracengine.trace.tracelog import TraceReader
    check_outputs({"--output": args.output}, {"trace": args.trace}, args.force)
    with TraceReader(args.trace) as reader:
        model = calibrate(reader.events(), os.path.basename(args.trace))
        note_torn_tail(reader)
    src, err = model.source, model.error
    print(f"calibrated on {args.trace}: {src['num_steps']} steps of {src['model']} on {src['device']} ({src['dtype']})")
    for label, e in (("held-out steps (every 5th, fitted without them)", err["held_out"]),
                     ("all steps (the saved fit)", err["all_steps"])):
        print(f"{label}: {e['num_steps']} steps")
        for name, title in (("total", "step time"), ("model", "model part")):
            f = e[name]
            print(f"  {title:<10} per step: median error {f['median_abs_ms']:.3f} ms ({f['median_rel']:.1%}), "
                  f"mean {f['mean_abs_ms']:.3f} ms; total {f['predicted_ms']:,.1f} ms predicted vs "
                  f"{f['recorded_ms']:,.1f} ms recorded ({f['total_rel']:+.1%})")
    print(f"loop gap between busy steps: {model.gap_ns / 1e6:.3f} ms; from an arrival to the step it wakes "
          f"an idle engine for: {model.wake_ns / 1e6:.3f} ms")
    print("coefficients, ns per unit: " + ", ".join(FEATURES))
    for phase in PHASES:
        for part in PARTS:
            weights = model.coefficients[phase][part]
            print(f"  {phase:<7} {part:<14} " + "  ".join(f"{w:>12.4g}" for w in weights))
    note = unvaried_note(model)
    if note:
        print(note)
    for warning in (simulated_trace_warning(model), poor_fit_warning(model)):
        if warning:
            print(f"tracengine: warning: {warning}", file=sys.stderr)
    if args.output:
        save(model, args.output)
        print(f"wrote {args.output}")
    return EXIT_OK

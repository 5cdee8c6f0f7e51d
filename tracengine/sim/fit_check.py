"""What a calibrated step-time model says against trusting it, from its `source` and `error`
(sim/steptime.py): a fit that misses the steps of its own recording, and a fit to a simulated
trace. `calibrate` prints both; the commands that use a model print the first (cli/steptime.py)."""

# The median error per step on the recording the model was fitted to, past which the fit is
# poor: on quiet CPU recordings it is about 14% (BENCHMARKS.md), several times that on one made
# while another process held the CPU, whose simulated totals then fall far short.
POOR_FIT_MEDIAN_REL = 0.5


def poor_fit_warning(model) -> str | None:
    """One line when a linear model's median error per step on its own recording (all steps,
    the saved fit) is past POOR_FIT_MEDIAN_REL; None otherwise (a roofline, a hand-made model)."""
    error = (getattr(model, "error", None) or {}).get("all_steps") or {}
    total = error.get("total") if isinstance(error, dict) else None
    median_rel = total.get("median_rel") if isinstance(total, dict) else None
    if not isinstance(median_rel, (int, float)) or median_rel <= POOR_FIT_MEDIAN_REL:
        return None
    trace = (getattr(model, "source", None) or {}).get("trace") or "its recording"
    return (f"the step-time model fits {trace} poorly: median error {median_rel:.0%} per step "
            f"(steps of one shape took very different times, some far slower than the model: another process "
            f"on the CPU while it recorded?); times simulated with it are unreliable: record on a quiet machine")


def simulated_trace_warning(model) -> str | None:
    """One line when a linear model was fitted to a trace written by `simulate` or a what-if in
    simulated time, whose header's device names the step-time model that timed it
    ("simulated (linear)"), not hardware; None otherwise."""
    source = getattr(model, "source", None) or {}
    device = source.get("device")
    if not isinstance(device, str) or not device.startswith("simulated"):
        return None
    return (f"{source.get('trace') or 'the trace'} is a simulated trace (device {device}): its step times came "
            "from a step-time model, not from hardware, so a fit to them gives that model back")

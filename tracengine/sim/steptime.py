"""Step-time models: how long a step of a given shape takes, for the simulator.

A step's shape is four numbers: the tokens it computes, the sequences in its
batch, the context tokens their attention reads (cached + new, whose K and V
are read) and the (query, key) pairs it scores (a sequence that computes n
tokens after c cached ones scores n*c + n(n+1)/2). `LinearStepTime` is a
linear fit of each part of a recorded step's duration (schedule_ns,
model_ns, postprocess_ns) to those features, one fit per phase, plus the loop's own time between busy steps (the mean gap_ns) and
the time an idle engine takes to start a step once a request arrives (the
mean wake_ns: a sleep overshoots, and at low load it is a part of every TTFT).
Which features and which fit, by the held-out error on this project's CPU
recordings (docs/simulation.md, BENCHMARKS.md):
- prefill: [1, tokens, seqs, attended], least squares. A prefill's context is
  its tokens plus its cached ones, whose reads `attended` already counts; given
  both context and tokens (nearly the same column when little is cached) a fit
  splits one cost between them arbitrarily, and a what-if that chunks prompts
  extrapolates that split.
- decode: [1, seqs, context] (one token per sequence: tokens is seqs again and
  attended is context), a median fit of the time of DECODE_WINDOW consecutive
  decode steps (least absolute deviations over their sums, in step order).
  Decode steps of one shape spread widely on a shared machine, with a long slow
  tail. Least squares puts every step at the mean, above the typical one, and a
  request's decode time with it (its end-to-end p50 came out 6-13% high); a
  median fit of single steps halves the held-out per-step error but falls short
  of the sums that latencies are (TTFT p90 23% low behind other requests'
  decodes, totals 12% short on a loaded machine). A latency is a sum of steps:
  the median of sums of 16 lies between the two, and put every figure of the
  fidelity benchmark within 8% on quiet recordings.
No weight is negative (a feature whose fitted weight would be is left out and the rest
refitted): a longer step never costs less, where a simulation extrapolates past the recording.
A model may also hold a third row, `mixed`, for a step whose batch holds both prompt tokens and
decodes (a `mixed` policy's mixed step; `holds_decode` says which); without it such a step is
priced by the prefill row (its shape counts its decodes), and `calibrate` fits none. A model
that charges such a step its prefill time plus its decode time, as NVIDIA Dynamo's mocker
prices a step with its `fixed` timing, needs it: no linear function of the shape is 1 when a
batch also decodes and 0 when it does not.
It is fitted from a trace by `calibrate`, which holds out every fifth step to
measure the error before fitting on all of them. `roofline.RooflineStepTime` answers the
same `predict` for hardware nobody recorded on. `load_step_time` reads either
from the JSON that `save` writes.

Models live here in replay/ beside what-if, the other user of recorded runs;
they use numpy (for the fit) and no torch."""
import json
import math
import statistics
from typing import Any, ClassVar

from tracengine.engine.sequence import Sequence
from tracengine.errors import TracengineError, TraceError
from tracengine.jsonfile import load_json_object
from tracengine.trace.events import RequestAdded, ScheduleDecision, SeqFinish, StepEnd, TraceHeader
from tracengine.trace.header import split_header

FEATURES = ("const", "tokens", "seqs", "context", "attended")
PHASE_FEATURES = {"prefill": (0, 1, 2, 4), "decode": (0, 2, 3)}   # columns of FEATURES each phase fits
PHASE_FIT = {"prefill": "least_squares", "decode": "median"}
DECODE_WINDOW = 16         # consecutive decode steps whose summed time the decode fit takes the median of
PARTS = ("schedule_ns", "model_ns", "postprocess_ns")
PHASES = ("prefill", "decode")
MIXED = "mixed"            # the optional row of a prefill step that also decodes (the module docstring)
HOLDOUT_EVERY = 5          # every fifth step is held out of the fit that measures the error


def step_shape(pairs) -> tuple[int, int, int, int]:
    """(tokens, seqs, context, attended) of a batch, from (num_tokens, num_cached_tokens) per sequence."""
    num_tokens = num_seqs = context = attended = 0
    for n, c in pairs:
        num_tokens += n
        num_seqs += 1
        context += c + n
        attended += n * c + n * (n + 1) // 2
    return num_tokens, num_seqs, context, attended


def seqs_shape(seqs: list[Sequence], is_prefill: bool = True, drafts: bool = False) -> tuple[int, int, int, int]:
    """The shape of a scheduled batch of `Sequence`s (before postprocess). A batch the scheduler
    calls decode (`is_prefill` False) computes one token each, so its shape is two sums; with
    `drafts` (speculative decoding) a decode computes 1 + its drafts tokens each, scored as any
    tokens after its context are."""
    if drafts or is_prefill and any(s.num_scheduled_tokens != 1 for s in seqs):
        return step_shape([(s.num_scheduled_tokens, s.num_cached_tokens) for s in seqs])
    num_seqs = context = len(seqs)      # each scores its context and itself once
    for s in seqs:
        context += s.num_cached_tokens
    return num_seqs, num_seqs, context, context


def holds_decode(seqs: list[Sequence]) -> bool:
    """Whether a prefill batch of `Sequence`s (scheduled, before postprocess) also decodes: a
    sequence that samples a token after one it sampled before. That is a decode, or the last
    chunk of a recomputation after a preemption (Dynamo's mocker prices both as decodes); a
    prompt's last chunk, even of one token, is prefill."""
    for seq in seqs:
        if seq.num_completion_tokens and seq.num_cached_tokens + seq.num_scheduled_tokens >= seq.num_tokens:
            return True
    return False


def round_ns(ns: float) -> int:
    """round(ns) of a finite ns >= 0 (half to even; ns - floor(ns) is exact): compiled, no call by name."""
    whole = math.floor(ns)
    frac = ns - whole
    return whole + 1 if frac > 0.5 or frac == 0.5 and whole % 2 else whole


class LinearStepTime:
    """`coefficients[phase][part]` are the weights of FEATURES; a prediction is
    clipped at 0 ns. `gap_ns`: the loop's time between two steps when it is busy;
    `wake_ns`: from a request's arrival to the start of the step it wakes an idle
    engine for (default: gap_ns)."""
    kind: ClassVar[str] = "linear"

    def __init__(self, coefficients: dict, gap_ns: int = 0, source: dict | None = None, error: dict | None = None,
                 wake_ns: int | None = None):
        self.coefficients = coefficients
        self.gap_ns = int(gap_ns)
        self.wake_ns = self.gap_ns if wake_ns is None else int(wake_ns)
        self.source = source or {}
        self.error = error or {}
        # Each phase's weights, each part's FEATURES in PARTS' order, in one list of floats read per step
        rows = {phase: [float(w) for part in PARTS for w in coefficients[phase][part]]
                for phase in ((*PHASES, MIXED) if MIXED in coefficients else PHASES)}
        self._prefill, self._decode, self._mixed = rows["prefill"], rows["decode"], rows.get(MIXED, rows["prefill"])

    def predict(self, is_prefill: bool, num_tokens: int, num_seqs: int, context: int,
                attended: int, mixed: bool = False) -> tuple[int, int, int]:
        """(schedule_ns, model_ns, postprocess_ns) of a step of this shape; `mixed`: a prefill
        step that also decodes (`holds_decode`), priced by the `mixed` row where there is one."""
        w = self._mixed if mixed else self._prefill if is_prefill else self._decode
        schedule_ns = w[0] + w[1] * num_tokens + w[2] * num_seqs + w[3] * context + w[4] * attended
        model_ns = w[5] + w[6] * num_tokens + w[7] * num_seqs + w[8] * context + w[9] * attended
        postprocess_ns = w[10] + w[11] * num_tokens + w[12] * num_seqs + w[13] * context + w[14] * attended
        return (round_ns(schedule_ns) if schedule_ns > 0 else 0, round_ns(model_ns) if model_ns > 0 else 0,
                round_ns(postprocess_ns) if postprocess_ns > 0 else 0)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "features": list(FEATURES), "parts": list(PARTS),
                "coefficients": self.coefficients, "gap_ns": self.gap_ns, "wake_ns": self.wake_ns, "source": self.source,
                "error": self.error}

    @classmethod
    def from_dict(cls, d: dict) -> "LinearStepTime":
        if list(d.get("features", ())) != list(FEATURES) or list(d.get("parts", ())) != list(PARTS):
            raise TracengineError(f"a linear step-time model has features {list(FEATURES)} and parts {list(PARTS)}")
        coefficients: Any = d.get("coefficients")
        try:
            for phase in ((*PHASES, MIXED) if MIXED in coefficients else PHASES):
                for part in PARTS:
                    weights = coefficients[phase][part]
                    if len(weights) != len(FEATURES) or not all(
                            isinstance(w, (int, float)) and math.isfinite(w) for w in weights):
                        raise ValueError(part)
        except (KeyError, TypeError, ValueError):
            raise TracengineError("a linear step-time model needs finite coefficients for each phase "
                                  f"({', '.join(PHASES)}) and part ({', '.join(PARTS)})") from None
        gap_ns, wake_ns = d.get("gap_ns", 0), d.get("wake_ns")     # models saved before wake_ns: the gap
        for name, value in (("gap_ns", gap_ns), ("wake_ns", wake_ns)):
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise TracengineError(f"a linear step-time model's {name} is a number of ns >= 0, not {value!r}")
        source, error = d.get("source") or {}, d.get("error") or {}
        if not isinstance(source, dict) or not isinstance(error, dict):
            raise TracengineError("a linear step-time model's source and error are JSON objects")
        for name in ("trace", "model", "device", "dtype"):    # a simulated trace's header names them
            if not isinstance(source.get(name, ""), str):
                raise TracengineError(f"a linear step-time model's source {name} is a string, "
                                      f"not {source[name]!r}")
        return cls(coefficients, gap_ns, source, error, wake_ns)


# -- calibration ------------------------------------------------------------------------------


class StepSample:
    __slots__ = ("step", "is_prefill", "shape", "parts", "gap_ns", "busy", "wake_ns")

    def __init__(self, step, is_prefill, shape, parts, gap_ns, busy, wake_ns=-1):
        self.step, self.is_prefill, self.shape, self.parts = step, is_prefill, shape, parts
        self.gap_ns, self.busy, self.wake_ns = gap_ns, busy, wake_ns


def step_samples(events) -> tuple[TraceHeader, list[StepSample]]:
    """Each step's shape and recorded durations. `busy`: a sequence was in the
    queues when the step before ended, so its gap is the loop's time, not idle.
    `wake_ns`, for a step after idle (not step 0, the run's start-up): from the
    earliest arrival it admitted (the one the engine slept until) to its start; -1 otherwise."""
    header, it = split_header(events)
    samples: list[StepSample] = []
    decision, num_live, live_at_end = None, 0, 0
    end_ns, first_arrival_ns = 0, None    # the last step's end, from the run's start
    for e in it:
        t = type(e)
        if t is ScheduleDecision:
            decision = e
        elif t is RequestAdded:
            num_live += 1
            if e.arrival_ns >= 0 and (first_arrival_ns is None or e.arrival_ns < first_arrival_ns):
                first_arrival_ns = e.arrival_ns
        elif t is SeqFinish:
            num_live -= 1
        elif t is StepEnd:
            if decision is None or decision.step != e.step:
                raise TraceError(f"step {e.step} ends without its ScheduleDecision")
            shape = step_shape((s.num_tokens, s.num_cached_tokens) for s in decision.seqs)
            busy = live_at_end > 0
            start_ns = end_ns + e.gap_ns
            wake_ns = -1
            if not busy and samples and first_arrival_ns is not None and first_arrival_ns <= start_ns:
                wake_ns = start_ns - first_arrival_ns
            # a request added in the gap does not make it idle time: only the queues at the last end do
            samples.append(StepSample(e.step, decision.phase != "decode", shape,
                                      (e.schedule_ns, e.model_ns, e.postprocess_ns), e.gap_ns, busy, wake_ns))
            end_ns = start_ns + e.schedule_ns + e.model_ns + e.postprocess_ns
            live_at_end = num_live
            decision, first_arrival_ns = None, None
    return header, samples


def _fit(samples: list[StepSample]) -> dict:
    import numpy as np
    coefficients: dict[str, Any] = {}
    for phase in PHASES:
        rows = [s for s in samples if s.is_prefill == (phase == "prefill")]
        if not rows:
            coefficients[phase] = None
            continue
        columns = list(PHASE_FEATURES[phase])
        x = np.array([(1.0, *s.shape) for s in rows])[:, columns]
        # A feature the recording never varied (every prefill one sequence) is the constant again:
        # least squares would split one weight between the two, and a what-if that varies it
        # (several prompts a step) would extrapolate the split. Left out, its weight is 0.
        varying = [k for k in range(len(columns)) if k == 0 or float(np.ptp(x[:, k])) > 0]
        columns, x = [columns[k] for k in varying], x[:, varying]
        y = np.array([s.parts for s in rows], dtype=float)
        if PHASE_FIT[phase] == "median":
            x, y = _window_sums(x, DECODE_WINDOW), _window_sums(y, DECODE_WINDOW)
        scale = np.maximum(np.abs(x).max(axis=0), 1.0)    # columns of very different sizes: fit them scaled
        w = np.column_stack([_nonnegative_fit(x / scale, y[:, j], PHASE_FIT[phase] == "median")
                             for j in range(y.shape[1])])
        full = np.zeros((len(FEATURES), len(PARTS)))
        full[columns] = w / scale[:, None]
        coefficients[phase] = {part: [float(v) for v in full[:, i]] for i, part in enumerate(PARTS)}
    present = [p for p in PHASES if coefficients[p] is not None]
    if not present:
        raise TraceError("the trace has no steps to fit")
    for phase in PHASES:    # a phase the trace never ran borrows the other's fit
        if coefficients[phase] is None:
            coefficients[phase] = coefficients[present[0]]
    return coefficients


def _nonnegative_fit(x, y, median: bool):
    """The weights of one part, none negative: more tokens, sequences or context never make a step
    shorter, and a negative weight (noise in a recording of short prompts: attention's share of
    a prefill is small there) made long prompts cost less than short ones, down to 0 ns, where a
    simulation extrapolates. The most negative column is left out and the rest refitted until
    no weight is negative (least squares, or the median fit for decode)."""
    import numpy as np
    active = list(range(x.shape[1]))
    while True:
        xa = x[:, active]
        w, *_ = np.linalg.lstsq(xa, y[:, None], rcond=None)
        if median:
            w = _median_fit(xa, y[:, None], w)
        w = w[:, 0]
        if (w >= 0).all() or len(active) == 1:
            full = np.zeros(x.shape[1])
            full[active] = np.maximum(w, 0.0)
            return full
        active.pop(int(np.argmin(w)))


def _window_sums(a, window: int):
    """The sums of every `window` consecutive rows of `a` (all of them at once when fewer):
    a linear model's prediction for a sum of steps is its prediction for their summed shape."""
    import numpy as np
    window = max(1, min(window, len(a)))
    cumulative = np.vstack([np.zeros((1, a.shape[1])), np.cumsum(a, axis=0)])
    return cumulative[window:] - cumulative[:-window]


def _median_fit(x, y, w, iterations: int = 100):
    """Least absolute deviations by iteratively reweighted least squares, from the
    least-squares weights `w`: each row weighs 1/|residual| (floored at 1 us, so an
    exact fit stays exact), per column of `y`."""
    import numpy as np
    w = w.copy()
    for _ in range(iterations):
        weights = 1.0 / np.maximum(np.abs(y - x @ w), 1_000.0)
        new = np.column_stack([np.linalg.lstsq(x * np.sqrt(weights[:, j:j + 1]), y[:, j] * np.sqrt(weights[:, j]),
                                               rcond=None)[0] for j in range(y.shape[1])])
        if np.allclose(new, w, rtol=1e-9, atol=1e-9):
            return new
        w = new
    return w


def _median(values):
    return statistics.median(values) if values else 0


def _errors(model: LinearStepTime, samples: list[StepSample]) -> dict:
    """Per-step and total errors of `model` on `samples`, for the total step time and the model part."""
    out: dict[str, Any] = {"num_steps": len(samples)}
    for name, select in (("total", lambda p: sum(p)), ("model", lambda p: p[1])):
        recorded = [select(s.parts) for s in samples]
        predicted = [select(model.predict(s.is_prefill, *s.shape)) for s in samples]
        abs_err = [abs(p - r) for p, r in zip(predicted, recorded)]
        rel_err = [abs(p - r) / r for p, r in zip(predicted, recorded) if r > 0]
        total_r, total_p = sum(recorded), sum(predicted)
        out[name] = {"median_abs_ms": _median(abs_err) / 1e6, "median_rel": _median(rel_err),
                     "mean_abs_ms": (sum(abs_err) / len(abs_err) / 1e6) if abs_err else 0.0,
                     "recorded_ms": total_r / 1e6, "predicted_ms": total_p / 1e6,
                     "total_rel": (total_p - total_r) / total_r if total_r else 0.0}
    return out


def unvaried_features(samples: list[StepSample]) -> dict:
    """`num_steps_by_phase` and `unvaried`: per phase, the features its steps never varied (all of
    them for a phase with one step or none), which the fit gives no weight: a what-if that varies
    them (prefills of other sizes, several prompts a step) is timed as if it did not."""
    counts, unvaried = {}, {}
    for phase in PHASES:
        shapes = [s.shape for s in samples if s.is_prefill == (phase == "prefill")]
        counts[phase] = len(shapes)
        unvaried[phase] = [FEATURES[k] for k in PHASE_FEATURES[phase][1:]
                           if len({shape[k - 1] for shape in shapes}) <= 1]
    return {"num_steps_by_phase": counts, "unvaried": unvaried}


def unvaried_note(model) -> str | None:
    """One line on the features a linear model's recording never varied, or None (a roofline, a
    model saved without this, a recording that varied every feature)."""
    source = getattr(model, "source", None) or {}
    counts, unvaried = source.get("num_steps_by_phase"), source.get("unvaried")
    if not isinstance(counts, dict) or not isinstance(unvaried, dict):
        return None
    unvaried_parts, missing = [], []
    for phase in PHASES:
        n, names = counts.get(phase), unvaried.get(phase)
        if not isinstance(n, int) or isinstance(n, bool):    # a hand-made file: say nothing
            continue
        if n == 0:
            missing.append(phase)
        elif isinstance(names, list) and names:
            unvaried_parts.append(f"the {phase} steps' {', '.join(map(str, names))} ({n:,} step{'s' if n != 1 else ''})")
    notes = []
    if unvaried_parts:
        notes.append(f"the calibration recording never varied {' or '.join(unvaried_parts)}: the model gives them "
                     "no weight, and times a run that varies them as if it did not")
    for phase in missing:
        notes.append(f"the calibration recording has no {phase} steps: {phase} borrows the other phase's fit")
    return "\n".join(f"note: {note}" for note in notes) or None


def calibrate(events, trace_name: str = "") -> LinearStepTime:
    """Fit a LinearStepTime to a recorded trace; `error` holds the held-out errors."""
    header, samples = step_samples(events)
    if len(samples) < 2 * HOLDOUT_EVERY:
        raise TraceError(f"the trace has {len(samples)} steps; calibration needs at least {2 * HOLDOUT_EVERY}")
    train = [s for s in samples if s.step % HOLDOUT_EVERY != HOLDOUT_EVERY - 1]
    held = [s for s in samples if s.step % HOLDOUT_EVERY == HOLDOUT_EVERY - 1]
    busy_gaps = [s.gap_ns for s in samples if s.busy]
    gap_ns = round(sum(busy_gaps) / len(busy_gaps)) if busy_gaps else 0   # the mean: gaps add up in the total
    wakes = [s.wake_ns for s in samples if s.wake_ns >= 0]
    wake_ns = round(sum(wakes) / len(wakes)) if wakes else gap_ns
    held_out = _errors(LinearStepTime(_fit(train), gap_ns, wake_ns=wake_ns), held)
    model = LinearStepTime(_fit(samples), gap_ns, wake_ns=wake_ns)
    model.error = {"held_out": held_out, "all_steps": _errors(model, samples)}
    model.source = {"trace": trace_name, "model": header.model.name, "dtype": header.model.dtype,
                    "architecture": header.model.architecture, "device": header.device,
                    "num_steps": len(samples), **unvaried_features(samples),
                    "config": {k: header.config.get(k) for k in ("kvcache_block_size", "max_num_batched_tokens",
                                                                 "max_num_seqs", "tensor_parallel_size")}}
    return model


# -- files ------------------------------------------------------------------------------------


def save(model, path: str):
    """Writes the model's JSON; the command has checked `path` (cli/outputs.py) before the fit."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(model.to_dict(), f, indent=1)
        f.write("\n")


def load_step_time(path: str):
    """A step-time model from its JSON (a calibrated linear model or a roofline)."""
    d = load_json_object(path, "a step-time model")
    kind = d.get("kind")
    try:
        if kind == LinearStepTime.kind:
            return LinearStepTime.from_dict(d)
        if kind == "roofline":
            from tracengine.sim.roofline import RooflineStepTime
            return RooflineStepTime.from_dict(d)
    except TracengineError as exc:
        raise TracengineError(f"{path}: {exc}") from None
    raise TracengineError(f"{path}: unknown step-time model kind {kind!r} (linear or roofline)")

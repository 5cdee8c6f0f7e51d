"""Serving figures of a trace, from its events alone: `tracengine stats`.

Latencies are given in engine steps and in seconds on the trace's time axis
(tracengine/analysis/timeline.py: each step lasts schedule_ns + model_ns +
postprocess_ns and begins gap_ns after the one before; a request arrives at
its recorded arrival time, or for a format-1 trace at the start of the step
it was added before; a token appears at the end of the step that sampled it):

- queueing:  arrival -> first scheduled.  steps = first_scheduled - added,
  seconds = arrival .. the start of first_scheduled.
- ttft:      arrival -> first kept token. steps = first_token - added + 1,
  seconds = arrival .. the end of first_token.
- itl:       one value per pair of consecutive kept tokens of a request,
  pooled over requests. steps = b - a, seconds = end of a .. end of b.
- tpot:      per finished request with at least 2 tokens, (last token -
  first token) / (tokens - 1), in steps and in seconds (vLLM's TPOT).
- e2e:       arrival -> last token, finished requests only.
  steps = finish - added + 1, seconds = arrival .. the end of finish.

Throughput is over the run's duration (its start to the end of the last
step, idle time included). Goodput under service-level objectives (`slo`:
ttft, tpot, e2e in seconds) is as DistServe and vLLM's serving benchmark
define it: a request is good when it finished and meets every objective (a
request of one token has a TPOT of 0); the figures are the good share of all
requests and good requests per second of the run.

Percentiles interpolate linearly between closest ranks (numpy's default).
`stats` returns typed figures (analysis/figures.py), read by attribute or by key.
The JSON keys are stable (`stats_version` changes if one is renamed or
removed); docs/stats.md lists them."""
import math

import msgspec

from tracengine.analysis.cpu_tier import cpu_tier_figures
from tracengine.analysis.vllm_inputs import connector_figures, structured_output_figures, vllm_inputs_lines
from tracengine.analysis.figures import (Goodput, HeadOfLine, KVBlocks, Latencies, Latency, Preemption, PrefixCache,
                                         RequestCounts, RequestFigures, Stats, StepFigures, TokenCounts, Throughput,
                                         TraceFigures, summarize, summarize_counts)
from tracengine.analysis.sessions import session_line, timeline_sessions
from tracengine.analysis.adapters import adapter_figures
from tracengine.analysis.kv_groups import kv_group_figures, kv_group_lines
from tracengine.analysis.spec_decoding import spec_decoding_figures
from tracengine.analysis.timeline import RequestTimeline, load
from tracengine.errors import TracengineError

STATS_VERSION = 1
NS = 1e9
SLO_NAMES = ("ttft", "tpot", "e2e")
_UNITS = {"ms": 1e-3, "s": 1.0, "us": 1e-6}


def parse_slo(text: str) -> tuple[str, float]:
    """`ttft=200ms` -> ("ttft", 0.2): an objective in seconds (a bare number is ms, as in vLLM)."""
    name, sep, value = text.partition("=")
    name, value = name.strip().lower(), value.strip().lower()
    unit = next((u for u in ("ms", "us", "s") if value.endswith(u)), "")
    try:
        seconds = float(value.removesuffix(unit)) * _UNITS.get(unit, 1e-3)
    except ValueError:
        seconds = math.nan
    if not sep or name not in SLO_NAMES or not seconds > 0 or math.isinf(seconds):
        raise TracengineError(f"--slo expects NAME=VALUE with NAME one of {', '.join(SLO_NAMES)} and a positive "
                              f"VALUE such as 200ms or 0.2s, got {text!r}")
    return name, seconds


def parse_slos(texts: list[str]) -> dict[str, float]:
    """The objectives of repeated `--slo` flags, each name once (a second would silently win)."""
    slo = {}
    for text in texts:
        name, seconds = parse_slo(text)
        if name in slo:
            raise TracengineError(f"--slo names {name} twice")
        slo[name] = seconds
    return slo


def _ratio(num, den):
    return num / den if num is not None and den else None


def request_figures(t: RequestTimeline, req) -> RequestFigures:
    added, first_sched = req.added_step, req.first_scheduled_step
    first_token = req.first_token_step if req.first_token_step >= 0 else None
    num_completion = req.num_tokens - req.num_prompt_tokens
    arrival = t.arrival_ns(req)
    late: dict = {}        # the figures of the stages the request reached
    if first_sched is not None:
        late["queueing_steps"] = first_sched - added
        late["queueing_s"] = (t.start_ns(first_sched) - arrival) / NS
    if first_token is not None:
        late["ttft_steps"] = first_token - added + 1
        late["ttft_s"] = (t.end_ns(first_token) - arrival) / NS
    if req.finish_step is not None:
        late["e2e_steps"] = req.finish_step - added + 1
        late["e2e_s"] = (t.end_ns(req.finish_step) - arrival) / NS
        if num_completion > 1:
            first, last = first_token, req.last_token_step
            late["tpot_steps"] = (last - first) / (num_completion - 1)
            late["tpot_s"] = (t.end_ns(last) - t.end_ns(first)) / NS / (num_completion - 1)
    return RequestFigures(seq_id=req.seq_id, added_step=added, arrival_s=arrival / NS, first_scheduled_step=first_sched,
                          first_token_step=first_token, finish_step=req.finish_step,
                          finish_reason=req.finish_reason or None, num_prompt_tokens=req.num_prompt_tokens,
                          num_completion_tokens=num_completion, num_preemptions=len(req.preempts), **late)


def goodput(per_request: list, slo: dict[str, float], duration_s: float) -> Goodput:
    """Requests that finished within every objective (seconds), as a share and per second.
    `per_request`: RequestFigures, or a fleet's request figures (fleet/stats.py), read by key."""
    def good(r):
        if r["finish_step"] is None:
            return False
        values = {"ttft": r["ttft_s"], "tpot": r["tpot_s"] if r["tpot_s"] is not None else 0.0, "e2e": r["e2e_s"]}
        return all(values[name] is not None and values[name] <= limit for name, limit in slo.items())

    num_good = sum(good(r) for r in per_request)
    return Goodput(slo_s=dict(slo), num_good_requests=num_good, good_request_share=_ratio(num_good, len(per_request)),
                   requests_per_s=_ratio(num_good, duration_s))


def stats(path_or_events, slo: dict[str, float] | None = None) -> Stats:
    """The figures of a trace (a path, read up to its last complete frame) or of
    an iterable of events (a TraceHeader first, for the block figures). `slo`:
    objectives in seconds by name (ttft, tpot, e2e), for the goodput figures."""
    for name, limit in (slo or {}).items():
        if name not in SLO_NAMES or not limit > 0:
            raise TracengineError(f"an SLO is one of {', '.join(SLO_NAMES)} with a positive number of seconds, "
                                  f"got {name}={limit!r}")
    t = path_or_events if isinstance(path_or_events, RequestTimeline) else load(path_or_events)
    per_request = [request_figures(t, req) for req in t.requests.values()]

    def latency(name):
        steps, seconds = f"{name}_steps", f"{name}_s"
        return Latency(steps=summarize([v for r in per_request if (v := getattr(r, steps)) is not None]),
                       seconds=summarize([v for r in per_request if (v := getattr(r, seconds)) is not None]))

    itl_steps, itl_ns = t.itl()

    f = t.step_figures
    hol_prefill, hol_decode, blocked = f.num_blocked_prefill_steps, f.num_blocked_decode_steps, f.blocked_seq_ids

    preempts = [p for req in t.requests.values() for p in req.preempts]
    reasons = {}
    for req in t.requests.values():
        if req.finish_step is not None:
            reasons[req.finish_reason] = reasons.get(req.finish_reason, 0) + 1
    num_finished = sum(reasons.values())
    num_aborted = sum(req.abort is not None for req in t.requests.values())
    num_completion = sum(r.num_completion_tokens for r in per_request)

    total_s = t.total_ns / NS
    idle = t.idle_gaps()
    idle_s = sum(b - a for _, a, b in idle) / NS
    num_tokens = sum(r.num_prompt_tokens for r in t.requests.values()) + num_completion

    num_allocated, num_hit = t.num_allocated_blocks, t.num_hit_blocks
    cpu = cpu_tier_figures(t)
    num_cpu_hit = cpu.num_hit_blocks if cpu is not None else 0    # tokens found in either tier are hits
    num_hit_tokens = (num_hit + num_cpu_hit) * t.block_size if t.block_size else None

    kv = KVBlocks(num_blocks=t.num_kvcache_blocks)
    if t.num_steps:
        kv = KVBlocks(num_blocks=t.num_kvcache_blocks, min_free_blocks=f.min_free, peak_step=f.min_free_at)
        if t.num_kvcache_blocks:      # the peak: the fullest step
            kv = msgspec.structs.replace(kv, utilization_mean=f.utilization_sum / t.num_steps,
                                         utilization_peak=1 - f.min_free / t.num_kvcache_blocks)

    return Stats(
        stats_version=STATS_VERSION,
        trace=TraceFigures(torn_tail=t.torn_tail, kvcache_block_size=t.block_size,
                           num_kvcache_blocks=t.num_kvcache_blocks),
        requests=RequestCounts(num_requests=len(t.requests), num_finished=num_finished,
                               num_unfinished=len(t.requests) - num_finished - num_aborted, finish_reasons=reasons,
                               num_aborted=num_aborted),
        tokens=TokenCounts(num_prompt_tokens=sum(r.num_prompt_tokens for r in t.requests.values()),
                           num_completion_tokens=num_completion,
                           num_prefill_tokens=f.kind_prefill_tokens, num_decode_tokens=f.kind_decode_tokens),
        steps=StepFigures(num_steps=t.num_steps, num_prefill_steps=f.num_prefill_steps,
                          num_decode_steps=f.num_decode_steps, total_s=total_s,
                          prefill_s=f.prefill_ns / NS, decode_s=f.decode_ns / NS,
                          gap_s=t.gap_ns / NS, mean_gap_s=_ratio(t.gap_ns / NS, t.num_steps),
                          idle_s=idle_s, num_idle_gaps=len(idle),
                          num_mixed_steps=f.num_mixed_steps, mixed_s=f.mixed_ns / NS),
        throughput=Throughput(prefill_tokens_per_s=_ratio(f.prefill_tokens, f.prefill_ns / NS),
                              decode_tokens_per_s=_ratio(f.decode_tokens, f.decode_ns / NS),
                              completion_tokens_per_s=_ratio(num_completion, total_s),
                              requests_per_s=_ratio(num_finished, total_s),
                              total_tokens_per_s=_ratio(num_tokens, total_s),
                              mixed_tokens_per_s=_ratio(f.mixed_tokens, f.mixed_ns / NS)),
        latency=Latencies(queueing=latency("queueing"), ttft=latency("ttft"),
                          itl=Latency(steps=summarize_counts(itl_steps), seconds=summarize_counts(itl_ns, NS)),
                          tpot=latency("tpot"), e2e=latency("e2e")),
        goodput=goodput(per_request, slo, total_s) if slo else None,
        preemption=Preemption(num_preemptions=len(preempts),
                              num_self_preemptions=sum(p.seq_id == p.by_seq_id for p in preempts),
                              num_preempted_requests=len({p.seq_id for p in preempts}),
                              num_recomputed_tokens=sum(p.num_computed_tokens for p in preempts)),
        prefix_cache=PrefixCache(num_allocated_blocks=num_allocated, num_hit_blocks=num_hit,
                                 block_hit_rate=_ratio(num_hit, num_allocated),
                                 num_lookup_tokens=t.num_lookup_tokens, num_hit_tokens=num_hit_tokens,
                                 token_hit_rate=_ratio(num_hit_tokens, t.num_lookup_tokens)),
        kv_blocks=kv,
        head_of_line=HeadOfLine(num_blocked_steps=hol_prefill + hol_decode, num_blocked_prefill_steps=hol_prefill,
                                num_blocked_decode_steps=hol_decode, num_blocked_requests=len(blocked)),
        sessions=timeline_sessions(t),    # None without sessions (analysis/sessions.py)
        spec_decoding=spec_decoding_figures(t, path_or_events),
        lora_adapters=adapter_figures(per_request, t.lora_names),
        cpu_tier=cpu,
        kv_connector=connector_figures(t),
        structured_output=structured_output_figures(t),
        kv_groups=kv_group_figures(t, path_or_events),
        per_request=per_request,
    )


def format_number(value, fmt="{:,.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def format_percent(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def render(s: Stats, title: str = ""):
    """The text form: a heading, a latency table, a table of the other figures."""
    from rich.console import Group
    from rich.table import Table

    r, tok, st, tp = s.requests, s.tokens, s.steps, s.throughput
    aborted = f", {r.num_aborted} aborted" if r.num_aborted else ""
    head = (f"{title + chr(10) if title else ''}{r.num_requests} requests ({r.num_finished} finished{aborted}), "
            f"{tok.num_prompt_tokens:,} prompt + {tok.num_completion_tokens:,} completion tokens\n"
            f"{st.num_steps:,} steps ({st.num_prefill_steps:,} prefill, {st.num_decode_steps:,} decode"
            f"{', {:,} mixed'.format(st.num_mixed_steps) if st.num_mixed_steps else ''})"
            f" in {st.total_s * 1e3:,.3f} ms (the run's wall time, idle included)"
            + (f"\ngaps between steps: {st.gap_s * 1e3:,.3f} ms in all, {st.mean_gap_s * 1e3:,.3f} ms mean "
               f"per step; {st.idle_s * 1e3:,.3f} ms of it idle (waiting for arrivals)" if st.gap_s else ""))
    lat = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("latency", "unit", "n", "mean", "p50", "p90", "p99"):
        lat.add_column(col, justify="left" if col in ("latency", "unit") else "right")
    for name, label in (("queueing", "queueing"), ("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"),
                        ("e2e", "end-to-end")):
        for unit, key, scale, fmt in (("steps", "steps", 1, "{:,.2f}"), ("ms", "seconds", 1e3, "{:,.3f}")):
            f = getattr(getattr(s.latency, name), key)
            lat.add_row(label if unit == "steps" else "", unit, str(f.count),
                        *(format_number(None if (v := getattr(f, k)) is None else v * scale, fmt)
                          for k in ("mean", "p50", "p90", "p99")))

    pre, pc, kv, hol = s.preemption, s.prefix_cache, s.kv_blocks, s.head_of_line
    other = Table(box=None, pad_edge=False, show_header=False)
    other.add_column(style="bold")
    other.add_column()
    # prefill, decode and mixed over the time of their own steps; completion and all over the run
    other.add_row("tokens/s", f"prefill {format_number(tp.prefill_tokens_per_s, '{:,.0f}')}, "
                              f"decode {format_number(tp.decode_tokens_per_s, '{:,.0f}')}"
                              + (f", mixed steps {format_number(tp.mixed_tokens_per_s, '{:,.0f}')}"
                                 if st.num_mixed_steps else "")
                              + f" (over their steps' time); "
                              f"completion {format_number(tp.completion_tokens_per_s, '{:,.0f}')}, "
                              f"all {format_number(tp.total_tokens_per_s, '{:,.0f}')} (over the run's wall time)")
    other.add_row("requests/s", format_number(tp.requests_per_s, "{:,.3f}") + " over the run")
    if s.goodput is not None:
        g = s.goodput
        objectives = ", ".join(f"{name} <= {limit * 1e3:g} ms" for name, limit in g.slo_s.items())
        other.add_row("goodput", f"{format_number(g.requests_per_s, '{:,.3f}')} requests/s: "
                                 f"{g.num_good_requests} of {r.num_requests} "
                                 f"({format_percent(g.good_request_share)}) met {objectives}")
    other.add_row("preemptions", f"{pre.num_preemptions} ({pre.num_self_preemptions} self) of "
                                 f"{pre.num_preempted_requests} requests, "
                                 f"{pre.num_recomputed_tokens:,} tokens recomputed")
    other.add_row("prefix cache", f"{pc.num_hit_blocks}/{pc.num_allocated_blocks} blocks "
                                  f"({format_percent(pc.block_hit_rate)}), "
                                  f"{format_number(pc.num_hit_tokens, '{:,}')}/"
                                  f"{pc.num_lookup_tokens:,} tokens ({format_percent(pc.token_hit_rate)})")
    other.add_row("KV blocks", f"{format_number(kv.num_blocks, '{}')} blocks, utilisation mean "
                               f"{format_percent(kv.utilization_mean)}, "
                               f"peak {format_percent(kv.utilization_peak)} "
                               f"(first at step {format_number(kv.peak_step, '{}')})")
    other.add_row("head-of-line", f"{hol.num_blocked_steps} steps blocked ({hol.num_blocked_prefill_steps} "
                                  f"prefill, {hol.num_blocked_decode_steps} decode), "
                                  f"{hol.num_blocked_requests} requests")
    if s.cpu_tier is not None:
        c = s.cpu_tier
        wait = None if c.load_wait_s.mean is None else c.load_wait_s.mean * 1e3
        other.add_row("CPU tier", f"{c.kv_offloading_size_gib:g} GiB: {c.num_hit_blocks:,} blocks hit in "
                                  f"{c.num_loads:,} loads, {c.num_stored_blocks:,} stored, "
                                  f"{c.num_evicted_blocks:,} evicted; {c.bytes_to_cpu / 1e9:,.1f} GB to CPU, "
                                  f"{c.bytes_to_gpu / 1e9:,.1f} GB to GPU; load wait mean "
                                  f"{format_number(wait, '{:,.1f}')} ms")
    if s.sessions:
        other.add_row("sessions", session_line(s.sessions))
    for name, line in vllm_inputs_lines(s) + kv_group_lines(s):
        other.add_row(name, line)
    if s.spec_decoding is not None:
        sd = s.spec_decoding
        other.add_row("speculative", f"{sd.num_accepted_tokens:,}/{sd.num_draft_tokens:,} drafts accepted "
                                     f"({format_percent(sd.acceptance_rate)}) in {sd.num_verifications:,} "
                                     f"verifications, {format_number(sd.mean_acceptance_length)} tokens each; "
                                     f"per position " + " ".join(format_percent(r)
                                                                 for r in sd.acceptance_rate_per_position))
        if sd.draft_lengths:
            other.add_row("draft length", ", ".join(f"{d.num_spec_tokens} at batch {d.batch_size} ({d.num_steps:,} "
                                                    f"steps)" for d in sd.draft_lengths))
    for name, a in (s.lora_adapters or {}).items():
        other.add_row(f"adapter {name or '(base)'}", f"{a.num_requests} requests ({a.num_finished} finished), "
                                                      f"TTFT steps mean {format_number(a.ttft_steps.mean)}, "
                                                      f"end-to-end steps mean {format_number(a.e2e_steps.mean)}")
    parts = [head, "", lat, "", other]
    if s.trace.torn_tail:
        parts += ["", f"note: {s.trace.torn_tail}"]
    return Group(*parts)

"""What-if with SGLang's own scheduler: an SGLang trace's workload (prompts, the steps they
arrived at, aborts, each request's recorded output tokens) run again through SGLang's real
scheduler under another config (`--set` on its ServerArgs fields), driven as its normal loop
(drive.py). The outputs do not depend on the schedule, so only the scheduling changes, and the
new trace is the one SGLang's scheduler records running that workload under that config."""
import time

import msgspec

from tracengine.sglang.drive import RequestSpec
from tracengine.trace.events import RequestAdded, SeqAbort, StepEnd, TokenSample
from tracengine.trace.tracelog import split_header


def extract_workload(events):
    """(the header, the requests as RequestSpecs with their recorded output, the aborts by step)."""
    header, it = split_header(events)
    specs: dict[int, RequestSpec] = {}
    aborts: dict[int, list[str]] = {}
    num_steps = 0
    for e in it:
        t = type(e)
        if t is TokenSample and e.kept:
            specs[e.seq_id].output_token_ids.append(e.token_id)
        elif t is RequestAdded:
            # a request that stops at EOS stops at its recorded one (eos_after past max_tokens: never made up)
            specs[e.seq_id] = RequestSpec(e.request_id, list(e.prompt_token_ids), e.max_tokens, arrival_step=e.step,
                                          eos_after=0 if e.ignore_eos else e.max_tokens + 1, output_token_ids=[],
                                          arrival_ns=e.arrival_ns)
        elif t is SeqAbort:
            aborts.setdefault(e.step, []).append(specs[e.seq_id].request_id)
        elif t is StepEnd:
            num_steps += 1
    return header, list(specs.values()), aborts, num_steps


def run_workload(events, config: dict) -> list:
    """The recorded workload through SGLang's scheduler under `config`: the new trace's events."""
    from tracengine.sglang.drive import record_workload
    header, specs, aborts, num_steps = extract_workload(events)
    new_events = record_workload(config, specs, aborts=aborts, max_steps=100 * max(num_steps, 1) + 10_000)
    return [msgspec.structs.replace(new_events[0], model=header.model, created_at=time.time())] + new_events[1:]


def whatif(events, overrides: dict):
    from tracengine.analysis.stats import stats
    from tracengine.replay.whatif import WhatIfResult
    from tracengine.sglang.build import apply_overrides
    from tracengine.sglang.replay import check_sglang_version
    events = list(events)
    header = events[0]
    check_sglang_version(header)
    config = apply_overrides(header.config, overrides)
    new_events = run_workload(events, config)
    new_config = new_events[0].config
    changes = [(name, value, new_config[name]) for name, value in header.config.items()
               if name in new_config and new_config[name] != value]
    return WhatIfResult(stats(events), stats(new_events), changes, new_events, 0)

"""What-if with SGLang's own scheduler: an SGLang trace's workload (prompts, the steps they
arrived at, aborts, each request's recorded output tokens) run again through SGLang's real
scheduler under another config (`--set` on its ServerArgs fields), driven as its normal loop
(drive.py). The outputs do not depend on the schedule, so only the scheduling changes, and the
new trace is the one SGLang's scheduler records running that workload under that config."""
import time

import msgspec

from tracengine.replay.whatif import StepWorkload, whatif_in_steps
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


class SglangStepReplay(StepWorkload):
    """An SGLang trace's workload ready to run at recorded steps through SGLang's scheduler
    under any config (replay/whatif.whatif_in_steps), driven as its loop (drive.py)."""

    def __init__(self, events):
        from tracengine.sglang.replay import check_sglang_version
        self.events = events = list(events)
        self.header = events[0]
        check_sglang_version(self.header)
        _, self.specs, self.aborts, num_steps = extract_workload(events)
        self.max_steps = 100 * max(num_steps, 1) + 10_000
        self.recorded_run = events

    def config(self, overrides: dict) -> dict:
        from tracengine.sglang.build import apply_overrides
        return apply_overrides(self.header.config, overrides)

    def check(self, overrides: dict) -> None:
        from tracengine.sglang.build import check_config
        check_config(self.config(overrides))

    def run(self, config: dict, policy=None) -> tuple[list, int]:
        """The recorded workload through SGLang's scheduler under `config`: the new trace's events
        (no request runs past its recorded output: each stops at it). `policy`: tracengine's, never given."""
        from tracengine.sglang.drive import record_workload
        new_events = record_workload(config, self.specs, aborts=self.aborts, max_steps=self.max_steps)
        return [msgspec.structs.replace(new_events[0], model=self.header.model, created_at=time.time())] \
            + new_events[1:], 0


def whatif(events, overrides: dict):
    return whatif_in_steps(SglangStepReplay(events), overrides)

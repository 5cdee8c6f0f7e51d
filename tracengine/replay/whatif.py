"""What-if: a trace's workload (prompts, arrival steps, sampling parameters
and each sequence's recorded output tokens) run again through the engine's
step loop under another config, with no model. The outputs do not depend on
the schedule, so only the scheduling changes."""
import time
from dataclasses import dataclass, replace
from functools import cached_property

import msgspec

from tracengine.analysis.stats import stats
from tracengine.analysis.timeline import RequestTimeline
from tracengine.engine.config import Config
from tracengine.trace.events import RequestAdded, ScheduleDecision, TokenSample, TraceHeader
from tracengine.trace.tracelog import split_header
from tracengine.engine.request import Request
from tracengine.sim.runners import check_requests, run_workload
from tracengine.engine.scheduler import Scheduler
from tracengine.engine.hash_id_prompt import request_prompt
from tracengine.workload.sessions import session_fields


class OutputRunner:
    """What-if: each sequence gets its recorded completion token by completion
    index, wherever the new schedule puts it. A middle chunk gets the sample
    recorded at the same position if there is one, else `filler` (either way
    the sample is dropped); a sequence that runs past its recorded output gets
    `filler` and is noted in `past_output_seq_ids`."""

    def __init__(self, outputs: dict[int, list[int]], middle: dict[tuple[int, int], int] | None = None,
                 filler: int = 0):
        self.outputs = outputs
        self.middle = middle or {}
        self.filler = filler
        self.past_output_seq_ids: set[int] = set()

    def run(self, seqs, is_prefill: bool) -> list[int]:
        tokens = []
        for seq in seqs:
            if seq.spec_token_ids:      # a verify step: the recorded tokens at each of its positions
                tokens.append(self.targets(seq))
                continue
            position = seq.num_cached_tokens + seq.num_scheduled_tokens
            if position < seq.num_tokens:          # a middle chunk
                tokens.append(self.middle.get((seq.seq_id, position), self.filler))
                continue
            output = self.outputs.get(seq.seq_id, ())
            index = seq.num_completion_tokens
            if index < len(output):
                tokens.append(output[index])
            else:
                self.past_output_seq_ids.add(seq.seq_id)
                tokens.append(self.filler)
        return tokens

    def targets(self, seq) -> list[int]:
        """A sequence verifying drafts: its recorded completion tokens from its next one on, one
        per position (the last draft's position and the token after it: `filler` past the output)."""
        output, index = self.outputs.get(seq.seq_id, ()), seq.num_completion_tokens
        num_positions = len(seq.spec_token_ids) + 1
        targets = list(output[index:index + num_positions])
        if len(targets) < num_positions:
            if len(targets) == 0:
                self.past_output_seq_ids.add(seq.seq_id)
            targets += [self.filler] * (num_positions - len(targets))
        return targets

    def exit(self):
        pass


@dataclass
class RecordedWorkload:
    """What a trace ran (requests, their recorded outputs): what what-if runs again."""
    header: TraceHeader
    requests: list[Request]
    outputs: dict[int, list[int]]              # seq_id -> kept completion tokens, in order
    middle: dict[tuple[int, int], int]         # (seq_id, position) -> sample of a middle chunk
    timeline: RequestTimeline                  # the recorded run, folded: its figures are stats(timeline)


@dataclass
class WhatIfResult:
    original: dict                              # stats() of the recorded run
    new: dict                                   # stats() of the new run: `tracengine stats` of its trace
    changes: list[tuple[str, object, object]]  # (field, recorded value, new value)
    events: list                                # the new run, TraceHeader first
    num_past_output: int                        # sequences that ran past their recorded output


def extract_workload(events) -> RecordedWorkload:
    header, it = split_header(events)
    requests, outputs, middle, positions = [], {}, {}, {}
    timeline = RequestTimeline(header)
    for e in it:
        timeline.add(e)
        t = type(e)
        if t is TokenSample:
            if e.kept:
                outputs[e.seq_id].append(e.token_id)
            else:
                middle[(e.seq_id, positions[e.seq_id])] = e.token_id
        elif t is ScheduleDecision:
            if e.phase != "decode":      # prefill or mixed: where each sequence's sample was taken
                for s in e.seqs:
                    positions[s.seq_id] = s.num_cached_tokens + s.num_tokens
        elif t is RequestAdded:
            requests.append(Request(request_prompt(e), e.max_tokens, e.arrival_ns, e.temperature,
                                    e.ignore_eos, seq_id=e.seq_id, arrival_step=e.step, **session_fields(e)))
            outputs[e.seq_id] = []
    turns = {}
    for r in requests:      # a client that left: it leaves the new run when it left this one
        abort = timeline.requests[r.seq_id].abort
        if abort is not None:
            r.abort_step, r.abort_ns, r.abort_reason = abort.step, timeline.start_ns(abort.step), abort.reason
        if r.session_id:    # a later turn's think time in steps: from the step after its last dependency finished
            turns[(r.session_id, r.turn)] = r.seq_id
            deps = [turns.get((r.session_id, d)) for d in r.depends_on]
            if deps and None not in deps:      # (a fleet replica's stream may hold a turn and not its dependency)
                r.think_steps = r.arrival_step - max(timeline.requests[d].finish_step for d in deps) - 1
    return RecordedWorkload(header, requests, outputs, middle, timeline)


def context_len(config: Config) -> int:
    """The longest sequence `config` can run: max_model_len, or all the KV cache holds where that is less."""
    if config.num_kvcache_blocks <= 0:         # sized by a runner: not known here
        return config.max_model_len
    return min(config.max_model_len, config.num_kvcache_blocks * config.kvcache_block_size)


def requests_under(workload: RecordedWorkload, config: Config) -> list[Request]:
    """The workload's requests as they ask under `config`. A request whose prompt and max_tokens
    were exactly all the context there was asked for all of it (the server's default for a chat
    request without max_tokens), so under `config` it asks for all the context there is;
    every other request asks for what it asked (more than the context included: its own number)."""
    recorded_len, new_len = context_len(Config.from_dict(workload.header.config)), context_len(config)
    requests = []
    for r in workload.requests:
        num_prompt_tokens = len(r.prompt)
        whole = new_len - num_prompt_tokens
        if num_prompt_tokens + r.max_tokens == recorded_len and whole > 0 and whole != r.max_tokens:
            r = replace(r, max_tokens=whole)      # the prompt is shared, not copied
        requests.append(r)
    return requests


def whatif_config(workload: RecordedWorkload, overrides: dict) -> Config:
    """The recorded config with `overrides`; a recorded request that could never run under it is refused."""
    config = Config.from_dict(workload.header.config).replace(**overrides)
    check_requests(Scheduler(config), requests_under(workload, config), "the new config")
    return config


def config_changes(recorded: dict, new: dict) -> list[tuple[str, object, object]]:
    """(field, recorded value, new value) of each field two headers' configs differ in; a field
    the new header does not record (one a backend leaves to its engine) is no change."""
    return [(name, value, new[name]) for name, value in recorded.items() if name in new and new[name] != value]


def changed_fields(recorded: Config, config: Config) -> list[tuple[str, object, object]]:
    """(field, recorded value, new value) of each field of tracengine's config that `config` changes."""
    return config_changes(recorded.to_dict(), config.to_dict())


def whatif_in_steps(replay, overrides: dict, policy=None) -> WhatIfResult:
    """The what-if at recorded steps of any engine's trace, `replay` being its workload ready to
    run step by step (StepReplay, tracengine's engine; vllm/whatif.VllmStepReplay,
    sglang/whatif.SglangStepReplay): each request at the step it arrived, with its recorded
    output, under the recorded config with `overrides`. `policy`: tracengine's, as whatif's."""
    config = replay.config(overrides)
    events, num_past_output = replay.run(config, policy)
    return WhatIfResult(replay.original, stats(events), replay.changes(events[0].config), events, num_past_output)


class StepWorkload:
    """What every backend's workload ready to run at recorded steps shares: the figures of the
    recorded run (`recorded_run`: its events or timeline), taken once however many runs follow,
    and the changes of a new header's config."""
    header: TraceHeader
    recorded_run: object

    @cached_property
    def original(self) -> dict:
        return stats(self.recorded_run)

    def changes(self, new: dict) -> list[tuple[str, object, object]]:
        return config_changes(self.header.config, new)


class StepReplay(StepWorkload):
    """tracengine's engine's workload of a trace, ready to run at recorded steps under any
    config (whatif_in_steps): its step loop (sim/runners.run_workload) with no model, each
    sequence fed its recorded output (OutputRunner)."""

    def __init__(self, events, workload: RecordedWorkload | None = None, max_steps: int | None = None):
        self.workload = workload if workload is not None else extract_workload(events)
        self.header = self.workload.header
        self.recorded_run = self.workload.timeline
        self.max_steps = 100 * max(self.workload.timeline.num_steps, 1) + 10_000 if max_steps is None else max_steps

    def config(self, overrides: dict) -> Config:
        return whatif_config(self.workload, overrides)

    check = config

    def changes(self, new: dict) -> list[tuple[str, object, object]]:
        return changed_fields(Config.from_dict(self.header.config), Config.from_dict(new))

    def run(self, config: Config, policy=None) -> tuple[list, int]:
        """The new run's events (header first) and how many sequences ran past their recorded
        output; `policy`: the one to run, else the recorded one if it is built in."""
        workload = self.workload
        runner = OutputRunner(workload.outputs, workload.middle, filler=0 if config.eos != 0 else 1)
        events = run_workload(config, requests_under(workload, config), runner, max_steps=self.max_steps,
                              policy=policy)
        config = Config.from_dict(events[0].config)
        events[0] = msgspec.structs.replace(workload.header, config=config.to_dict(), created_at=time.time())
        return events, len(runner.past_output_seq_ids)


def whatif(events, overrides: dict, max_steps: int | None = None, policy: type | str | None = None,
           workload: RecordedWorkload | None = None) -> WhatIfResult:
    """Run the workload of `events` under the header's config with `overrides` (whatif_in_steps
    of tracengine's engine). The scheduling policy: `policy` if given, else
    `overrides["scheduling_policy"]`, else the recorded one if it is built in. `workload`: the
    events' extract_workload, when the caller has it."""
    if policy is None and "scheduling_policy" in overrides:
        policy = overrides["scheduling_policy"]
    return whatif_in_steps(StepReplay(events, workload, max_steps), overrides, policy)

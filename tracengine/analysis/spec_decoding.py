"""Speculative decoding's figures (`stats`' "spec_decoding", docs/stats.md): of the drafts each
step verified (a vLLM trace's SpecDecode, tracengine's DraftVerified), how many the output accepted
(SpecAccepted; DraftVerified), in all and per draft position, as vLLM's own spec-decoding metrics count them
(a verification: a request's drafts in a step whose output it sampled)."""
from collections import Counter
from dataclasses import dataclass, field

import msgspec

from tracengine.analysis.figures import DraftLength, SpecDecoding
from tracengine.analysis.kv_groups import pass_over
from tracengine.trace.events import ScheduleDecision, SpecDecode


@dataclass(slots=True)
class SpecCounts:
    num_verifications: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    drafted_at: list[int] = field(default_factory=list)     # per position: verifications with a draft there
    accepted_at: list[int] = field(default_factory=list)    # per position: those that accepted it
    verified: dict[int, int] = field(default_factory=dict)  # seq_id -> drafts verified, in the step in progress

    def scheduled(self, event) -> None:
        self.verified = dict(zip(event.seq_ids, event.num_spec_tokens))

    def accepted(self, event) -> None:
        for seq_id, a in zip(event.seq_ids, event.num_accepted):
            self.verified_drafts(self.verified.get(seq_id, a), a)

    def verified_drafts(self, num_drafts: int, num_accepted: int) -> None:
        """A request's `num_drafts` drafts verified in a step, the first `num_accepted` kept (a
        vLLM trace's SpecAccepted, or tracengine's DraftVerified)."""
        self.num_verifications += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        while len(self.drafted_at) < num_drafts:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for j in range(num_drafts):
            self.drafted_at[j] += 1
            self.accepted_at[j] += j < num_accepted

    def figures(self) -> SpecDecoding:
        n = self.num_verifications
        return SpecDecoding(
            num_verifications=n, num_draft_tokens=self.num_draft_tokens, num_accepted_tokens=self.num_accepted_tokens,
            acceptance_rate=self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None,
            mean_acceptance_length=1 + self.num_accepted_tokens / n if n else None,
            acceptance_rate_per_position=[a / d for a, d in zip(self.accepted_at, self.drafted_at)])


def spec_decoding_figures(timeline, source) -> SpecDecoding | None:
    """The trace's speculative decoding figures (None: no drafts); with a dynamic draft length (the
    header's num_speculative_tokens_per_batch_size), the length each step chose for its batch size
    (its requests scheduled, as vLLM's dynamic_sd_lookup reads it), counted in a pass of their own
    over `source` (a path or a list of events; none for an iterator)."""
    if timeline.spec_decoding is None:
        return None
    figures = timeline.spec_decoding.figures()
    header = timeline.header
    if header is None or not header.config.get("num_speculative_tokens_per_batch_size"):
        return figures
    return msgspec.structs.replace(figures, draft_lengths=pass_over(source, _draft_lengths))


def _draft_lengths(events) -> list[DraftLength]:
    chosen: dict[int, int] = {}      # step -> the draft length its SpecDecode says (it comes before its decision)
    counts: Counter = Counter()
    for e in events:
        t = type(e)
        if t is SpecDecode:
            chosen[e.step] = e.num_spec_tokens_to_schedule
        elif t is ScheduleDecision and e.step in chosen:
            counts[len(e.seqs), chosen.pop(e.step)] += 1
    return [DraftLength(batch_size=b, num_spec_tokens=k, num_steps=n) for (b, k), n in sorted(counts.items())]

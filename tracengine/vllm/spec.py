"""Speculative decoding (ngram) in a trace of vLLM's scheduler, and in a drive of it.

What the scheduler sees of it is three things, each an event: the drafts the engine core gives
it for a request after a step's output (`update_draft_token_ids`, synchronous scheduling:
SpecDraft), the drafts a step schedules for verification (`scheduled_spec_decode_tokens`,
placeholders with async scheduling, whose worker drafts: SpecDecode), and how many of them the
step's output accepted (a request's sampled tokens but the last: SpecAccepted). Re-execution
gives the scheduler the recorded drafts at the recorded points and the recorded tokens as the
model's output; nothing else decides.

A drive (drive.py) makes up what a model would give: a request's drafts at output length n
propose its tokens at positions n, n+1, ...; a draft is accepted while it equals the token the
request samples there, the rule vLLM's rejection sampler keeps for a drafter without
probabilities (ngram): an accepted draft is the sampled token, a rejected one never is. So the
acceptances follow from the drafts and the output tokens, in any schedule: a what-if gives each
request the recorded drafts (`Drafts`, from the trace) and its recorded tokens."""
import zlib

from tracengine.trace.events import SpecAccepted, SpecDecode, SpecDraft, TokenSample


# -- recording ------------------------------------------------------------------------------------

def spec_decode(step: int, out, seq_ids: dict[str, int], dynamic: bool = False) -> SpecDecode | None:
    """The drafts scheduled for verification in the step just scheduled (`out`); None: none. With a
    dynamic draft length (`dynamic`: num_speculative_tokens_per_batch_size), also a step that verifies
    none: the draft length the scheduler chose for its batch, which its drafts follow (the worker drafts
    that many; with async scheduling the next step's placeholders are that many)."""
    scheduled = out.scheduled_spec_decode_tokens
    if not scheduled:
        if dynamic and out.num_scheduled_tokens:
            return SpecDecode(step, [], [], out.num_spec_tokens_to_schedule)
        return None
    return SpecDecode(step, [seq_ids[req_id] for req_id in scheduled], [len(t) for t in scheduled.values()],
                      out.num_spec_tokens_to_schedule)


def spec_accepted(step: int, scheduler_output, model_output, before: dict, seq_ids: dict[str, int]):
    """The acceptances of a step's verified drafts, as vLLM's update_from_output counts them (a
    request whose output it processed and which sampled); None: nothing verified."""
    scheduled = scheduler_output.scheduled_spec_decode_tokens
    sampled = model_output.sampled_token_ids
    if not scheduled or not sampled:
        return None
    ids, accepted = [], []
    for req_id in scheduled:
        index = model_output.req_id_to_index.get(req_id)
        if req_id in before and index is not None and sampled[index]:
            ids.append(seq_ids[req_id])
            accepted.append(len(sampled[index]) - 1)
    return SpecAccepted(step, ids, accepted) if ids else None


def spec_drafts(step: int, draft_token_ids, seq_ids: dict[str, int], num_in_flight: int) -> list[SpecDraft]:
    """A call of update_draft_token_ids, a SpecDraft for each request the trace knows."""
    return [SpecDraft(step, seq_ids[req_id], list(tokens), num_in_flight)
            for req_id, tokens in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids)
            if req_id in seq_ids]


DYNAMIC_FIELD = "num_speculative_tokens_per_batch_size"


def dynamic_fields(spec) -> dict:
    """A header's dynamic draft length (vLLM's `num_speculative_tokens_per_batch_size`: (first batch size,
    last, draft length) ranges), as JSON in the flat config; {} without one."""
    schedule = getattr(spec, DYNAMIC_FIELD, None)
    if not schedule:
        return {}
    import json
    return {DYNAMIC_FIELD: json.dumps([list(r) for r in schedule])}


def dynamic_options(config: dict) -> dict:
    """SpeculativeConfig's dynamic draft length from a header's config ({} without one)."""
    if not config.get(DYNAMIC_FIELD):
        return {}
    import json
    return {DYNAMIC_FIELD: [tuple(r) for r in json.loads(config[DYNAMIC_FIELD])]}


# -- driving --------------------------------------------------------------------------------------

class Drafts:
    """A request's drafts: those proposed at an output length, and per output position the token
    a draft proposed there (the first proposal), for a length nothing was proposed at."""

    def __init__(self):
        self.at: dict[int, list[int]] = {}
        self.by_position: dict[int, int] = {}

    def add(self, num_output_tokens: int, tokens) -> None:
        self.at.setdefault(num_output_tokens, list(tokens))
        for j, token in enumerate(tokens):
            self.by_position.setdefault(num_output_tokens + j, token)

    def propose(self, num_output_tokens: int, k: int) -> list[int]:
        """Up to k drafts at this output length: as proposed there, else the known positions from it on."""
        if num_output_tokens in self.at:
            return self.at[num_output_tokens][:k]
        drafts = []
        while len(drafts) < k and num_output_tokens + len(drafts) in self.by_position:
            drafts.append(self.by_position[num_output_tokens + len(drafts)])
        return drafts


def made_up_drafts(key, num_output_tokens: int, k: int, token_at) -> list[int]:
    """A made-up drafter's k drafts: the request's own token at each position, but one in four
    (by `key`, the request's, and position) another token, which the model then rejects."""
    drafts = []
    for position in range(num_output_tokens, num_output_tokens + k):
        token = token_at(position)
        drafts.append(token if zlib.crc32(f"{key}:{position}".encode()) % 4 else token + 1)
    return drafts


def num_accepted(drafts, num_output_tokens: int, token_at) -> int:
    """The drafts accepted: the leading ones that are the tokens the request samples there."""
    a = 0
    while a < len(drafts) and drafts[a] == token_at(num_output_tokens + a):
        a += 1
    return a


def recorded_drafts(events, async_drafts: bool) -> dict[int, Drafts]:
    """seq_id -> its drafts, from a trace: each SpecDraft at the output length it was given at
    (synchronous scheduling), or (async, whose worker drafts) what each verification shows: the
    accepted drafts were the tokens sampled there, the first rejected one was not."""
    drafts: dict[int, Drafts] = {}
    outputs: dict[int, list[int]] = {}
    verified: dict[tuple[int, int], int] = {}
    verifications = []        # (seq_id, output length, accepted, verified), read once the tokens are
    for e in events:
        t = type(e)
        if t is TokenSample:
            if e.kept:
                outputs.setdefault(e.seq_id, []).append(e.token_id)
        elif t is SpecDraft:
            drafts.setdefault(e.seq_id, Drafts()).add(len(outputs.get(e.seq_id, ())), e.token_ids)
        elif t is SpecDecode:
            verified.update(((e.step, s), n) for s, n in zip(e.seq_ids, e.num_spec_tokens))
        elif t is SpecAccepted:
            verifications += [(s, len(outputs.get(s, ())), a, verified.get((e.step, s), a))
                              for s, a in zip(e.seq_ids, e.num_accepted)]
    for seq_id, n, a, v in (verifications if async_drafts else ()):
        tokens = outputs.get(seq_id, [])
        proposed = tokens[n:n + a]
        if a < v and n + a < len(tokens):
            proposed.append(tokens[n + a] + 1)       # rejected: any token but the one sampled there
        drafts.setdefault(seq_id, Drafts()).add(n, proposed)
    return drafts

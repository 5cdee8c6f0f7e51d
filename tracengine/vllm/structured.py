"""Structured output in a trace of vLLM's scheduler, and in its replay.

A request with structured output arrives waiting for its grammar (WAITING_FOR_FSM: the engine
core compiles it, asynchronously); each step the scheduler reaches it in the waiting queue it
asks whether the grammar is ready, and once it runs, whether the grammar accepts each sampled
token (a refusal ends the request with an error). Those are events: GrammarRequested after its
RequestAdded, GrammarState "ready" (or "failed": its compilation raised) at the step the
scheduler found it so, and "rejected" at the step its grammar refused a token.

A replay gives a recorded request the same structured output parameters and, in place of the
grammar, a stand-in (`RecordedGrammar`) that is ready from the recorded step on, fails where
the compilation failed, and accepts every token but where the recording's grammar refused: no
grammar backend (xgrammar, guidance, ...) is needed. The bitmask a grammar gives the model is
the worker's; the scheduler never decides from it."""
from concurrent.futures import Future

from tracengine.trace.events import RequestAdded
from tracengine.trace.vllm_events import GrammarRequested, GrammarState

# StructuredOutputsParams' constraints, the first one set naming a request's kind
KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def structured_kind(request) -> str:
    params = request.structured_output_request.params
    return next((kind for kind in KINDS if getattr(params, kind) not in (None, False)), "json")


def with_structured_output(request, kind: str = "json", grammar=None):
    """`request` (just made, not yet added) given structured output of `kind`, waiting for
    `grammar` (a Future, or the grammar) as the engine core's grammar_init leaves it."""
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.request import RequestStatus
    from vllm.v1.structured_output.request import StructuredOutputRequest
    value = {"json": {"type": "object"}, "json_object": True, "choice": ["a", "b"]}.get(kind, ".*")
    params = StructuredOutputsParams(**{kind: value})
    request.sampling_params.structured_outputs = params
    request.structured_output_request = StructuredOutputRequest(params=params)
    request.structured_output_request.grammar = grammar if grammar is not None else Future()
    request.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    return request


# -- recording ------------------------------------------------------------------------------------

def grammar_requested(recorder, request) -> None:
    """After a request's RequestAdded: its structured output, if any (the manager's accept_tokens
    observed from the first one on)."""
    if recorder is not None and request.structured_output_request is not None \
            and request.request_id in recorder.seq_ids:
        if "accept_tokens" not in recorder.scheduler.structured_output_manager.__dict__:
            observe_grammars(recorder)
        recorder.emit(GrammarRequested(recorder.current_step(), recorder.seq_id(request), structured_kind(request)))


def grammar_checked(recorder, request, was_waiting: bool) -> None:
    """After the scheduler asked whether a waiting request's grammar is ready: what it found."""
    if recorder is None or not was_waiting:
        return
    scheduler = recorder.scheduler
    if request.status != recorder.status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
        state = "ready"
    elif request.request_id in scheduler.grammar_compile_error_reqs:
        state = "failed"
    else:
        return
    recorder.emit(GrammarState(recorder.current_step(), recorder.seq_id(request), state))


def observe_grammars(recorder) -> None:
    """Records each refusal of the structured output manager's accept_tokens (it answers as before)."""
    manager = recorder.scheduler.structured_output_manager
    accept = manager.accept_tokens

    def accept_tokens(request, new_token_ids):
        accepted = accept(request, new_token_ids)
        if not accepted and request.request_id in recorder.seq_ids:
            recorder.emit(GrammarState(recorder.current_step(), recorder.seq_id(request), "rejected"))
        return accepted

    manager.accept_tokens = accept_tokens


def unobserve_grammars(scheduler) -> None:
    scheduler.structured_output_manager.__dict__.pop("accept_tokens", None)


# -- replay ---------------------------------------------------------------------------------------

class RecordedGrammar(Future):
    """A request's grammar as the trace has it: not ready before the step the recording's
    scheduler found it ready (or failed) at, then ready (or raising); `accept_tokens` refuses
    where the recorded grammar did."""

    def __init__(self, answers, request_id: str):
        super().__init__()
        self.answers, self.request_id = answers, request_id

    def done(self) -> bool:
        due = self.answers.due.get(self.request_id)
        return due is not None and self.answers.recorder.current_step() >= due[0]

    def result(self, timeout=None):
        if self.answers.due[self.request_id][1] == "failed":
            raise RuntimeError("the grammar's compilation failed (recorded)")
        return self

    def accept_tokens(self, request_id: str, tokens) -> bool:
        return (self.answers.recorder.current_step(), request_id) not in self.answers.rejected

    def validate_tokens(self, tokens):
        return list(tokens)

    def is_terminated(self) -> bool:
        return False

    def rollback(self, num_tokens: int) -> None:
        pass

    def reset(self) -> None:
        pass


class GrammarAnswers:
    """The trace's grammars: request id -> its kind, and (step, state) where it became ready or
    failed; (step, request id) of each refusal."""

    def __init__(self, recorder):
        self.recorder = recorder
        self.kinds: dict[str, str] = {}
        self.due: dict[str, tuple[int, str]] = {}
        self.rejected: set[tuple[int, str]] = set()

    def prepare(self, request) -> None:
        """A recorded request with structured output, as it is added: waiting for its grammar."""
        kind = self.kinds.get(request.request_id)
        if kind is not None and request.structured_output_request is None:
            with_structured_output(request, kind, RecordedGrammar(self, request.request_id))

    def accept_tokens(self, request, new_token_ids) -> bool:
        if not request.use_structured_output or not new_token_ids:
            return True
        return (self.recorder.current_step(), request.request_id) not in self.rejected


def answer_grammars(scheduler, frames) -> None:
    """Gives a replay's scheduler the trace's grammars (nothing for a trace without one)."""
    request_ids: dict[int, str] = {}
    answers = GrammarAnswers(scheduler.tracengine)
    for frame in frames:
        for e in frame:
            t = type(e)
            if t is RequestAdded:
                request_ids[e.seq_id] = e.request_id
            elif t is GrammarRequested:
                answers.kinds[request_ids[e.seq_id]] = e.kind
            elif t is GrammarState:
                if e.state == "rejected":
                    answers.rejected.add((e.step, request_ids[e.seq_id]))
                else:
                    answers.due.setdefault(request_ids[e.seq_id], (e.step, e.state))
    if answers.kinds:
        scheduler.tracengine.grammars = answers
        # the recorder observes the manager's accept_tokens: this answer under it
        scheduler.structured_output_manager.__dict__.pop("accept_tokens", None)
        scheduler.structured_output_manager.accept_tokens = answers.accept_tokens
        observe_grammars(scheduler.tracengine)

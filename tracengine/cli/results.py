"""The results of a generate run's finished requests, gathered from its events as they
come, so that an interrupted run (Ctrl-C, SIGTERM) still writes every finished one to
`--output`: the engine's own outputs exist only when the whole run returns."""
from tracengine.trace.events import RequestAdded, SeqFinish, StepEnd, TokenSample
from tracengine.trace.sinks import NULL_SINK


class FinishedResults:
    """A sink in front of `inner`: per sequence, its kept tokens, and when it finished.
    Times are on the trace's axis (analysis/timeline.py): a token appears at the end of the
    step that sampled it, and latencies run from the request's recorded arrival."""
    enabled = True

    def __init__(self, inner=NULL_SINK):
        self.inner = inner
        self.arrival_ns: dict[int, int] = {}
        self.token_ids: dict[int, list[int]] = {}
        self.first_token_ns: dict[int, int] = {}
        self.finished: dict[int, tuple[str, int]] = {}   # seq_id -> (finish reason, finish ns)
        self._finishing: list[tuple[int, str]] = []       # finished this step, timed at its StepEnd
        self._end_ns = 0                                  # the end of the last step

    def emit(self, event) -> None:
        kind = type(event)
        if kind is TokenSample and event.kept:
            tokens = self.token_ids[event.seq_id]
            if not tokens:
                self._finishing.append((event.seq_id, ""))    # its first token: timed at the StepEnd
            tokens.append(event.token_id)
        elif kind is RequestAdded:
            self.arrival_ns[event.seq_id] = event.arrival_ns
            self.token_ids[event.seq_id] = []
        elif kind is SeqFinish:
            self._finishing.append((event.seq_id, event.reason))
        elif kind is StepEnd:
            self._end_ns += event.gap_ns + event.schedule_ns + event.model_ns + event.postprocess_ns
            for seq_id, reason in self._finishing:
                if reason:
                    self.finished[seq_id] = (reason, self._end_ns)
                else:
                    self.first_token_ns[seq_id] = self._end_ns
            self._finishing = []
        if self.inner.enabled:
            self.inner.emit(event)

    def results(self, tokenizer) -> dict[int, dict]:
        """By seq_id, each finished request's result as `LLM.generate` gives it (no prompt)."""
        out = {}
        for seq_id, (reason, finish_ns) in self.finished.items():
            arrival_ns, tokens = self.arrival_ns[seq_id], self.token_ids[seq_id]
            out[seq_id] = {"text": tokenizer.decode(tokens), "token_ids": tokens, "finish_reason": reason,
                           "ttft_s": (self.first_token_ns[seq_id] - arrival_ns) / 1e9,
                           "latency_s": (finish_ns - arrival_ns) / 1e9}
        return out

"""A request, as every part takes it: a workload file's line, a synthetic or built-in
workload's request, a recorded request run again (what-if), a simulated one. Times are
ns from the start of the run, as the trace records them."""
from dataclasses import dataclass

NO_TIME = -1     # arrival_ns of a request added by step (a step-exact run), abort_* of one that never leaves


@dataclass(slots=True)
class Request:
    prompt: str | list[int]         # text (tokenized where a model runs) or token ids
    max_tokens: int = 64
    arrival_ns: int = NO_TIME       # when it arrives, in ns from the start of the run
    temperature: float = 1.0
    ignore_eos: bool = False
    top_k: int = -1                 # -1: all tokens
    top_p: float = 1.0
    seed: int = -1                  # -1: none of its own
    seq_id: int | None = None       # None: its index in the workload
    arrival_step: int = 0           # a step-exact run adds it before this step
    # When its client leaves (a recorded SeqAbort), if it is still running then: before step
    # `abort_step` of a step-exact run, at `abort_ns` of a run in time; NO_TIME: never.
    abort_step: int = NO_TIME
    abort_ns: int = NO_TIME
    abort_reason: str = "client"
    source: str = ""                # FILE:LINE it was read from, for messages
    # A turn of a session (workload/sessions.py): sent once the turns of its session it depends on
    # have finished, `think_ns` (a step-exact run: `think_steps`) after the last of them.
    session_id: str = ""            # "": not in a session (sent at its arrival)
    turn: int = 0                   # its index in its session
    depends_on: tuple[int, ...] = ()   # the turns it waits for (none: the first, sent at its arrival)
    think_ns: int = 0
    think_steps: int = 0
    # A later turn read from a workload file: `prompt` is its own input, sent after the session's
    # history (composed when it is sent); this many tokens of history at most. 0: the prompt is whole.
    num_history_tokens: int = 0

    @property
    def arrival_s(self) -> float:
        """The arrival in seconds, for people to read."""
        return self.arrival_ns / 1e9

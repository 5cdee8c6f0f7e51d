"""The generate progress bar: finished requests, prefill and decode throughput.
Its counters are for the live display only; the run's figures are
`tracengine stats`' (`LLM.generate(summary=True)` leaves them in `last_run`)."""
from tracengine.process.progress import RequestProgress


class GenerateProgress:

    def __init__(self, num_requests: int, enabled: bool = True):
        self.num_prefill_tokens = self.num_decode_tokens = 0
        self.prefill_s = self.decode_s = 0.0
        self.num_prefill_steps = self.num_decode_steps = 0
        self.bar = RequestProgress("Generating", num_requests, "prefill {task.fields[prefill]:>8.0f} tok/s  "
                                   "decode {task.fields[decode]:>8.0f} tok/s", enabled, prefill=0.0, decode=0.0)

    def __enter__(self):
        self.bar.update(0)
        return self

    def __exit__(self, *exc):
        self.bar.close()

    def update(self, num_tokens: int, is_prefill: bool, seconds: float, num_finished: int):
        if is_prefill:
            self.num_prefill_tokens += num_tokens
            self.prefill_s += seconds
            self.num_prefill_steps += 1
        else:
            self.num_decode_tokens += num_tokens
            self.decode_s += seconds
            self.num_decode_steps += 1
        self.bar.update(advance=num_finished, prefill=self.prefill_throughput, decode=self.decode_throughput)

    @property
    def prefill_throughput(self) -> float:
        return self.num_prefill_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_throughput(self) -> float:
        return self.num_decode_tokens / self.decode_s if self.decode_s else 0.0

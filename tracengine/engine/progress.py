"""The generate progress bar: finished requests, prefill and decode throughput.
Its counters are for the live display only; the run's figures are
`tracengine stats`' (`LLM.generate(summary=True)` leaves them in `last_run`)."""
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class GenerateProgress:

    def __init__(self, num_requests: int, enabled: bool = True):
        self.enabled = enabled
        self.num_prefill_tokens = self.num_decode_tokens = 0
        self.prefill_s = self.decode_s = 0.0
        self.num_prefill_steps = self.num_decode_steps = 0
        self.progress = Progress(
            TextColumn("Generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("prefill {task.fields[prefill]:>8.0f} tok/s  decode {task.fields[decode]:>8.0f} tok/s"),
            console=Console(stderr=True), transient=False, disable=not enabled)   # results go to stdout
        self.task = self.progress.add_task("generate", total=num_requests, prefill=0.0, decode=0.0)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def update(self, num_tokens: int, is_prefill: bool, seconds: float, num_finished: int):
        if is_prefill:
            self.num_prefill_tokens += num_tokens
            self.prefill_s += seconds
            self.num_prefill_steps += 1
        else:
            self.num_decode_tokens += num_tokens
            self.decode_s += seconds
            self.num_decode_steps += 1
        self.progress.update(self.task, advance=num_finished, prefill=self.prefill_throughput,
                             decode=self.decode_throughput)

    @property
    def prefill_throughput(self) -> float:
        return self.num_prefill_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_throughput(self) -> float:
        return self.num_decode_tokens / self.decode_s if self.decode_s else 0.0

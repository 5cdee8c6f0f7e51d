"""The one progress bar of a run: requests finished out of all, the time it has taken and a
line of live figures, on stderr (results go to stdout). It starts at its first report, so a
run refused before its first step prints none, and a run without one (--quiet) loads no rich."""


class RequestProgress:
    """`figures`: a rich format of the task's fields (`{task.fields[simulated_s]:,.1f} s
    simulated`), their first values given as keywords; `update` gives the new ones."""

    def __init__(self, title: str, num_requests: int, figures: str = "", enabled: bool = True, **initial):
        self.enabled = enabled
        self.num_requests = num_requests
        self.title, self.figures, self.initial = title, figures, initial
        self.progress = None
        self.task = None

    def update(self, num_finished: int | None = None, advance: int = 0, **figures):
        """`num_finished` so far, or `advance` by the number just finished."""
        if not self.enabled:
            return
        if self.task is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            self.progress = Progress(TextColumn(self.title), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                     TextColumn(self.figures), console=Console(stderr=True), transient=False)
            self.progress.start()
            self.task = self.progress.add_task("", total=self.num_requests, **self.initial)
        self.progress.update(self.task, completed=num_finished, advance=advance or None, **figures)

    def close(self):
        if self.task is not None:
            self.progress.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

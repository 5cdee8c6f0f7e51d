"""What every command shares: the exit codes (defined here only), the subcommand parser
with its help and exit-code epilog, and printing a table."""
import argparse

from tracengine.errors import TracengineError

EXIT_OK = 0
EXIT_FAILED_CHECK = 1     # replay diverges, diff finds a difference, check finds damage, a request failed
EXIT_BAD_INPUT = 2
EXIT_NOT_ENDED = 3        # check only: intact, but no end frame
EXIT_RUN_FAILED = 4       # check only: intact and closed, but its run failed or was interrupted
EXIT_INTERRUPTED = 130    # 128 + SIGINT
EXIT_TERMINATED = 143     # 128 + SIGTERM
EXIT_PIPE_CLOSED = 141    # 128 + SIGPIPE, what a shell reports for a writer whose reader left

EXIT_CODES = """\
exit status:
  0    success (a check holds: the trace is whole, replays exactly, no difference)
  1    a failed check: replay diverges, diff finds a difference, check finds damage
  2    bad input: a missing or corrupt file, an impossible config or request,
       an output file that exists (give --force to overwrite it)
  3    check only: the trace is intact but has no end frame (still being written,
       or its writer was killed)
  4    check only: the trace is intact and closed, but its run failed or was
       interrupted (the reason is printed); it ends at the last finished step
  130  interrupted (Ctrl-C, SIGINT); a trace being recorded ends at the last
       finished step, saying so, and finished results are written
  143  terminated (SIGTERM): as 130
  141  the output pipe closed before the command finished (`| head`): no
       verdict"""


def add_parser(sub, name: str, summary: str, description: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand whose --help has a description and the exit codes."""
    return sub.add_parser(name, help=summary, description=description, epilog=EXIT_CODES,
                          formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)


def print_table(*renderables) -> None:
    """Tables (analysis/tables.py) on stdout, a line per row whatever the terminal's width."""
    from tracengine.analysis.tables import table_text
    print(table_text(*renderables))


def parse_step_range(text: str, flag: str = "--step") -> tuple[int, int | None]:
    """`A` is one step; `A:B` steps A..B-1; either side of `:` may be empty."""
    first, sep, last = text.partition(":")
    try:
        start = int(first) if first.strip() else 0
        stop = start + 1 if not sep else int(last) if last.strip() else None
    except ValueError:
        raise TracengineError(f"{flag} expects a step or a range A:B, got {text!r}") from None
    if start < 0 or (stop is not None and stop <= start):
        raise TracengineError(f"{flag} expects a step >= 0 or a range A:B with 0 <= A < B, got {text!r}")
    return start, stop

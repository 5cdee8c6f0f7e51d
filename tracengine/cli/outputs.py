"""Files a command writes: never a regular file that exists (unless --force;
a device or a pipe, `--record /dev/null`, is written in place, never replaced), never a
directory, never one of the command's own inputs, and never two outputs in one.
And the note a command prints about a trace it read that ends torn."""
import os
import stat
import sys

from tracengine.errors import TracengineError


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:   # one of them does not exist (yet): compare where they would be
        return os.path.realpath(a) == os.path.realpath(b)


def _is_file_to_keep(path: str) -> bool:
    """An existing regular file (or a link to one, or a link to nothing), which writing would
    replace; a device or a named pipe is written in place, as every writer of a command does."""
    if not os.path.lexists(path):
        return False
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True


def check_outputs(outputs: dict[str, str | None], inputs: dict[str, str | None] | None = None,
                  force: bool = False) -> None:
    """`outputs` and `inputs` map a flag or argument name to a path (None: not given).
    Raises before anything is written, so a refused command leaves every file as it was."""
    given = [(flag, path) for flag, path in outputs.items() if path]
    for i, (flag, path) in enumerate(given):
        if os.path.isdir(path):
            raise TracengineError(f"{flag} {path!r} is a directory")
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):    # said now, not after a run (a sweep, a fit) that is then lost
            raise TracengineError(f"{flag} {path!r}: there is no directory {folder!r}")
        for name, source in (inputs or {}).items():
            if source and _same_file(path, source):
                raise TracengineError(f"{flag} {path!r} is the {name} it reads; write to another file")
        for other_flag, other in given[:i]:
            if _same_file(path, other):
                raise TracengineError(f"{flag} and {other_flag} name the same file {path!r}")
        if not force and _is_file_to_keep(path):
            raise TracengineError(f"{flag} {path!r} exists; give --force to overwrite it")


def note_torn_tail(reader) -> None:
    """After reading every event: say on stderr that the trace ends in a torn frame (a killed writer)."""
    if reader.torn_tail is not None:
        print(f"tracengine: note: {reader.path}: {reader.describe_torn_tail()}", file=sys.stderr)

"""SIGTERM handled as SIGINT is: a command that records or writes closes its files the
same way whichever of the two stops it (Kubernetes, systemd and `timeout` send SIGTERM)."""
import signal
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """A KeyboardInterrupt raised for a signal other than SIGINT; `signal_name` says which."""

    def __init__(self, signal_name: str = "SIGTERM"):
        super().__init__(signal_name)
        self.signal_name = signal_name


def interrupt_signal_name(exc: KeyboardInterrupt) -> str:
    """SIGINT for a plain KeyboardInterrupt (Ctrl-C), else the signal a Terminated names."""
    return getattr(exc, "signal_name", "SIGINT")


@contextmanager
def sigterm_as_interrupt():
    """Within: SIGTERM raises Terminated where the main thread is, as SIGINT raises
    KeyboardInterrupt. Outside the main thread (no handler can be set) it does nothing."""
    def handler(signum, frame):
        raise Terminated(signal.Signals(signum).name)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:          # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

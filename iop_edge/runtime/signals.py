"""SIGHUP and SIGUSR2 from the first instant of ``iop-edge serve`` (issues 10 and 25).

Python's default action for both ends the process, and importing the daemon's modules takes a
few hundred milliseconds: a ``systemctl reload``, a ``kill -HUP`` or a ``kill -USR2`` in that
window used to kill the daemon — a SIGUSR2 also the new process of a handover, while it
started. :mod:`iop_edge.cli` imports this module before anything slow; when the process is
``iop-edge serve`` (its first argument is ``serve``) a handler that only remembers the signal
is installed at once. Once the daemon's event loop runs it takes both over
(:meth:`iop_edge.daemon.Daemon.run`): if a SIGHUP arrived before, it asks for one refresh; a
SIGUSR2 that arrived before is logged and ignored — the process runs the program and config
it has just loaded, and the operator sends it again to restart.

Only the interpreter's own start, before any code of this package runs, is left uncovered
(outside systemd the thin parent, :mod:`iop_edge.runtime.parent`, holds both signals back until the
server it started is ready).

This module is small on purpose: it must not import anything that takes time to load.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # (not loaded at run time: this module stays light)
    import asyncio
    from collections.abc import Iterator
    from types import FrameType

SIGNALS: Final = (signal.SIGHUP, signal.SIGUSR2)
"""The signals remembered until the event loop takes them over."""

RESTART_SIGNAL_WHILE_STARTING: Final = (
    "a restart signal (SIGUSR2) arrived while the daemon was starting; it is ignored: the "
    "daemon runs the program and config it has just loaded; send it again once it is ready to "
    "restart it"
)
"""What the daemon and the thin parent log of a SIGUSR2 that came while the daemon started."""

PENDING: list[int] = []
"""The numbers of the signals received before the event loop took them over."""


def remember(signum: int, frame: FrameType | None) -> None:
    """The early handler: note the signal; the daemon acts on it once it runs."""
    PENDING.append(signum)


def install() -> None:
    """Install :func:`remember` for :data:`SIGNALS` (outside the main thread Python refuses:
    then nothing changes)."""
    with contextlib.suppress(ValueError):
        for signum in SIGNALS:
            signal.signal(signum, remember)


@contextlib.contextmanager
def early_signals() -> Iterator[list[int]]:
    """Make sure SIGHUP and SIGUSR2 only get remembered (Python's default action would kill
    the process) until the daemon's loop takes them over; yields the list of those received
    (their numbers). :func:`install` puts the same handler in when ``iop-edge serve``
    starts; on exit the handler found on entry is restored — unless it is that one: then the
    process is about to end and the signal stays ignored to the end (the interpreter resets a
    Python handler to the default action, which kills, when it finalizes)."""
    previous = {signum: signal.signal(signum, remember) for signum in SIGNALS}
    try:
        yield PENDING
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_IGN if handler is remember else handler)


def hand_back(loop: asyncio.AbstractEventLoop) -> None:
    """Take SIGHUP and SIGUSR2 back from the loop before it closes (closing would reset them
    to the default action, which kills) and ignore them: the daemon is stopping. They are
    blocked while the handlers swap, so there is no instant of default action in between."""
    signals = set(SIGNALS)
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        for signum in signals:
            loop.remove_signal_handler(signum)
            signal.signal(signum, signal.SIG_IGN)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


if sys.argv[1:2] == ["serve"]:
    install()

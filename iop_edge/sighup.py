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
(outside systemd the thin parent, :mod:`iop_edge.parent`, holds both signals back until the
server it started is ready).

This module is small on purpose: it must not import anything that takes time to load.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from types import FrameType
from typing import Final

SIGNALS: Final = (signal.SIGHUP, signal.SIGUSR2)
"""The signals remembered until the event loop takes them over."""

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


if sys.argv[1:2] == ["serve"]:
    install()

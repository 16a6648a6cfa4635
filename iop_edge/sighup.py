"""SIGHUP from the first instant of ``iop-edge serve`` (issue 10).

Python's default action for SIGHUP ends the process, and importing the daemon's modules takes a
few hundred milliseconds: a ``systemctl reload`` or a ``kill -HUP`` in that window used to kill
the daemon. :mod:`iop_edge.cli` imports this module before anything else; when the process is
``iop-edge serve`` (its first argument is ``serve``) a handler that only remembers the signal is
installed at once. Once the daemon's event loop runs it takes SIGHUP over and, if any arrived
before, asks for one refresh (:meth:`iop_edge.daemon.Daemon.run`).

Only the interpreter's own start, before any code of this package runs, is left uncovered.

This module is small on purpose: it must not import anything that takes time to load.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from types import FrameType

PENDING: list[int] = []
"""SIGHUPs received before the event loop took the signal over (only their number matters)."""


def remember(signum: int, frame: FrameType | None) -> None:
    """The early handler: note the signal; the daemon asks for a refresh once it runs."""
    PENDING.append(signum)


def install() -> None:
    """Install :func:`remember` for SIGHUP (outside the main thread Python refuses: then
    nothing changes)."""
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGHUP, remember)


if sys.argv[1:2] == ["serve"]:
    install()

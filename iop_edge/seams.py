"""The seams of iop-edge as ``typing.Protocol`` types, in one place.

The pure core never reads the clock; the shell reads one injected :class:`Clock`, so tests can
drive time by hand (see :class:`iop_edge.testing.clock.FakeClock`).
"""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    """A monotonic clock in seconds; the asyncio glue arms its timers against it."""

    def now(self) -> float:
        """Return the current monotonic time in seconds."""
        ...

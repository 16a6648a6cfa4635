"""The seams of iop-edge as ``typing.Protocol`` types, in one place.

The pure core never reads the clock; the shell reads one injected :class:`Clock`, so tests can
drive time by hand (see :class:`iop_edge.testing.clock.FakeClock`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    """A monotonic clock in seconds; the asyncio glue arms its timers against it."""

    def now(self) -> float:
        """Return the current monotonic time in seconds."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` from the event loop once ``now() >= when``; return its canceller.

        Calling the returned function cancels the timer if it has not fired (later calls and
        calls after it fired do nothing). A callback may run a little late, never early.
        """
        ...

"""The seams of iop-edge as ``typing.Protocol`` types, in one place.

The pure core never reads the clock; the shell reads one injected :class:`Clock`, so tests can
drive time by hand (see :class:`iop_edge.testing.clock.FakeClock`). The scheduler's health
checks run through a :data:`Prober` the daemon builds from the adapters.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

ProbeResult = tuple[bool, str | None]
"""A health check's verdict: whether the provider answered as healthy, and if not, why."""

Prober = Callable[[tuple[str, str]], Awaitable[ProbeResult]]
"""Runs the health check of provider ``(node_id, provider_id)``."""


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

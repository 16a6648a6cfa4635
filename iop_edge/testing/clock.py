"""A clock that tests move by hand (trio's ``MockClock`` habit).

:class:`FakeClock` implements :class:`iop_edge.seams.Clock`. Time stands still until a test calls
:meth:`FakeClock.advance` or :meth:`FakeClock.advance_to`; timers then fire in deadline order,
each one seeing ``now()`` equal to its own deadline, so tests can assert exact times.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class _Timer:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False


class FakeClock:
    """A monotonic clock that only moves when told to; its timers fire during the move."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _Timer]] = []
        self._order = itertools.count()

    def now(self) -> float:
        """The current fake time in seconds."""
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> Callable[[], None]:
        """Arm a timer for ``when``; it fires inside the :meth:`advance` that reaches it."""
        timer = _Timer(when, callback)
        heapq.heappush(self._timers, (when, next(self._order), timer))

        def cancel() -> None:
            timer.cancelled = True

        return cancel

    @property
    def armed(self) -> list[float]:
        """The deadlines of the timers still armed (not fired, not cancelled), soonest first."""
        return sorted(t.when for _, _, t in self._timers if not t.cancelled)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing every timer that comes due on the way."""
        if seconds < 0:
            raise ValueError(f"a monotonic clock cannot go back ({seconds} s)")
        self.advance_to(self._now + seconds)

    def advance_to(self, when: float) -> None:
        """Move time forward to ``when``, firing due timers in order (ties: arming order).

        A timer armed by a callback for a time within the move fires within the same move.
        """
        if when < self._now:
            raise ValueError(f"a monotonic clock cannot go back (from {self._now} to {when})")
        timers = self._timers
        while timers and timers[0][0] <= when:
            _, _, timer = heapq.heappop(timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, timer.when)
            timer.cancelled = True
            timer.callback()
        self._now = when

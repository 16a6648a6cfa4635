"""The real clock: the running event loop's monotonic time and timers.

:class:`MonotonicClock` implements :class:`iop_edge.seams.Clock` for every part of the shell
that reads time or arms a timer — admission, the listeners' guards, the adapters' deadlines —
so that a test can hand them all one :class:`iop_edge.testing.clock.FakeClock` instead. It
lives apart from them (it was in :mod:`iop_edge.admission`) so that the adapters can use it
without importing admission.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["MonotonicClock"]


class MonotonicClock:
    """The real clock: the running event loop's monotonic time and timers.

    The loop's own ``time()`` is used (not ``time.monotonic()`` directly) so that ``now()`` and
    timers agree under any loop implementation (uvloop included). Must be used from the loop.
    """

    __slots__ = ("_loop",)

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def now(self) -> float:
        """The event loop's monotonic time in seconds."""
        loop = self._loop
        if loop is None or loop.is_closed():
            # Looked up once: the request path reads the clock several times per request.
            loop = self._loop = asyncio.get_running_loop()
        return loop.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` on the loop once its time reaches ``when``; return its canceller."""
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle

        def fire() -> None:
            nonlocal handle
            # asyncio may run a timer up to its clock resolution early; the contract is never.
            if loop.time() < when:
                handle = loop.call_at(when, fire)
            else:
                callback()

        handle = loop.call_at(when, fire)

        def cancel() -> None:
            handle.cancel()

        return cancel

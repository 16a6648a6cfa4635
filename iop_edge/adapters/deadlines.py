"""The time bounds of upstream exchanges, with one timer per bound for all of them.

An :class:`Exchange` is one upstream call of an executor (an HTTP POST and its body, or a CLI
run) from its start to its end. It is bounded by:

- ``request_timeout_ms``, the whole exchange (every call);
- ``first_token_timeout_ms``, from the start to the first frame of a stream (a streamed call
  whose provider sets it);
- ``stream_idle_timeout_ms``, each wait for the upstream's next frame once one has come (a
  streamed call whose provider sets it). The time a frame waits for the client to take it is
  not the upstream's idleness: that wait is not counted.

Every exchange that one :class:`Deadlines` starts under one bound has the same timeout, so
they fall due in the order they joined it: an insertion-ordered dict per bound (per value,
since a refresh can change the stream bounds of calls to come), and one timer armed for the
oldest. Joining and leaving is a dict insert and delete; the timer fires about once per
timeout while exchanges keep coming, not once per exchange (a timer per exchange was about
3 % of a request's CPU).

Time is read from, and the timers armed on, one injected :class:`~iop_edge.seams.Clock` (the
daemon's; :class:`~iop_edge.runtime.clock.MonotonicClock` by default), so a test drives every bound
with a :class:`~iop_edge.testing.clock.FakeClock` and waits for none.

At a deadline the exchange stops whatever it waits for: an HTTP exchange reading a body has its
response aborted (which wakes a reader stalled on the network); any other wait — for a
response head, a CLI's output, or the client taking a frame (:meth:`Exchange.yielding`) — has
its task cancelled, and :meth:`Exchange.timed_out` withdraws that cancellation again (as
:func:`asyncio.timeout` does) so the caller raises the timeout instead
(:meth:`Exchange.timeout_error`).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from iop_edge.errors import AdapterError
from iop_edge.runtime.clock import MonotonicClock

if TYPE_CHECKING:
    from iop_edge.adapters.base import StreamBounds
    from iop_edge.seams import Clock

__all__ = ["Bound", "DeadlineStatistics", "Deadlines", "Exchange"]

Bound = Literal["request", "first_token", "idle"]
"""Which bound of an exchange passed."""

_FIELDS: Final[dict[Bound, str]] = {
    "request": "request_timeout_ms",
    "first_token": "first_token_timeout_ms",
    "idle": "stream_idle_timeout_ms",
}


class _Closable(Protocol):
    def close(self) -> None: ...


class _Timer:
    """The exchanges under one bound of one length, due in the order they joined, with one
    timer of the clock armed for the oldest."""

    __slots__ = ("_armed", "_live", "bound", "clock", "ms", "seconds")

    def __init__(self, bound: Bound, ms: int, clock: Clock) -> None:
        self.bound: Bound = bound
        self.ms = ms
        self.seconds = ms / 1000
        self.clock = clock
        self._live: dict[Exchange, float] = {}
        #: the loop in which the timer is armed (None: none is); a loop that closed with the
        #: timer armed (a test's) does not keep a later loop's exchanges from expiring, and a
        #: timer armed in it that still fires (a fake clock's) does nothing
        self._armed: asyncio.AbstractEventLoop | None = None

    def add(self, exchange: Exchange, loop: asyncio.AbstractEventLoop, now: float) -> None:
        due = now + self.seconds
        self._live[exchange] = due
        if self._armed is not loop:
            self._armed = loop
            self.clock.call_at(due, functools.partial(self._fire, loop))

    def discard(self, exchange: Exchange) -> None:
        self._live.pop(exchange, None)

    def __len__(self) -> int:
        return len(self._live)

    def exchanges(self) -> list[Exchange]:
        """The exchanges under this bound, oldest first."""
        return list(self._live)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._armed is not loop:
            return  # armed in a loop since closed: a later loop's timer serves
        now = self.clock.now()
        live = self._live
        while live:
            oldest = next(iter(live))
            due = live[oldest]
            if due > now:
                self.clock.call_at(due, functools.partial(self._fire, loop))
                return
            del live[oldest]
            oldest.expire(self)
        self._armed = None


class Exchange:
    """One upstream exchange and its bounds (see the module docstring). No timer of its own:
    its :class:`Deadlines` keeps one per bound for all its exchanges."""

    __slots__ = (
        "_cancelled",
        "_cancelling",
        "_expired_ms",
        "_first",
        "_idle",
        "_request",
        "_task",
        "deadline",
        "expired",
        "response",
        "writing",
    )

    def __init__(
        self,
        deadline: float,
        task: asyncio.Task[Any] | None,
        request: _Timer,
        first: _Timer | None = None,
        idle: _Timer | None = None,
    ) -> None:
        self.deadline = deadline
        #: the bound that passed (None: none has)
        self.expired: Bound | None = None
        self._expired_ms = 0
        #: an HTTP exchange's response once its head came (closed at a deadline)
        self.response: _Closable | None = None
        #: a frame waits for the client to take it (the request deadline then cancels the task)
        self.writing = False
        self._request = request
        self._first = first
        self._idle = idle
        self._task = task
        self._cancelling = task.cancelling() if task is not None else 0
        self._cancelled = False

    def expire(self, timer: _Timer) -> None:
        """``timer``'s bound passed: stop whatever the exchange is waiting for (once)."""
        if self.expired is not None:
            return
        self.expired = timer.bound
        self._expired_ms = timer.ms
        response = self.response
        if response is not None:
            response.close()
        if (response is None or self.writing) and self._task is not None:
            self._cancelled = True
            self._task.cancel()

    def yielding(self) -> None:
        """Frames of the upstream go to the client now: the first-token bound is met; the
        time the client takes is not the upstream's idleness; the request deadline cancels a
        write that waits for a client that does not read."""
        self.writing = True
        first = self._first
        if first is not None:
            self._first = None
            first.discard(self)
        idle = self._idle
        if idle is not None:
            idle.discard(self)

    def waiting(self) -> None:
        """The client took the frames; waiting for the upstream again (the idle bound counts
        from now)."""
        self.writing = False
        idle = self._idle
        if idle is not None:
            idle.add(self, asyncio.get_running_loop(), idle.clock.now())

    def end(self) -> None:
        """The exchange is over (finished or failed): forget it; idempotent."""
        self._request.discard(self)
        if self._first is not None:
            self._first.discard(self)
        if self._idle is not None:
            self._idle.discard(self)
            self._idle = None

    def timed_out(self) -> bool:
        """Whether the CancelledError the exchange's task caught is a deadline's (and nothing
        else's); then the cancellation is withdrawn and the caller raises the timeout
        instead. Answers True once."""
        if not self._cancelled or self._task is None:
            return False
        self._cancelled = False
        return self._task.uncancel() <= self._cancelling

    def timeout_error(self, where: str, *, answered: bool, after: str = "") -> AdapterError:
        """The ``upstream_timeout`` of the bound that passed, for ``where`` (the provider and
        its URL or command), ``after`` appended. A first-token timeout fails over like a
        timeout before the response head (nothing reached the client); the request deadline
        fails over when nothing had been ``answered``; an idle stream never does."""
        bound = self.expired or "request"
        ms = self._expired_ms if self.expired is not None else self._request.ms
        if bound == "first_token":
            text = f"{where} sent no first event within {_FIELDS[bound]}={ms}"
        elif bound == "idle":
            text = f"{where} sent no event for {_FIELDS[bound]}={ms} mid-stream"
        else:
            text = f"{where} did not finish within {_FIELDS[bound]}={ms}"
        return AdapterError(
            "upstream_timeout",
            text + after,
            status=504,
            failure="timeout",
            failover=bound == "first_token" or (bound == "request" and not answered),
        )


@dataclass(frozen=True, slots=True)
class DeadlineStatistics:
    """A snapshot of one :class:`Deadlines` (read at call time, kept nowhere)."""

    in_flight: int
    """Exchanges started and not ended."""
    answered: int
    """Of those, HTTP exchanges whose response head came (reading or relaying its body)."""
    writing: int
    """Of those, exchanges whose frames wait for the client to take them."""


class Deadlines:
    """The exchanges of one executor in flight, with one timer per bound on ``clock`` (see the
    module docstring)."""

    __slots__ = ("_bounds", "_clock", "_request", "seconds", "timeout_ms")

    def __init__(self, timeout_ms: int, clock: Clock | None = None) -> None:
        self.timeout_ms = timeout_ms
        self.seconds = timeout_ms / 1000
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._request = _Timer("request", timeout_ms, self._clock)
        #: the stream bounds met so far, by bound and length
        self._bounds: dict[tuple[Bound, int], _Timer] = {}

    def start(self, bounds: StreamBounds | None = None) -> Exchange:
        """A new exchange of the current task, due ``seconds`` from now, and under the
        ``bounds`` of a stream when given."""
        loop = asyncio.get_running_loop()
        now = self._clock.now()
        first = idle = None
        if bounds is not None:
            if bounds.first_token_ms is not None:
                first = self._timer("first_token", bounds.first_token_ms)
            if bounds.idle_ms is not None:
                idle = self._timer("idle", bounds.idle_ms)
        request = self._request
        exchange = Exchange(now + self.seconds, asyncio.current_task(), request, first, idle)
        request.add(exchange, loop, now)
        if first is not None:
            first.add(exchange, loop, now)
        return exchange

    def _timer(self, bound: Bound, ms: int) -> _Timer:
        timer = self._bounds.get((bound, ms))
        if timer is None:
            timer = self._bounds[bound, ms] = _Timer(bound, ms, self._clock)
        return timer

    def __len__(self) -> int:
        """Exchanges in flight."""
        return len(self._request)

    def statistics(self) -> DeadlineStatistics:
        """The exchanges in flight as of now (one pass over them: for tests and debugging,
        not the request path)."""
        live = self._request.exchanges()
        return DeadlineStatistics(
            in_flight=len(live),
            answered=sum(1 for e in live if e.response is not None),
            writing=sum(1 for e in live if e.writing),
        )

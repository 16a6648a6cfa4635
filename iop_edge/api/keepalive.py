"""The keep-alive of a streamed request that waits: its head, then an event at an interval.

A streamed request of a surface with a keep-alive event (Anthropic's ``ping``) may wait long
before its first token: in the queue (up to ``provider_pool.queue_timeout_ms``), for an
upstream that loads a model or works through a long prompt, across a failover. Proxies and
clients time out a response that says nothing for a minute or two. So the request path holds a
:class:`Keepalive` while such a request waits: once it has waited :data:`KEEPALIVE_INTERVAL`
seconds, the stream's head goes out (``200``, ``text/event-stream``, ``x-request-id``) with
the event, and the event again every interval, until the request path
:meth:`~Keepalive.settle`\\s it — to write the answer's first frame, or its error — on the same
response.

A request that waits less sends nothing early: its answer, or its refusal (a full queue is then
still a status, ``529``), goes out as if no keep-alive were held. Once the head went out, a
refusal can only travel in the stream (the surface's error event), and ``x-iop-provider`` is not
among the headers (no provider was chosen yet); failover still works, as the client has had no
byte of an answer.

**One timer for all.** A timer per request costs more than the rest of the keep-alive; the
waiting streams share one :class:`KeepaliveTicker` instead, which ticks every
:data:`TICK` seconds on the injected clock while any stream waits (and not at all otherwise): a
stream gets its event at the first tick at or after it is due, at most one tick late. A tick that
finds a stream due writes from a task of its own while the request path awaits (admission, the
upstream's head, its first frame), and :meth:`Keepalive.settle` waits for that write before the
request path writes again, so writes never interleave.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from aiohttp import web

from iop_edge.seams import Clock

__all__ = ["KEEPALIVE_INTERVAL", "TICK", "Keepalive", "KeepaliveTicker"]

KEEPALIVE_INTERVAL: Final = 10.0
"""Seconds between keep-alive events (and before the first): well under the 60 s that common
proxies allow a silent response (nginx's ``proxy_read_timeout``, cloud load balancers)."""

TICK: Final = 1.0
"""Seconds between the shared ticker's looks at the waiting streams."""


class KeepaliveTicker:
    """The one timer of a request path's waiting streams (see the module docstring)."""

    __slots__ = ("_cancel", "_clock", "_tick", "_waiting")

    def __init__(self, clock: Clock, tick: float = TICK) -> None:
        self._clock = clock
        self._tick = tick
        self._waiting: set[Keepalive] = set()
        self._cancel: Callable[[], None] | None = None

    @property
    def clock(self) -> Clock:
        """The clock the streams' due times are on."""
        return self._clock

    def add(self, keepalive: Keepalive) -> None:
        """Watch ``keepalive`` (its first event is due an interval from now)."""
        self._waiting.add(keepalive)
        if self._cancel is None:
            self._cancel = self._clock.call_at(self._clock.now() + self._tick, self._fire)

    def discard(self, keepalive: Keepalive) -> None:
        """Stop watching ``keepalive`` (the ticker stops with the last one)."""
        self._waiting.discard(keepalive)

    def _fire(self) -> None:
        self._cancel = None
        now = self._clock.now()
        for keepalive in [k for k in self._waiting if k.due <= now]:
            keepalive.fire(now)
        if self._waiting:
            self._cancel = self._clock.call_at(now + self._tick, self._fire)


class Keepalive:
    """The keep-alive of one waiting stream (see the module docstring)."""

    __slots__ = (
        "_event",
        "_headers",
        "_interval",
        "_request",
        "_ticker",
        "_writing",
        "due",
        "failed",
        "response",
    )

    def __init__(
        self,
        request: web.Request,
        ticker: KeepaliveTicker,
        event: bytes,
        headers: dict[str, str],
        interval: float = KEEPALIVE_INTERVAL,
    ) -> None:
        self._request = request
        self._ticker = ticker
        self._event = event
        self._headers = headers
        self._interval = interval
        self._writing: asyncio.Task[None] | None = None
        #: when the next event is due, on the ticker's clock
        self.due = ticker.clock.now() + interval
        #: the stream's response once its head went out (then every later write goes to it)
        self.response: web.StreamResponse | None = None
        #: a keep-alive write failed (the client left): the request path's next write fails
        self.failed = False
        ticker.add(self)

    def fire(self, now: float) -> None:
        """The ticker found the event due: write it (the head first, once)."""
        self.due = now + self._interval
        if self._writing is None or self._writing.done():
            self._writing = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        try:
            if self.response is None:
                response = web.StreamResponse(
                    status=200,
                    headers={
                        **self._headers,
                        "Content-Type": "text/event-stream",
                        "Cache-Control": "no-cache",
                    },
                )
                self.response = response
                await response.prepare(self._request)
            await self.response.write(self._event)
        except (ConnectionResetError, OSError):
            # The client left: stop; the request path finds out on its next write (or is
            # cancelled with the connection).
            self.failed = True
            self._ticker.discard(self)

    async def settle(self) -> web.StreamResponse | None:
        """Stop the keep-alive, wait for a write in progress, and return the response if its
        head went out (the request path then writes everything else to it)."""
        self._ticker.discard(self)
        writing = self._writing
        if writing is not None and not writing.done():
            await asyncio.shield(writing)
        return self.response

    def stop(self) -> None:
        """Stop at once (the request ends without waiting on a write: it was cancelled)."""
        self._ticker.discard(self)
        writing = self._writing
        if writing is not None and not writing.done():
            writing.cancel()

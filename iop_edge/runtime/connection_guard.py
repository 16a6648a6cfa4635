"""The guard of one accepted connection: its place under the listener's cap, its timers.

A :class:`ConnectionGuard` is the protocol the event loop sees for a connection; it forwards
every callback to aiohttp's ``RequestHandler`` and enforces its listener's rules (listed in
:mod:`iop_edge.runtime.listeners`) with at most one timer at a time: the request head's, a request
body's, a write stall's, or a refused connection's linger. It also knows what the connection
is doing — waiting for a head or for the rest of a body, running a handler, idle between
kept-alive requests — so that a listener at its cap can evict one that serves nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, cast

from aiohttp import web
from aiohttp.streams import StreamReader

if TYPE_CHECKING:
    from iop_edge.runtime.listeners import Listener

__all__ = ["REFUSAL_LINGER", "ConnectionGuard"]

REFUSAL_LINGER: Final = 2.0
"""Seconds a refused connection stays half-closed, for its client to read the 503 and close."""

#: ``SO_LINGER`` on, 0 s: closing the socket resets the connection and drops unsent data.
_RESET_ON_CLOSE: Final = struct.pack("ii", 1, 0)

# What a connection is doing, for eviction (tracked in full on evicting listeners only: the
# end of a request is seen by a wrapper around the handler, which the OpenAI listener does
# without).
_HEAD: Final = 0  # waiting for its first request head
_BODY: Final = 1  # a request head came; its body is still arriving
_BUSY: Final = 2  # a handler runs on a fully received request
_IDLE: Final = 3  # between two requests of a kept-alive connection


class ConnectionGuard(asyncio.Protocol):
    """The protocol the event loop sees for one connection: it forwards every callback to
    aiohttp's ``RequestHandler`` and enforces the listener's cap and timeouts (see
    :mod:`iop_edge.runtime.listeners`). A streaming relay finds it with :meth:`of` and registers
    with :meth:`watch`."""

    __slots__ = (
        "_cancel_timer",
        "_handler",
        "_listener",
        "_phase",
        "_stall_pending",
        "_task",
        "_task_cancelling",
        "_timer_kind",
        "body_timed_out",
        "transport",
    )

    def __init__(self, listener: Listener) -> None:
        self._listener = listener
        self._handler: Any = None
        self.transport: asyncio.Transport | None = None
        self._cancel_timer: Callable[[], None] | None = None
        self._timer_kind = ""
        self._task: asyncio.Task[Any] | None = None
        self._task_cancelling = 0
        self._stall_pending = False
        self._phase = _HEAD
        #: set when the body timer cut the connection (the handler logs 408 body_timeout)
        self.body_timed_out = False

    # -- transport callbacks -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Refuse the connection over the cap (unless the listener evicts another to make
        room); else arm the head timer and hand it on."""
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        listener = self._listener
        if listener.refuses_connections and not listener.evict():
            listener.refuse(transport)
            listener.refusing.add(self)
            self._arm("linger", REFUSAL_LINGER, self.abort)
            return
        listener.accepted += 1
        self._arm("head", listener.limits.header_timeout, self._head_timed_out)
        handler = self._handler = listener.make_handler()
        listener.connections[handler] = self
        handler.connection_made(transport)
        listener.check_fd(transport)

    def data_received(self, data: bytes) -> None:
        """Hand the bytes to aiohttp (nothing for a refused connection)."""
        handler = self._handler
        if handler is not None:
            handler.data_received(data)

    def eof_received(self) -> bool | None:
        """Hand the end of input to aiohttp (a refused connection closes: None)."""
        handler = self._handler
        return handler.eof_received() if handler is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection and let aiohttp cancel its handler."""
        listener = self._listener
        listener.refusing.discard(self)
        self._disarm()
        handler = self._handler
        if handler is not None:
            listener.connections.pop(handler, None)
            handler.connection_lost(exc)

    def pause_writing(self) -> None:
        """The client is not keeping up: writes now wait. Arm the stall timer."""
        handler = self._handler
        if handler is not None:
            handler.pause_writing()
            if self._cancel_timer is None:
                listener = self._listener
                listener.writes_waiting += 1
                self._arm("stall", listener.limits.write_timeout, self._stalled)

    def resume_writing(self) -> None:
        """The client read enough: writes flow again. Disarm the stall timer."""
        handler = self._handler
        if handler is not None:
            handler.resume_writing()
            if self._timer_kind == "stall":
                self._disarm()

    # -- the request path --------------------------------------------------------------------

    @staticmethod
    def of(request: web.BaseRequest) -> ConnectionGuard | None:
        """The guard of the connection ``request`` came on (None outside a guarded listener
        or once the connection is gone)."""
        transport = request.transport
        guard = transport.get_protocol() if transport is not None else None
        return guard if isinstance(guard, ConnectionGuard) else None

    def watch(self, task: asyncio.Task[Any] | None) -> None:
        """Until :meth:`unwatch`, a write stall cancels ``task`` (the current one) instead of
        aborting the connection; the task then calls :meth:`stall_cancelled` on its
        CancelledError."""
        if task is not None:
            self._task = task
            self._task_cancelling = task.cancelling()

    def unwatch(self) -> None:
        """End :meth:`watch`: a later stall aborts the connection itself."""
        self._task = None

    def stall_cancelled(self) -> bool:
        """Whether the CancelledError the watched task caught came from a write stall (and
        nothing else): then the cancellation is withdrawn and the task carries on to close
        the exchange, ending with :meth:`abort`. False: let the CancelledError propagate."""
        task = self._task
        if not self._stall_pending or task is None:
            return False
        self._stall_pending = False
        return task.uncancel() <= self._task_cancelling

    def abort(self) -> None:
        """Close the connection now, discarding what the client did not read."""
        if self.transport is not None:
            self.transport.abort()

    @property
    def header_timeout(self) -> float:
        """Seconds a client has to send a request head, or the rest of a body."""
        return self._listener.limits.header_timeout

    @property
    def evictable(self) -> bool:
        """Whether the connection runs no handler on a fully received request: it waits for
        a request head or body, or idles between kept-alive requests."""
        return self._phase != _BUSY

    @property
    def write_timeout(self) -> float:
        """Seconds a client may take no data while data waits for it."""
        return self._listener.limits.write_timeout

    # -- timers ------------------------------------------------------------------------------

    def _arm(self, kind: str, delay: float, callback: Callable[[], None]) -> None:
        clock = self._listener.clock
        self._timer_kind = kind
        self._cancel_timer = clock.call_at(clock.now() + delay, callback)

    def _disarm(self) -> None:
        cancel = self._cancel_timer
        if cancel is not None:
            self._cancel_timer = None
            if self._timer_kind == "stall":
                self._listener.writes_waiting -= 1
            cancel()
        self._timer_kind = ""

    def request_started(self, payload: StreamReader) -> None:
        """aiohttp made a request of a head it parsed: the head timer (a first request's) has
        done its job. A body still arriving gets ``header_timeout`` for the rest — a body
        trickled byte by byte, or one shorter than its ``Content-Length``, would hold the
        connection (and, on the console, a slot of its cap) forever — then the connection is
        aborted; its end disarms the timer. A body that came with its head arms nothing."""
        if self._timer_kind == "head":
            self._disarm()
        if payload.is_eof():
            self._phase = _BUSY
            return
        self._phase = _BODY
        if self._cancel_timer is None:
            self._arm("body", self._listener.limits.header_timeout, self._body_timed_out)
        payload.on_eof(self._body_received)

    def _body_received(self) -> None:
        if self._timer_kind == "body":
            self._disarm()
        if self._phase == _BODY:
            self._phase = _BUSY

    def request_done(self) -> None:
        """The handler of the current request returned: the connection idles (kept alive)
        until its next request head (or reads the rest of a body its handler left)."""
        self._phase = _IDLE

    def _body_timed_out(self) -> None:
        self._cancel_timer, self._timer_kind = None, ""
        self.body_timed_out = True
        listener = self._listener
        listener.header_timeouts += 1
        listener.warn(
            "body_timeout",
            message=f"closed connection(s) that did not send the rest of a request body within "
            f"{listener.limits.header_timeout:g} s",
        )
        self.abort()

    def _head_timed_out(self) -> None:
        self._cancel_timer, self._timer_kind = None, ""
        listener = self._listener
        listener.header_timeouts += 1
        listener.warn(
            "header_timeout",
            message=f"closed connection(s) that sent no complete request head within "
            f"{listener.limits.header_timeout:g} s",
        )
        self.abort()

    def _stalled(self) -> None:
        self._cancel_timer, self._timer_kind = None, ""
        listener = self._listener
        listener.writes_waiting -= 1
        listener.write_stalls += 1
        task = self._task
        if task is not None and not task.done():
            self._stall_pending = True
            task.cancel()
            return
        listener.warn(
            "client_stalled",
            message=f"aborted connection(s) whose client took no data for "
            f"{listener.limits.write_timeout:g} s",
        )
        self.reset()

    def reset(self) -> None:
        """Abort with a TCP reset: what the client did not read is dropped at once instead of
        lingering in the kernel's send buffer (megabytes per stalled client) for minutes."""
        transport = self.transport
        if transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        transport.abort()

"""One end of a node link over an aiohttp WebSocket: frames in and out, heartbeats, death
detection and byte counters (:class:`LinkConnection`), the same on the edge (a
``web.WebSocketResponse``) and on the node (a ``ClientWebSocketResponse``).

Heartbeats are the link's own frames, not WebSocket pings, so that each side measures the round
trip: every ``heartbeat_ms`` a side sends ``PING`` with its clock's time in ns, and the other
echoes it in ``PONG``. Any frame counts as life; nothing for 3 × ``heartbeat_ms`` and the link
is dead (closed with :data:`~iop_edge.link.protocol.CLOSE_DEAD`). Time comes from the injected
:class:`~iop_edge.seams.Clock` alone, so tests move it by hand.

There is no send lock: aiohttp writes an uncompressed frame synchronously, so frames from
concurrent senders never interleave (a message's frames on one stream may be interleaved with
other streams' frames, which the protocol allows).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Literal

from aiohttp import ClientWebSocketResponse, ClientWSTimeout, WebSocketError, WSMsgType, web

from iop_edge.errors import IopEdgeError
from iop_edge.link.protocol import (
    CLOSE_DEAD,
    CLOSE_TOO_BIG,
    CLOSE_VIOLATION,
    Frame,
    Kind,
    LinkViolation,
    check_direction,
    decode,
    encode,
    ping_data,
    ping_ns,
)

if TYPE_CHECKING:
    from iop_edge.link.handshake import LinkLimits
    from iop_edge.seams import Clock

__all__ = [
    "DEAD_AFTER_HEARTBEATS",
    "RTT_WEIGHT",
    "LinkClosed",
    "LinkConnection",
    "client_options",
    "server_websocket",
]

DEAD_AFTER_HEARTBEATS: Final = 3
"""A link from which nothing arrived for this many heartbeat intervals is dead."""
RTT_WEIGHT: Final = 0.2
"""The weight of a new round-trip sample in :attr:`LinkConnection.rtt`'s moving average."""
CLOSE_TIMEOUT_SECONDS: Final = 5.0
"""How long aiohttp waits for the peer's close frame when nothing else reads the socket."""
_MAX_REASON_BYTES: Final = 123  # RFC 6455: a close frame's payload is at most 125 bytes.
_NS: Final = 1_000_000_000

WebSocket = web.WebSocketResponse | ClientWebSocketResponse
"""Either end of an aiohttp WebSocket."""


def server_websocket(limits: LinkLimits) -> web.WebSocketResponse:
    """The edge's ``WebSocketResponse`` for ``GET /link``: binary frames up to
    ``max_frame_bytes`` (aiohttp closes a larger one with 1009), no compression (no deflate
    bombs, no CPU), no aiohttp heartbeat (the link has its own)."""
    return web.WebSocketResponse(
        compress=False,
        max_msg_size=limits.max_frame_bytes,
        autoping=True,
        heartbeat=None,
        timeout=CLOSE_TIMEOUT_SECONDS,
    )


def client_options(limits: LinkLimits) -> dict[str, Any]:
    """The node's keyword arguments for ``ClientSession.ws_connect`` to match
    :func:`server_websocket` (the node dials before it knows the edge's limits: it passes the
    defaults, which a v1 edge keeps)."""
    return {
        "compress": 0,
        "max_msg_size": limits.max_frame_bytes,
        "autoping": True,
        "heartbeat": None,
        "timeout": ClientWSTimeout(ws_close=CLOSE_TIMEOUT_SECONDS),
    }


class LinkClosed(IopEdgeError):
    """The link is closed: by the peer, by this side (:meth:`LinkConnection.close`) or for
    silence. ``code`` is the WebSocket close code (``None`` when the connection just
    dropped), ``reason`` the close reason, ``local`` whether this side closed it."""

    def __init__(self, code: int | None, reason: str, *, local: bool) -> None:
        self.code = code
        self.reason = reason
        self.local = local
        who = "this side" if local else "the peer"
        super().__init__(f"the node link was closed by {who} (code {code}, reason {reason!r})")


class LinkConnection:
    """One end of a node link: :meth:`send` frames, :meth:`receive` the peer's (``PING`` and
    ``PONG`` are answered and measured inside), heartbeats once :meth:`start_heartbeats` is
    called, and :meth:`close`.

    ``local`` is the side this end is (``edge`` or ``node``): a frame of a kind only this side
    may send is a violation. One task calls :meth:`receive` in a loop; any task may send.
    """

    def __init__(
        self,
        ws: WebSocket,
        *,
        local: Literal["edge", "node"],
        limits: LinkLimits,
        clock: Clock,
        peer: str = "",
    ) -> None:
        self._ws = ws
        self._from_node = local == "edge"
        self.limits = limits
        """The limits frames are checked against (the node replaces them after ``WELCOME``)."""
        self._clock = clock
        self.peer = peer
        """The peer's address, for logs."""
        self._bytes_sent = 0
        self._bytes_received = 0
        self._rtt: float | None = None
        self._last_received = clock.now()
        self._heartbeat: float | None = None
        self._ping_timer: Callable[[], None] | None = None
        self._watch_timer: Callable[[], None] | None = None
        self._pings_window_start = self._last_received
        self._pings_in_window = 0
        self._closing: tuple[int, str] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def bytes_sent(self) -> int:
        """Frame bytes sent so far (WebSocket framing not counted)."""
        return self._bytes_sent

    @property
    def bytes_received(self) -> int:
        """Frame bytes received so far (WebSocket framing not counted)."""
        return self._bytes_received

    @property
    def rtt(self) -> float | None:
        """The ``PING`` round trip in seconds, a moving average (``None`` before the first
        ``PONG``)."""
        return self._rtt

    @property
    def last_received(self) -> float:
        """The clock's time when a frame last arrived (the start, before any)."""
        return self._last_received

    @property
    def closed(self) -> bool:
        """Whether this side closed the link or the WebSocket is closed."""
        return self._closing is not None or self._ws.closed

    @property
    def close_code(self) -> int | None:
        """The close code this side chose, else the WebSocket's (``None``: still open)."""
        return self._closing[0] if self._closing is not None else self._ws.close_code

    async def send(self, frame: Frame) -> None:
        """Send one frame; :class:`LinkClosed` when the link is closed."""
        if self._closing is not None:
            code, reason = self._closing
            raise LinkClosed(code, reason, local=True)
        if self._ws.closed:
            raise LinkClosed(self._ws.close_code, "closed", local=False)
        raw = encode(frame)
        try:
            await self._ws.send_bytes(raw)
        except ConnectionError as exc:
            raise LinkClosed(self._ws.close_code, str(exc), local=False) from exc
        self._bytes_sent += len(raw)

    async def receive(self) -> Frame:
        """The peer's next frame (its ``PING`` is answered, its ``PONG`` measured, neither is
        returned). Raises :class:`LinkViolation` for a text message, an undecodable frame, a
        kind in the wrong direction, a ``PING`` flood or an oversize message — the link is
        then closed with :data:`CLOSE_VIOLATION` (an oversize one by aiohttp, with 1009) —
        and :class:`LinkClosed` once the link is closed."""
        try:
            while True:
                frame = await self._next_frame()
                kind = frame.kind
                if kind is Kind.PING:
                    await self._answer_ping(frame)
                elif kind is Kind.PONG:
                    self._measure(frame)
                else:
                    check_direction(kind, from_node=self._from_node)
                    return frame
        except LinkViolation as exc:
            if not self.closed:
                await self.close(CLOSE_VIOLATION, exc.reason)
            raise

    async def _next_frame(self) -> Frame:
        msg = await self._ws.receive()
        kind = msg.type
        if kind is WSMsgType.BINARY:
            raw: bytes = msg.data
            self._bytes_received += len(raw)
            self._last_received = self._clock.now()
            return decode(raw, self.limits)
        if kind is WSMsgType.TEXT:
            raise LinkViolation(
                "text_message", "the peer sent a text message; the link carries binary frames"
            )
        error = msg.data if kind is WSMsgType.ERROR else None
        if isinstance(error, WebSocketError) and error.code == CLOSE_TOO_BIG:
            raise LinkViolation(
                "frame_too_large",
                f"the peer sent a message over max_frame_bytes ({self.limits.max_frame_bytes})",
            )
        if self._closing is not None:
            code, reason = self._closing
            raise LinkClosed(code, reason, local=True)
        if kind is WSMsgType.CLOSE:
            raise LinkClosed(msg.data, msg.extra or "", local=False)
        raise LinkClosed(self._ws.close_code, str(msg.data or kind.name.lower()), local=False)

    async def _answer_ping(self, frame: Frame) -> None:
        now = self._clock.now()
        if now - self._pings_window_start >= 1.0:
            self._pings_window_start = now
            self._pings_in_window = 0
        self._pings_in_window += 1
        if self._pings_in_window > self.limits.max_pings_per_second:
            raise LinkViolation(
                "ping_flood",
                f"the peer sent {self._pings_in_window} PINGs within a second; at most "
                f"{self.limits.max_pings_per_second} are allowed",
            )
        ping_ns(frame)  # (an 8-byte time, else a violation: a PONG echoes it as it came)
        with contextlib.suppress(LinkClosed):
            await self.send(Frame(Kind.PONG, data=frame.data))

    def _measure(self, frame: Frame) -> None:
        sample = self._clock.now() - ping_ns(frame) / _NS
        if sample < 0:
            return  # (not a time this side sent: nothing to learn from it)
        rtt = self._rtt
        self._rtt = sample if rtt is None else rtt + RTT_WEIGHT * (sample - rtt)

    def start_heartbeats(self, heartbeat_ms: int) -> None:
        """Send ``PING`` every ``heartbeat_ms`` and declare the link dead after
        :data:`DEAD_AFTER_HEARTBEATS` intervals without a frame from the peer, counted from
        now or the last frame (whichever is later). Calling it again changes the interval."""
        self._cancel_timers()
        self._heartbeat = heartbeat_ms / 1000
        now = self._clock.now()
        self._last_received = max(self._last_received, now)
        self._arm_ping(now + self._heartbeat)
        self._arm_watch(self._last_received + DEAD_AFTER_HEARTBEATS * self._heartbeat)

    def _arm_ping(self, when: float) -> None:
        def fire() -> None:
            if self.closed or self._heartbeat is None:
                return
            now_ns = round(self._clock.now() * _NS)
            self._spawn(self._send_quietly(Frame(Kind.PING, data=ping_data(now_ns))))
            self._arm_ping(when + self._heartbeat)

        self._ping_timer = self._clock.call_at(when, fire)

    def _arm_watch(self, when: float) -> None:
        # One timer per silence, not one per frame: when it fires, a frame that arrived since
        # moves the deadline and it is armed again, so frames on the hot path arm nothing.
        def fire() -> None:
            if self.closed or self._heartbeat is None:
                return
            deadline = self._last_received + DEAD_AFTER_HEARTBEATS * self._heartbeat
            if self._clock.now() < deadline:
                self._arm_watch(deadline)
                return
            # Closed at once (a frame sent or received from now on sees it), the socket in a task.
            if self._begin_close(CLOSE_DEAD, "heartbeat"):
                self._spawn(self._close_socket(CLOSE_DEAD, "heartbeat"))

        self._watch_timer = self._clock.call_at(when, fire)

    async def _send_quietly(self, frame: Frame) -> None:
        with contextlib.suppress(LinkClosed):
            await self.send(frame)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _cancel_timers(self) -> None:
        for cancel in (self._ping_timer, self._watch_timer):
            if cancel is not None:
                cancel()
        self._ping_timer = self._watch_timer = None

    async def close(self, code: int, reason: str = "") -> None:
        """Close the link with ``code`` and ``reason`` (cut to fit a close frame); the task
        in :meth:`receive` then gets :class:`LinkClosed` with them. Idempotent."""
        if self._begin_close(code, reason):
            await self._close_socket(code, reason)

    def _begin_close(self, code: int, reason: str) -> bool:
        """Mark the link closed (False: it already was) and stop the heartbeats."""
        if self._closing is not None:
            return False
        self._closing = (code, reason)
        self._heartbeat = None
        self._cancel_timers()
        return True

    async def _close_socket(self, code: int, reason: str) -> None:
        with contextlib.suppress(ConnectionError):
            await self._ws.close(code=code, message=reason.encode()[:_MAX_REASON_BYTES])

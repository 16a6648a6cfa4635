"""The daemon's listening sockets: aiohttp behind a thin per-connection guard.

aiohttp speaks HTTP; a :class:`~iop_edge.runtime.connection_guard.ConnectionGuard` sits between each
accepted transport and aiohttp's protocol and adds what a daemon facing broken or hostile
clients needs (issues 10 and 25), with at most one timer of its own per connection at a time;
a :class:`Listener` holds a listener's guards, its limits and its counters:

- **a connection cap** per listener: over it, a new connection is answered a ``503`` with
  ``Retry-After`` at once and closed when the client has read it (at most ``REFUSAL_LINGER``
  later) — the daemon and the requests it serves carry on — and a ``connection_limit``
  warning, rate-limited on the listener's clock, names the listener and the cap. A listener
  that **evicts** (``ConnectionLimits.evict_idle``: the console and metrics listeners, whose
  operator must get in while idle or hostile connections fill the cap) first closes its oldest
  connection that is not running a handler on a fully received request — one still waiting
  for its request head or body, or idle between kept-alive requests — and takes the newcomer;
  only when every connection is busy is the newcomer refused. Each eviction is counted and
  logged (``connection_evicted``, rate-limited);
- **a request-head timeout**: a connection that has not sent a complete first request head
  within ``header_timeout`` is closed (slowloris). A kept-alive connection waiting for its next
  head is closed by aiohttp's keep-alive timer, whether bytes trickle in or not;
- **a request-body timeout**, on every listener: a request whose body has not fully arrived
  with its head gets ``header_timeout`` more for the rest (armed when aiohttp makes the request,
  disarmed at the body's end); then the connection is aborted and a ``body_timeout`` warning
  logged (the OpenAI surface logs the request 408 ``body_timeout``). A body that came whole
  with its head, the usual case, arms nothing;
- **a write-stall timeout**: the transport tells its protocol when its send buffer passes the
  high-water mark (a write now has to wait for the client to read); only then is a timer armed,
  and cancelled when the buffer drains. If the client takes nothing for ``write_timeout``, the
  exchange is aborted: a streaming relay that registered with :meth:`ConnectionGuard.watch` is
  cancelled (it then closes its upstream, releases its slot and logs ``client_stalled``); any
  other response has its connection aborted;
- **file descriptors**: an accepted socket whose descriptor number reaches 90 % of the soft
  ``RLIMIT_NOFILE`` (descriptors are allocated lowest first, so that many are in use) logs a
  rate-limited ``fd_limit_near`` warning; :func:`raise_fd_limit` lifts the soft limit at start;
- **drain** (:meth:`Listener.stop_accepting`, :meth:`Listener.drain`, :meth:`Listener.cut`):
  stop listening and close idle connections, let requests finish until a deadline, abort what
  is left, and wait for the handlers to unwind.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

from aiohttp import web

from iop_edge.config.address import ListenAddress
from iop_edge.envelope import envelope
from iop_edge.errors import ListenError
from iop_edge.runtime.connection_guard import REFUSAL_LINGER, ConnectionGuard
from iop_edge.runtime.logs import Logger, RateLimiter
from iop_edge.seams import Clock

__all__ = [
    "ADMIN_MAX_CONNECTIONS",
    "REFUSAL_LINGER",
    "ConnectionGuard",
    "ConnectionLimits",
    "FdLimit",
    "Listener",
    "ListenerStatistics",
    "raise_fd_limit",
]

ADMIN_MAX_CONNECTIONS: Final = 64
"""The connection cap of the console and metrics listeners (an operator and a scraper)."""

FD_WARN_FRACTION: Final = 0.9
"""An accepted descriptor numbered at this fraction of the soft limit or above logs a warning."""

_REFUSAL_RETRY_AFTER: Final = 1

LISTEN_BACKLOG: Final = 4096
"""Connections the kernel queues for a listener before it accepts them (capped by the kernel's
``somaxconn``): while a handover or a restart passes the socket on, they wait, not refused."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The timeouts (seconds) and the connection cap of one listener."""

    keepalive_timeout: float
    header_timeout: float
    write_timeout: float
    max_connections: int
    #: At the cap, close the oldest connection that serves no request instead of refusing the
    #: new one (the console and metrics listeners: their operator must always get in).
    evict_idle: bool = False

    @classmethod
    def from_config(cls, openai: Any) -> ConnectionLimits:
        """The OpenAI listener's limits from the ``openai`` config section."""
        return cls(
            keepalive_timeout=openai.keepalive_timeout_ms / 1000,
            header_timeout=openai.header_timeout_ms / 1000,
            write_timeout=openai.write_timeout_ms / 1000,
            max_connections=openai.max_connections,
        )


@dataclass(frozen=True, slots=True)
class ListenerStatistics:
    """A read-only view of one listener's connections and what its guards did."""

    name: str
    max_connections: int
    open_connections: int
    writes_waiting: int
    """Connections whose client is not reading while data waits for it (stall timer armed)."""
    accepted: int
    refused: int
    header_timeouts: int
    """Connections closed for a request head or body not complete in time."""
    write_stalls: int
    evicted: int
    """Connections closed at the cap to make room for a new one (``evict_idle``)."""


@dataclass(frozen=True, slots=True)
class FdLimit:
    """``RLIMIT_NOFILE`` before and after :func:`raise_fd_limit`."""

    soft_before: int
    soft: int
    hard: int


def raise_fd_limit() -> FdLimit:
    """Raise the soft open-file limit to the hard one (a connection is a descriptor; so is
    every upstream connection and CLI pipe). Leaves it unchanged when the kernel refuses."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = soft
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            new = hard
    return FdLimit(soft_before=soft, soft=new, hard=hard)


_BIND_REASONS: Final = {
    errno.EADDRINUSE: "the address is already in use: another process listens there ({who})",
    errno.EACCES: "permission denied: a port below 1024 needs root or CAP_NET_BIND_SERVICE",
    errno.EADDRNOTAVAIL: "the host is not an address of this machine",
}


def bind_failure(name: str, address: ListenAddress, exc: OSError) -> str:
    """One line saying why listener ``name`` cannot bind ``address`` (``exc`` from bind)."""
    who = f"`ss -ltnp 'sport = :{address.port}'` names it"
    reason = _BIND_REASONS.get(exc.errno or 0)
    if reason is None and isinstance(exc, socket.gaierror):
        reason = f"the host {address.host!r} does not resolve ({exc.strerror or exc})"
    if reason is None:
        reason = exc.strerror or str(exc)
    return (
        f"the {name} listener cannot listen on {address} ({name}.listen): {reason.format(who=who)}"
    )


class Listener:
    """One bound address served by an aiohttp application through :class:`ConnectionGuard`.

    Built by :meth:`bind`. ``runner`` is the aiohttp runner (its ``server`` is aiohttp's
    connection manager); ``host`` and ``port`` are where it listens (port 0 resolved).
    """

    def __init__(
        self,
        name: str,
        runner: web.AppRunner,
        limits: ConnectionLimits,
        *,
        clock: Clock,
        log: Logger,
    ) -> None:
        self.name = name
        self.runner = runner
        self.limits = limits
        self.clock = clock
        self.log = log
        self.host = ""
        self.port = 0
        #: whether the listener serves TLS (its :attr:`url` is ``https://``)
        self.tls = False
        #: the accepted connections by aiohttp handler, oldest first
        self.connections: dict[Any, ConnectionGuard] = {}
        #: refused connections, half-closed until their client closes (``REFUSAL_LINGER``)
        self.refusing: set[ConnectionGuard] = set()
        self.accepted = self.refused = self.header_timeouts = self.write_stalls = 0
        self.evicted = 0
        self.writes_waiting = 0
        self.closing = False
        self._server: asyncio.AbstractServer | None = None
        self._limiter = RateLimiter(clock=clock.now)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._fd_soft = soft
        self._fd_warn_at = int(soft * FD_WARN_FRACTION) if soft > 0 else 1 << 62
        self._refusal = _refusal_response(name, limits.max_connections)
        server = runner.server
        assert server is not None, "the runner must be set up first"
        self.make_handler: Callable[[], Any] = server
        # aiohttp calls its request factory once per request head it parsed: the moment the
        # head timer of a new connection can go, and a body still arriving gets its timer
        # (one dict lookup per request; no timer for a body that came with its head).
        make_request = server.request_factory
        connections = self.connections

        def request_started(
            message: Any, payload: Any, protocol: Any, writer: Any, task: Any
        ) -> web.BaseRequest:
            guard = connections.get(protocol)
            if guard is not None:
                guard.request_started(payload)
            return make_request(message, payload, protocol, writer, task)

        server.request_factory = request_started
        if limits.evict_idle:
            # Eviction must know when a request is over; the OpenAI listener, which never
            # evicts, saves its requests this wrapper.
            handle = server.request_handler

            async def handle_request(request: web.BaseRequest) -> web.StreamResponse:
                try:
                    return await handle(request)
                finally:
                    guard = connections.get(request.protocol)
                    if guard is not None:
                        guard.request_done()

            server.request_handler = handle_request

    @classmethod
    async def bind(
        cls,
        name: str,
        app: web.Application,
        address: str,
        limits: ConnectionLimits,
        *,
        clock: Clock,
        log: Logger,
        sock: socket.socket | None = None,
        serve: bool = True,
        ssl_context: ssl.SSLContext | None = None,
    ) -> Listener:
        """Serve ``app`` on ``address`` (``HOST:PORT``, ``[::1]:PORT``), or on ``sock``, a
        listening socket passed in (:mod:`iop_edge.runtime.activation`), whatever its address;
        over TLS with ``ssl_context`` (the node listener's ``listen.tls``: the guard then sits
        behind the TLS layer and sees the decrypted stream). Client disconnects cancel their
        handler; keep-alive idles end after ``limits.keepalive_timeout``."""
        runner = web.AppRunner(
            app,
            handler_cancellation=True,
            access_log=None,
            keepalive_timeout=limits.keepalive_timeout,
            # Only a backstop: the daemon drains and cuts connections itself before it closes
            # the runner (aiohttp's own shutdown would wait twice this per connection).
            shutdown_timeout=1.0,
        )
        await runner.setup()
        listener = cls(name, runner, limits, clock=clock, log=log)
        loop = asyncio.get_running_loop()
        try:
            if sock is None:
                parsed = ListenAddress.parse(address)
                try:
                    listener._server = await loop.create_server(
                        lambda: ConnectionGuard(listener),
                        parsed.host,
                        parsed.port,
                        reuse_address=True,
                        backlog=LISTEN_BACKLOG,
                        start_serving=serve,
                        ssl=ssl_context,
                    )
                except OSError as exc:
                    raise ListenError(bind_failure(name, parsed, exc)) from exc
            else:
                sock.setblocking(False)
                listener._server = await loop.create_server(
                    lambda: ConnectionGuard(listener),
                    sock=sock,
                    backlog=LISTEN_BACKLOG,
                    start_serving=serve,
                    ssl=ssl_context,
                )
        except BaseException:
            await runner.cleanup()
            raise
        bound = listener._server.sockets[0].getsockname()
        listener.host = bound[0] if sock is not None else ListenAddress.parse(address).host
        listener.port = bound[1]
        listener.tls = ssl_context is not None
        return listener

    @property
    def url(self) -> str:
        """``http://host:port`` of the listener (``https://`` when it serves TLS)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def statistics(self) -> ListenerStatistics:
        """The listener's connections and guard counters, as of now."""
        return ListenerStatistics(
            name=self.name,
            max_connections=self.limits.max_connections,
            open_connections=len(self.connections),
            writes_waiting=self.writes_waiting,
            accepted=self.accepted,
            refused=self.refused,
            header_timeouts=self.header_timeouts,
            write_stalls=self.write_stalls,
            evicted=self.evicted,
        )

    # -- used by the guards ------------------------------------------------------------------

    @property
    def refuses_connections(self) -> bool:
        """At the cap (or closing): a new connection is refused, unless :meth:`evict` makes
        room for it."""
        return self.closing or len(self.connections) >= self.limits.max_connections

    def evict(self) -> bool:
        """On an evicting listener that is not closing, close the oldest connection that
        runs no handler on a fully received request (:attr:`ConnectionGuard.evictable`);
        True when one was closed (its place is free at once). At most ``max_connections``
        guards are looked at, and only at the cap."""
        if not self.limits.evict_idle or self.closing:
            return False
        for handler, guard in self.connections.items():
            if guard.evictable:
                del self.connections[handler]
                self.evicted += 1
                self.warn(
                    "connection_evicted",
                    cap=self.limits.max_connections,
                    message=f"closed the oldest connection(s) waiting for a request (or idle) "
                    f"to let new ones in: {self.limits.max_connections} were open, the cap of "
                    "this listener",
                )
                guard.abort()
                return True
        return False

    def refuse(self, transport: asyncio.Transport) -> None:
        """Answer 503 and end the output: the client learns at once, and retries later.

        Only half-closed: the client's request is still arriving or unread, and closing a
        socket with input unread makes the kernel send a reset, which can reach the client
        before it reads the 503 (the openai SDK then reports a connection error). The guard
        discards the input and the transport closes at its end, or after ``REFUSAL_LINGER``.
        """
        self.refused += 1
        transport.write(self._refusal)
        if not transport.is_closing():
            transport.write_eof()
        if not self.closing:
            self.warn(
                "connection_limit",
                cap=self.limits.max_connections,
                message=f"refused new connection(s): {self.limits.max_connections} are open, "
                "the cap of this listener",
            )

    def check_fd(self, transport: asyncio.Transport) -> None:
        """Warn when the accepted socket's descriptor shows the process near its fd limit."""
        sock = transport.get_extra_info("socket")
        if sock is None or sock.fileno() < self._fd_warn_at:
            return
        self.warn(
            "fd_limit_near",
            fd=sock.fileno(),
            soft_limit=self._fd_soft,
            message="an accepted connection got a descriptor near the open-file limit; at "
            "the limit new connections are reset: raise LimitNOFILE or lower "
            "openai.max_connections",
        )
        # At the limit itself the event loop drops new connections without a word (uvloop
        # closes them in libuv): probe whether a descriptor is left, and say so if none is.
        try:
            os.close(os.dup(sock.fileno()))
        except OSError:
            self.warn(
                "fd_limit_reached",
                soft_limit=self._fd_soft,
                message="the process has no file descriptor left: new connections are reset "
                "until some close; raise LimitNOFILE or lower openai.max_connections",
            )

    def warn(self, event: str, **fields: Any) -> None:
        """A rate-limited warning about this listener (one line per event every 10 s;
        ``count`` says how many times it happened since the previous line)."""
        count = self._limiter.allow(event)
        if count:
            self.log.warning(event, listener=self.name, count=count, **fields)

    # -- stopping ----------------------------------------------------------------------------

    async def start_serving(self) -> None:
        """Start accepting (a listener bound with ``serve=False``)."""
        assert self._server is not None
        await self._server.start_serving()

    @property
    def fileno(self) -> int:
        """The listening socket's descriptor (to pass it to a successor process)."""
        assert self._server is not None
        return int(cast(Any, self._server).sockets[0].fileno())

    def stop_listening(self) -> None:
        """Close the listening socket only: kept-alive connections go on (a handover relays
        what they send, and closes each after its answer)."""
        if self._server is not None:
            self._server.close()

    def stop_accepting(self) -> None:
        """Close the listening socket and the idle kept-alive connections; a connection with
        a request in flight closes after its response."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        server = self.runner.server
        if server is not None:
            server.pre_shutdown()

    async def drain(self, until: float) -> bool:
        """Wait until every request in flight on this listener has finished and its
        connection closed, or the loop time ``until``; True when all finished."""
        server = self.runner.server
        if server is None:
            return True
        try:
            async with asyncio.timeout_at(until):
                await server.shutdown(None)
        except TimeoutError:
            return False
        return True

    def cut(self) -> int:
        """Abort every connection still open (their handlers are cancelled); the number."""
        guards = list(self.connections.values())
        for guard in guards:
            guard.abort()
        return len(guards)

    async def close(self) -> None:
        """Release the runner (the application's shutdown and cleanup hooks)."""
        self.stop_accepting()
        for guard in list(self.refusing):
            guard.abort()
        await self.runner.cleanup()


def _refusal_response(name: str, cap: int) -> bytes:
    body = envelope(
        f"This edge has {cap} connections open on its {name} listener, its limit; retry shortly.",
        "too_many_connections",
        status=503,
    )
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Retry-After: {_REFUSAL_RETRY_AFTER}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body

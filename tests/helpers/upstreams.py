"""Upstreams that misbehave, for the hostile-upstream and slow-reader tests (issue 10): one
that answers raw bytes no framework would send (:func:`raw_upstream`, or
:class:`ThreadedUpstream` to outlive one test's event loop), one whose stream never ends
(:class:`EndlessUpstream`, :meth:`ThreadedUpstream.endless`), one that never answers
(:func:`silent_upstream`), and a port where nothing listens (:func:`closed_port`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import orjson
from aiohttp import web

from iop_edge.testing.leaks import BOUND


@dataclass
class RawUpstream:
    """A loopback upstream that answers every request with the same raw bytes
    (see :func:`raw_upstream`); it counts requests and connections still open."""

    base_url: str
    requests: int = 0
    open_connections: int = 0


@contextlib.asynccontextmanager
async def raw_upstream(response: bytes) -> AsyncIterator[RawUpstream]:
    """An upstream that speaks just enough HTTP/1.1 to read requests (headers and a
    ``Content-Length`` body), and answers each with ``response`` verbatim — a status line no
    framework would send (``101``, ``999``), a redirect, an HTML error page — keeping the
    connection open until the client closes it."""
    writers: set[asyncio.StreamWriter] = set()
    upstream = RawUpstream("")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        upstream.open_connections += 1
        try:
            while True:  # keep-alive: the client may send the next request on this connection
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                upstream.requests += 1
                writer.write(response)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            upstream.open_connections -= 1
            writers.discard(writer)
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    upstream.base_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield upstream
    finally:
        server.close()
        for writer in list(writers):
            writer.close()
        await server.wait_closed()


class ThreadedUpstream:
    """A loopback HTTP/1.1 upstream served by threads rather than an event loop, so that one
    daemon (say, a module's) can use it across tests, each with its own loop.

    Built with :meth:`answering` (every request gets the same raw bytes, the connection kept
    until the client closes it) or :meth:`endless` (a 200 event stream of ``frame`` repeated
    until the client goes; :attr:`streams_open` counts streams being written, so a test sees
    the edge let go of its upstream). Use as a context manager.
    """

    def __init__(self, respond: Callable[[socket.socket], None]) -> None:
        self._respond = respond
        self._server = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.base_url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self.requests = 0
        self.streams_open = 0
        self.streams_ended = 0
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._acceptor = threading.Thread(target=self._accept, daemon=True)

    @classmethod
    def answering(cls, raw: bytes) -> ThreadedUpstream:
        """An upstream answering every request with ``raw``, verbatim."""

        def respond(conn: socket.socket) -> None:
            conn.sendall(raw)

        return cls(respond)

    @classmethod
    def endless(cls, frame: bytes) -> ThreadedUpstream:
        """An upstream whose every answer is an event stream of ``frame``, forever."""
        upstream: ThreadedUpstream

        def respond(conn: socket.socket) -> None:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
            with upstream._lock:
                upstream.streams_open += 1
            try:
                while True:
                    conn.sendall(frame)
            finally:
                with upstream._lock:
                    upstream.streams_open -= 1
                    upstream.streams_ended += 1

        upstream = cls(respond)
        return upstream

    def __enter__(self) -> ThreadedUpstream:
        self._acceptor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._acceptor.join(BOUND)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self._connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buffered = b""
        try:
            while True:  # keep-alive: the edge may send its next request on this connection
                while b"\r\n\r\n" not in buffered:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffered += chunk
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buffered) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffered += chunk
                buffered = buffered[length:]
                with self._lock:
                    self.requests += 1
                self._respond(conn)
        except OSError:
            pass
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()


FRAME_CONTENT = 64 * 1024


WRITE_HIGH_WATER = 64 * 1024  # aiohttp drains a transport above this


class EndlessUpstream:
    """An OpenAI-compatible upstream whose stream is ``frames`` chunks of 64 KiB of content;
    it counts what it wrote and exposes its transport, to see its writes block."""

    def __init__(self, frames: int) -> None:
        self.frames = frames
        self.written = 0
        self.transport: asyncio.Transport | None = None
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        self.url = ""

    async def __aenter__(self) -> EndlessUpstream:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self.transport = request.transport
        chunk = {"choices": [{"index": 0, "delta": {"content": "x" * FRAME_CONTENT}}]}
        frame = b"data: " + orjson.dumps(chunk) + b"\n\n"
        for _ in range(self.frames):
            await response.write(frame)
            self.written += len(frame)
        await response.write(b"data: [DONE]\n\n")
        return response

    def blocked(self) -> bool:
        """The upstream's own send buffer is over aiohttp's high-water mark: its
        ``write()`` is waiting for the edge to read (TCP flow control reached it)."""
        transport = self.transport
        return transport is not None and transport.get_write_buffer_size() >= WRITE_HIGH_WATER


@contextlib.contextmanager
def silent_upstream() -> Iterator[str]:
    """An upstream that never answers: a listening socket nobody accepts from. The kernel
    completes the edge's connections (the backlog holds 64) and buffers its requests; the
    edge then waits for an answer that never comes. Yields its base URL."""
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


def closed_port() -> int:
    """A loopback port where nothing listens (a connection is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])

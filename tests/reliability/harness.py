"""Machinery of the hostile-client and hostile-upstream tests (issue 10): raw upstreams,
slowloris clients, stalled readers, upstreams that never answer, config files saved the hostile
way, and ``iop-edge config validate`` as an operator runs it.

``iop-edge serve`` as a subprocess (:class:`EdgeProcess`) and what an operator reads back of
it (log events, ``/admin/status``, ``/metrics``), raw HTTP on a socket, and the provider that
goes down and comes back (:class:`FlappingUpstream`, issue 12) live in ``iop_edge.testing``
(``edge_process``, ``raw_http``, ``flapping``), which ``bench/soak.py`` runs at full size;
they are re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from iop_edge.testing.edge_process import (
    EdgeProcess,
    edge_at_rest,
    edge_metrics,
    edge_process,
    edge_status,
    log_events,
    status_leaks,
    wait_for_log,
)
from iop_edge.testing.flapping import FlappingUpstream, FlapState
from iop_edge.testing.leaks import BOUND
from iop_edge.testing.raw_http import (
    RawAnswer,
    raw_answer,
    raw_exchange,
    raw_request,
    read_answer,
    until_closed,
)

__all__ = [
    "EdgeProcess",
    "FlapState",
    "FlappingUpstream",
    "RawAnswer",
    "RawUpstream",
    "ThreadedUpstream",
    "Trickled",
    "closed_port",
    "config_validate",
    "edge_at_rest",
    "edge_metrics",
    "edge_process",
    "edge_status",
    "log_events",
    "raw_answer",
    "raw_exchange",
    "raw_request",
    "raw_upstream",
    "read_answer",
    "read_until_closed",
    "silent_upstream",
    "slowloris",
    "split_save",
    "stalled_reader",
    "status_leaks",
    "swap_in_fifo",
    "until_closed",
    "wait_for_log",
]

# --- hostile clients and upstreams (issue 10) ------------------------------------------------


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


@dataclass
class Trickled:
    """What a slowloris connection saw: seconds from the moment it started connecting until
    the edge closed it (so never less than the edge's timeout), how many bytes it trickled,
    and what the edge sent it after ``first``'s answer."""

    seconds: float
    sent: int
    received: bytes


async def slowloris(
    host: str, port: int, head: bytes, *, pace: float, first: bytes = b"", at_once: bytes = b""
) -> Trickled:
    """A slowloris client: on a new connection (after ``first``, a whole request whose answer
    is read, when given, and ``at_once``, bytes sent in one go: a complete head whose body is
    then trickled) send ``head`` — an incomplete request head, or part of a body — one byte
    every ``pace`` seconds, then padding, until the edge closes the connection.

    The pace is the attack's own rhythm, not a synchronisation: the test waits on the close
    (bounded by :data:`BOUND`, so an edge that never closes fails the test instead of hanging).
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    reader, writer = await asyncio.open_connection(host, port)
    sent = 0

    async def trickle() -> None:
        nonlocal sent
        data = head
        with contextlib.suppress(ConnectionError):
            while True:
                if sent >= len(data):
                    data += b"a" * 64  # a header value that never ends
                writer.write(data[sent : sent + 1])
                sent += 1
                await writer.drain()
                await asyncio.sleep(pace)

    try:
        if first:
            writer.write(first)
            await writer.drain()
            answer = await read_answer(reader)
            assert answer.status == 200, answer
        if at_once:
            writer.write(at_once)
            await writer.drain()
        trickling = asyncio.create_task(trickle())
        try:
            received = await until_closed(reader)
        finally:
            trickling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await trickling
        return Trickled(loop.time() - started, sent, received)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def stalled_reader(host: str, port: int, request: bytes) -> socket.socket:
    """A client that sends ``request`` and then never reads: a blocking socket with a small
    receive buffer (so the edge's writes have to wait soon). The caller closes it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(BOUND)
    sock.connect((host, port))
    sock.sendall(request)
    return sock


def read_until_closed(sock: socket.socket) -> tuple[bytes, str]:
    """Read a blocking socket until the peer closes it: the bytes, and ``"eof"`` or
    ``"reset"``; raises TimeoutError when it stays open past :data:`BOUND`."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received, "reset"
        if not chunk:
            return received, "eof"
        received += chunk


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


def split_save(path: Path, first: str, second: str, *, pause: float) -> None:
    """Save ``first + second`` in place the way a slow writer does: truncate, write and flush
    ``first``, wait ``pause`` seconds, write ``second``. The pause is the point of the attack
    (a watcher sees the file between the two writes), not a synchronisation."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(first)
        handle.flush()
        os.fsync(handle.fileno())
        time.sleep(pause)
        handle.write(second)


def swap_in_fifo(path: Path) -> None:
    """Replace the file at ``path`` by a FIFO (named pipe) with no writer, atomically."""
    tmp = path.with_name(f".{path.name}.fifo")
    os.mkfifo(tmp)
    os.replace(tmp, path)


async def config_validate(path: Path) -> tuple[int, str]:
    """``iop-edge config validate PATH`` as an operator runs it: its exit code and its output
    (stdout + stderr); a run that does not end within :data:`BOUND` is killed and fails."""
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("iop-edge")),
        "config",
        "validate",
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(BOUND):
            out, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"config validate {path} did not end within {BOUND} s") from None
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace")


def closed_port() -> int:
    """A loopback port where nothing listens (a connection is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])

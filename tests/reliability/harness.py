"""Machinery of the hostile-client and hostile-upstream tests (issue 10): ``iop-edge serve``
as a subprocess (:class:`EdgeProcess`), raw sockets and raw upstreams, slowloris clients, and
what an operator reads back (log events, ``/admin/status``, ``/metrics``).

The waiting and leak accounting, the watched edge, the steady load, the reload storm and the
config fuzzer live in ``iop_edge.testing`` (``leaks``, ``reload_storm``, ``config_fuzz``):
``bench/soak.py`` runs them at full size.

A provider that goes down and comes back (issue 12): :class:`FlappingUpstream`, a fake OpenAI
upstream stopped and started again on the same port, on demand or on a schedule;
``tests/reliability/test_flapping.py`` drives it step by step, ``bench/soak.py`` on a clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from iop_edge.testing.fake_behavior import DEFAULT_BEHAVIOR, FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.leaks import BOUND, children_of, wait_for

# --- hostile clients and upstreams (issue 10) ------------------------------------------------


@dataclass
class EdgeProcess:
    """``iop-edge serve`` running as a subprocess: every stderr line it wrote so far, and the
    addresses of its ``listening`` event (``openai``, ``console``, ``metrics``)."""

    process: subprocess.Popen[str]
    lines: list[str]
    addresses: dict[str, str]

    def host_port(self, listener: str) -> tuple[str, int]:
        """``(host, port)`` of one listener, for raw sockets."""
        rest = self.addresses[listener].split("://", 1)[1]
        host, _, port = rest.rpartition(":")
        return host.strip("[]"), int(port)


@contextlib.contextmanager
def edge_process(config: Path) -> Iterator[EdgeProcess]:
    """Run ``iop-edge serve --config config`` as an operator would; yield an
    :class:`EdgeProcess` once it logs ``listening``. On exit it gets SIGTERM and must exit 0
    within :data:`BOUND`; afterwards :attr:`EdgeProcess.lines` holds its whole log (stderr).
    The server runs in the process started (``--no-parent``): its children are its CLI runs,
    which the harness counts."""
    iop_edge = str(Path(sys.executable).with_name("iop-edge"))
    process = subprocess.Popen(
        [iop_edge, "serve", "--config", str(config), "--no-parent"],
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    lines: list[str] = []
    listening = threading.Event()
    addresses: dict[str, str] = {}

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if not listening.is_set() and '"listening"' in line:
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    addresses.update(
                        {k: v for k, v in event.items() if k in ("openai", "console", "metrics")}
                    )
                    listening.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        if not listening.wait(BOUND):
            raise AssertionError("the daemon did not start:\n" + "".join(lines))
        yield EdgeProcess(process, lines, addresses)
        process.send_signal(signal.SIGTERM)
        assert process.wait(BOUND) == 0, "".join(lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(BOUND)
        assert process.stderr is not None
        process.stderr.close()


async def raw_exchange(host: str, port: int, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` (whole, as bytes: a client no library would let us be) on a new
    connection and read the answer to the end; the status and the body."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(BOUND):
            raw = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split(b" ")
    return int(status_line[1]), body


def raw_request(
    method: str,
    path: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
    body: bytes = b"",
    *,
    host: bytes = b"127.0.0.1",
) -> bytes:
    """An HTTP/1.1 request built byte by byte (header values may hold any byte), with
    ``Connection: close`` and the body's ``Content-Length``."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + host]
    lines += [name + b": " + value for name, value in headers]
    if body or method == "POST":
        lines.append(b"Content-Length: %d" % len(body))
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


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
class RawAnswer:
    """One HTTP/1.1 answer read off a raw socket: status, headers (lower-case names), body."""

    status: int
    headers: dict[str, str]
    body: bytes


async def read_answer(reader: asyncio.StreamReader) -> RawAnswer:
    """Read one answer (head, then a ``Content-Length`` body, or the rest until EOF) from a
    connection on which the request was sent; bounded by :data:`BOUND`."""
    async with asyncio.timeout(BOUND):
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        else:
            body = await reader.read()
    return RawAnswer(int(status_line.split(" ")[1]), headers, body)


async def raw_answer(host: str, port: int, request: bytes) -> RawAnswer:
    """Send ``request`` on a new connection and read its answer with its headers (what
    :func:`raw_exchange` gives, and the headers: ``Retry-After``, ``Connection``, ...)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        return await read_answer(reader)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the peer sends until it closes the connection (EOF or reset); raises
    TimeoutError when it has not closed within :data:`BOUND`."""
    received = b""
    async with asyncio.timeout(BOUND):
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                received += chunk
    return received


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


def log_events(edge: EdgeProcess, event: str) -> list[dict[str, Any]]:
    """Every JSON line of the edge's log so far whose ``event`` is ``event``, parsed."""
    marker = f'"event":"{event}"'
    found: list[dict[str, Any]] = []
    for line in list(edge.lines):
        if marker in line:
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
    return found


async def wait_for_log(
    edge: EdgeProcess,
    event: str,
    predicate: Callable[[dict[str, Any]], bool] = lambda line: True,
    *,
    after: int = 0,
) -> dict[str, Any]:
    """The first line of ``event`` (from its ``after``-th on) for which ``predicate`` holds,
    once the edge has written it (bounded by :data:`BOUND`)."""

    def find() -> dict[str, Any] | None:
        return next((e for e in log_events(edge, event)[after:] if predicate(e)), None)

    try:
        await wait_for(lambda: find() is not None)
    except TimeoutError:
        raise AssertionError(f"no {event!r} log line came:\n" + "".join(edge.lines[-20:])) from None
    line = find()
    assert line is not None
    return line


async def edge_status(edge: EdgeProcess) -> dict[str, Any]:
    """``GET /admin/status`` of the edge's console (loopback, no admin token)."""
    answer = await raw_answer(
        *edge.host_port("console"),
        b"GET /admin/status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    assert answer.status == 200, answer
    status: dict[str, Any] = json.loads(answer.body)
    return status


async def edge_metrics(edge: EdgeProcess) -> dict[str, float]:
    """``GET /metrics`` of the edge: every sample, keyed by its name and labels as exposed
    (``iop_edge_listener_connections{listener="openai"}``)."""
    answer = await raw_answer(
        *edge.host_port("metrics"),
        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    assert answer.status == 200, answer
    samples: dict[str, float] = {}
    for line in answer.body.decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def status_leaks(status: dict[str, Any]) -> dict[str, int]:
    """What ``/admin/status`` shows still held: slots in flight, the queue, admissions (and
    leases inherited by a handover) not released, double releases. Empty when the edge is at
    rest."""
    counters = status["counters"]
    held = {
        "in_flight": sum(p["in_flight"] for p in status["providers"]),
        "queue_depth": status["queue"]["depth"],
        "unreleased": counters["admitted"] + counters["inherited"] - counters["released"],
        "double_releases": counters["double_releases"],
    }
    return {name: value for name, value in held.items() if value}


async def edge_at_rest(edge: EdgeProcess) -> dict[str, Any]:
    """Wait until the edge holds nothing (:func:`status_leaks` empty, no child process left:
    every CLI run reaped), then return its status; a leak fails after :data:`BOUND`."""
    pid = edge.process.pid
    status = await edge_status(edge)
    loop = asyncio.get_running_loop()
    give_up = loop.time() + BOUND
    while (status_leaks(status) or children_of(pid)) and loop.time() < give_up:
        await asyncio.sleep(0.01)
        status = await edge_status(edge)
    assert (status_leaks(status), children_of(pid)) == ({}, {}), status
    return status


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


# --- a provider that goes down and comes back (issue 12) ---------------------------------------

FlapState = Literal["down", "up"]
"""What :class:`FlappingUpstream` just did: stopped its fake, or started a new one."""


class FlappingUpstream:
    """A fake OpenAI upstream on a fixed loopback port that goes down and comes back: a box
    that dies (every connection dropped, then nothing listens: connections are refused) and
    is started again at the same address, so the edge's config never changes.

    :meth:`up` starts a new :class:`FakeOpenAI` on the port (the first one picks a free port,
    kept from then on) and returns it: its counters are the requests of this up phase only.
    :meth:`down` stops it. :meth:`flap` runs a down/up schedule. Use as an async context
    manager: it starts up, and is stopped on exit.
    """

    def __init__(self, behavior: FakeBehavior = DEFAULT_BEHAVIOR) -> None:
        self.behavior = behavior
        self.port = 0
        self.fake: FakeOpenAI | None = None
        """The fake of the current up phase; ``None`` while down."""
        self.downs = 0
        self.ups = 0

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, the same whether it is up or down (after the first
        :meth:`up`)."""
        if not self.port:
            raise RuntimeError("the flapping upstream was never started: it has no port yet")
        return f"http://127.0.0.1:{self.port}/v1"

    async def up(self) -> FakeOpenAI:
        """Start a new fake on the port and return it (already listening)."""
        if self.fake is not None:
            raise RuntimeError(f"the flapping upstream on port {self.port} is already up")
        fake = FakeOpenAI(behavior=self.behavior, port=self.port)
        await fake.start()
        self.port = fake.port
        self.fake = fake
        self.ups += 1
        return fake

    async def down(self) -> FakeOpenAI:
        """Stop the fake (requests it holds are cut, connections closed); return it, stopped,
        for its counters. The port refuses connections until :meth:`up`."""
        fake, self.fake = self.fake, None
        if fake is None:
            raise RuntimeError(f"the flapping upstream on port {self.port} is already down")
        await fake.close()
        self.downs += 1
        return fake

    async def flap(
        self,
        down_s: float,
        up_s: float,
        cycles: int,
        on_change: Callable[[FlapState, int, FakeOpenAI], None] | None = None,
    ) -> None:
        """``cycles`` times: down for ``down_s`` seconds, then up for ``up_s``; after each
        change ``on_change(state, cycle, fake)`` is told (the fake just stopped, or just
        started). Each phase lasts its length from the moment it began (the stop or start
        included), so the schedule does not drift. The durations are the schedule itself (a
        soak's rhythm), never a synchronisation: a test calls :meth:`down` and :meth:`up`."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        phases: tuple[tuple[FlapState, float], ...] = (("down", down_s), ("up", up_s))
        for cycle in range(cycles):
            for state, seconds in phases:
                fake = await (self.down() if state == "down" else self.up())
                if on_change is not None:
                    on_change(state, cycle, fake)
                began += seconds
                await asyncio.sleep(max(began - loop.time(), 0))

    async def __aenter__(self) -> FlappingUpstream:
        await self.up()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.fake is not None:
            await self.down()

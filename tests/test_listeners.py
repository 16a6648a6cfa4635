"""The listeners against stalled, slow and hostile clients (issue 10, items 3 and 4).

Real sockets on 127.0.0.1 and a real daemon in this process; the listeners' own timers (request
head, write stall) run on the daemon's :class:`~iop_edge.testing.clock.FakeClock`, so a test
fires them by moving time by hand and asserts the exact deadline. aiohttp's keep-alive timer
runs on the loop's clock: that one test uses a short timeout and waits for the close itself.
The fd-limit tests run ``iop-edge serve`` as a subprocess under a lowered ``RLIMIT_NOFILE``.

Every wait is bounded (:data:`~iop_edge.testing.leaks.BOUND`) so that a regression fails
instead of hanging; no test sleeps for a duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web

from iop_edge.config import parse_config
from iop_edge.daemon import Daemon
from iop_edge.errors import ListenError
from iop_edge.runtime.listeners import REFUSAL_LINGER, ConnectionLimits, Listener
from iop_edge.runtime.logs import get_logger
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import BOUND, FAKE_CLI, process_gone, wait_for
from tests.helpers.reliability import raw_exchange, raw_request
from tests.helpers.upstreams import FRAME_CONTENT, EndlessUpstream

pytestmark = pytest.mark.usefixtures("log_stream")  # the edge's log, off the terminal

START = 100.0
"""Where the fake clock starts: the listeners' deadlines are exact sums from here."""

HEADER_TIMEOUT = 2.0
WRITE_TIMEOUT = 5.0
TINY_WINDOW = 4096
"""The receive buffer of a client that stops reading: the edge's send path fills sooner."""


# --- the edge under test -----------------------------------------------------------------


def edge_doc(upstream_url: str = "http://127.0.0.1:9/v1", **openai_fields: Any) -> dict[str, Any]:
    """An open loopback edge with the listener timeouts above (``openai_fields`` override) and
    one slot per provider: ``big`` (OpenAI-compatible at ``upstream_url``), ``agent`` (the
    fake CLI agent, text output) and ``echo`` (``cat``)."""

    def provider(pid: str, kind: str, adapter: str, model: str, **fields: Any) -> dict[str, Any]:
        category = "cli" if kind == "cli" else "api"
        return {"id": pid, "type": kind, "category": category, "adapter": adapter,
                "models": [model], "capacity": 1, **fields}  # fmt: skip

    return {
        "openai": {
            "listen": "127.0.0.1:0",
            "header_timeout_ms": int(HEADER_TIMEOUT * 1000),
            "write_timeout_ms": int(WRITE_TIMEOUT * 1000),
            **openai_fields,
        },
        "metrics": {"enabled": False},
        "console": {"enabled": False},
        "models": [
            {"id": model, "context_window_tokens": 4096, "providers": [model]}
            for model in ("big", "agent", "echo")
        ],
        "nodes": [
            {
                "id": "n1",
                "adapters": [
                    {"name": "up", "type": "openai_compat", "base_url": upstream_url},
                    {"name": "shell", "type": "cli", "command": "cat"},
                ],
                "providers": [
                    # (no health check: no idle probe arms a timer on the clock these tests
                    # read; the listeners' timers are the only ones)
                    provider("big", "openai_compat", "up", "fake-model", health_check=False),
                    provider(
                        "agent",
                        "cli",
                        "shell",
                        "agent",
                        command=FAKE_CLI[0],
                        args=FAKE_CLI[1:],
                        output_format="text",
                    ),
                    provider("echo", "cli", "shell", "echo"),
                ],
            }
        ],
    }


@contextlib.asynccontextmanager
async def running(doc: dict[str, Any], clock: FakeClock) -> AsyncIterator[Daemon]:
    """A daemon on ``doc`` driven by ``clock``, stopped afterwards."""
    daemon = Daemon(parse_config(doc), clock=clock)
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop()


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    """The shipped fake OpenAI-compatible upstream on 127.0.0.1."""
    async with FakeOpenAI() as fake:
        yield fake


def logged(stream: io.StringIO, event: str) -> list[dict[str, Any]]:
    """The log lines of ``event`` written so far (lines are flushed once per loop turn)."""
    lines = (json.loads(line) for line in stream.getvalue().splitlines() if line.strip())
    return [line for line in lines if line.get("event") == event]


# --- raw clients -------------------------------------------------------------------------


async def read_to_end(reader: asyncio.StreamReader) -> bytes:
    """Everything until the server closes (a reset ends it as well as an EOF)."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        async with asyncio.timeout(BOUND):
            while chunk := await reader.read(65536):
                data += chunk
    return data


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One ``Content-Length`` response on a kept-alive connection: status, headers, body."""
    async with asyncio.timeout(BOUND):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:] if line)
        body = await reader.readexactly(int(headers["Content-Length"]))
    return int(lines[0].split()[1]), headers, body


def keep_alive_get(path: str) -> bytes:
    """A GET that asks for nothing (HTTP/1.1: the connection stays open after the answer)."""
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


@contextlib.asynccontextmanager
async def raw_connection_to(
    host: str, port: int
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A TCP connection, closed afterwards."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def raw_connection(
    listener: Listener,
) -> contextlib.AbstractAsyncContextManager[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A TCP connection to ``listener``, closed afterwards."""
    return raw_connection_to(listener.host, listener.port)


@contextlib.asynccontextmanager
async def stalled_stream(
    listener: Listener, model: str, prompt: str
) -> AsyncIterator[socket.socket]:
    """A client with a small receive window that asks ``model`` for a stream, reads the
    response head — and then stops reading (it reads again only when the test says so)."""
    loop = asyncio.get_running_loop()
    body = orjson.dumps(
        {"model": model, "stream": True, "messages": [{"role": "user", "content": prompt}]}
    )
    request = raw_request(
        "POST", "/v1/chat/completions", [(b"Content-Type", b"application/json")], body
    )
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, TINY_WINDOW)
        sock.setblocking(False)
        async with asyncio.timeout(BOUND):
            await loop.sock_connect(sock, (listener.host, listener.port))
            await loop.sock_sendall(sock, request)
            head = b""
            while not head.endswith(b"\r\n\r\n"):  # one byte at a time: not one more
                byte = await loop.sock_recv(sock, 1)
                assert byte, f"the edge closed before answering: {head!r}"
                head += byte
        assert head.startswith(b"HTTP/1.1 200 "), head
        yield sock


async def receive(sock: socket.socket, count: int | None = None) -> bytes:
    """Read ``count`` bytes (None: until the edge closes; a reset ends it as well)."""
    loop = asyncio.get_running_loop()
    data = bytearray()
    with contextlib.suppress(ConnectionResetError):
        async with asyncio.timeout(BOUND):
            while count is None or len(data) < count:
                want = 1 << 20 if count is None else min(1 << 20, count - len(data))
                chunk = await loop.sock_recv(sock, want)
                if not chunk:
                    break
                data += chunk
    return bytes(data)


def dechunk(data: bytes) -> bytes:
    """The body of a ``Transfer-Encoding: chunked`` message (up to its last chunk)."""
    body = bytearray()
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return bytes(body)
        body += data[:size]
        data = data[size + 2 :]


def process_ended(pid: int) -> bool:
    """Whether ``pid`` runs no more: gone, or a zombie. (An orphan killed with its group is
    reparented to the container's init, whose reaping can take seconds: the zombie counts.)"""
    if process_gone(pid):
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


class CountingUpstream(EndlessUpstream):
    """The endless OpenAI-compatible stream, counting handlers cancelled (the edge closed the
    upstream connection mid-stream) and completed."""

    def __init__(self, frames: int) -> None:
        super().__init__(frames)
        self.cancelled = 0
        self.completed = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            response = await super().chat(request)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.completed += 1
        return response


# --- item 4: the request-head timeout (slowloris) ----------------------------------------


async def test_connections_without_a_complete_head_are_closed_at_header_timeout(log_stream):
    """``openai.header_timeout_ms``: a connection that sent nothing, one that sent half a
    request line and one that stopped before the blank line are all closed exactly
    ``header_timeout`` after they connected — not a millisecond before — with no answer; one
    rate-limited ``header_timeout`` warning names the listener; a new request is served."""
    clock = FakeClock(START)
    async with running(edge_doc(), clock) as daemon:
        listener = daemon.listeners["openai"]
        async with (
            raw_connection(listener) as (silent, _),
            raw_connection(listener) as (half_line, half_line_w),
            raw_connection(listener) as (no_blank_line, no_blank_line_w),
        ):
            half_line_w.write(b"GET /healthz HTT")
            no_blank_line_w.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            await wait_for(lambda: listener.statistics().open_connections == 3)
            clock.advance_to(START + HEADER_TIMEOUT - 0.001)
            assert listener.statistics().header_timeouts == 0
            assert listener.statistics().open_connections == 3
            clock.advance_to(START + HEADER_TIMEOUT)
            answers = [await read_to_end(r) for r in (silent, half_line, no_blank_line)]
            await wait_for(lambda: listener.statistics().open_connections == 0)
            stats = listener.statistics()
        assert answers == [b"", b"", b""]  # closed without a response
        assert (stats.header_timeouts, stats.open_connections) == (3, 0)
        await wait_for(lambda: bool(logged(log_stream, "header_timeout")))
        status, _ = await raw_exchange(listener.host, listener.port, raw_request("GET", "/healthz"))
        assert status == 200
    [warning] = logged(log_stream, "header_timeout")  # one line for the three
    assert (warning["level"], warning["listener"], warning["count"]) == ("warning", "openai", 1)
    assert "2 s" in warning["message"]


async def test_a_body_that_stops_arriving_is_cut_at_header_timeout(log_stream):
    """A complete head whose body never finishes (10 of the 100 bytes its Content-Length
    promises) gets ``header_timeout`` after the handler starts waiting for it, then the
    connection is aborted with a ``body_timeout`` warning — it held a connection forever before.
    A body that comes whole with its head arms no timer."""
    clock = FakeClock(START)
    async with running(edge_doc(), clock) as daemon:
        listener = daemon.listeners["openai"]
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        async with raw_connection(listener) as (reader, writer):
            await wait_for(lambda: clock.armed == [START + HEADER_TIMEOUT])  # the head's
            clock.advance_to(START + 1)
            writer.write(head + b'{"model": ')
            body_deadline = START + 1 + HEADER_TIMEOUT
            await wait_for(lambda: clock.armed == [body_deadline])  # the head's went
            clock.advance_to(body_deadline - 0.001)
            assert listener.statistics().open_connections == 1
            clock.advance_to(body_deadline)
            assert await read_to_end(reader) == b""
            await wait_for(lambda: listener.statistics().open_connections == 0)
        assert listener.statistics().header_timeouts == 1
        await wait_for(lambda: bool(logged(log_stream, "body_timeout")))
        status, _ = await raw_exchange(
            listener.host,
            listener.port,
            raw_request(
                "POST",
                "/v1/chat/completions",
                [(b"Content-Type", b"application/json")],
                b"{}",
            ),
        )
        assert status in (400, 404)  # answered, and no timer left behind
        assert clock.armed == []
    [warning] = logged(log_stream, "body_timeout")
    assert (warning["level"], warning["listener"]) == ("warning", "openai")
    cut = logged(log_stream, "request")[0]
    assert (cut["status"], cut["code"]) == (408, "body_timeout")
    assert cut["error"].startswith("the client did not send the rest of its request body")


async def test_a_head_completed_in_time_disarms_the_head_timer_for_good():
    """A client that completes its head just before ``header_timeout`` is answered, and its
    kept-alive connection is not closed by the head timer however long it then stays (an
    hour of fake time); a second request on it is served."""
    clock = FakeClock(START)
    async with running(edge_doc(), clock) as daemon:
        listener = daemon.listeners["openai"]
        async with raw_connection(listener) as (reader, writer):
            writer.write(b"GET /healthz HTTP/1.1\r\n")
            await wait_for(lambda: listener.statistics().open_connections == 1)
            clock.advance_to(START + HEADER_TIMEOUT - 0.001)
            writer.write(b"Host: 127.0.0.1\r\n\r\n")
            assert (await read_response(reader))[0] == 200
            clock.advance(3600)
            stats = listener.statistics()
            assert (stats.header_timeouts, stats.open_connections) == (0, 1)
            writer.write(keep_alive_get("/healthz"))
            assert (await read_response(reader))[0] == 200
        assert listener.statistics().header_timeouts == 0


# --- item 4: keep-alive ------------------------------------------------------------------


async def test_an_idle_kept_alive_connection_is_closed_after_keepalive_timeout():
    """``openai.keepalive_timeout_ms`` (aiohttp's timer, on the loop's clock: 200 ms here):
    after its answer, a kept-alive connection that then sends only part of its next head is
    closed by the edge — in well under the bound, not after the hour aiohttp defaults to."""
    clock = FakeClock(START)
    async with running(edge_doc(keepalive_timeout_ms=200), clock) as daemon:
        listener = daemon.listeners["openai"]
        async with raw_connection(listener) as (reader, writer):
            writer.write(keep_alive_get("/healthz"))
            status, headers, _ = await read_response(reader)
            assert (status, headers.get("Connection", "keep-alive")) == (200, "keep-alive")
            writer.write(b"GET /healthz HTTP/1.1\r\n")  # a next head that never completes
            assert await read_to_end(reader) == b""  # bounded: the close comes, or this fails
        await wait_for(lambda: listener.statistics().open_connections == 0)
        assert listener.statistics().header_timeouts == 0  # the keep-alive timer closed it


# --- item 4: the connection cap ----------------------------------------------------------


async def test_over_the_connection_cap_a_client_gets_503_retry_after_and_the_edge_carries_on(
    log_stream,
):
    """``openai.max_connections`` = 2, both held open: the SDK's next request gets 503
    ``too_many_connections`` with ``Retry-After: 1`` (not a connection error); a raw client
    gets the same answer in the OpenAI envelope and the connection is closed. Ten refusals in
    10 s log one ``connection_limit`` warning naming the listener and the cap; the next line
    counts the ones held back. Once a held connection closes, a new client is served."""
    clock = FakeClock(START)
    doc = edge_doc(max_connections=2, header_timeout_ms=3_600_000)
    async with running(doc, clock) as daemon:
        listener = daemon.listeners["openai"]
        async with (
            raw_connection(listener),
            raw_connection(listener) as (_, second),
            openai.AsyncOpenAI(base_url=daemon.openai_url, api_key="x", max_retries=0) as sdk,
        ):
            await wait_for(lambda: listener.statistics().open_connections == 2)
            with pytest.raises(openai.InternalServerError) as refused:
                await sdk.chat.completions.create(
                    model="echo", messages=[{"role": "user", "content": "hi"}]
                )
            assert (refused.value.status_code, refused.value.code) == (503, "too_many_connections")
            assert refused.value.response.headers["Retry-After"] == "1"

            async with raw_connection(listener) as (reader, writer):
                writer.write(raw_request("GET", "/healthz"))
                answer = await read_to_end(reader)  # the edge ends it after the answer
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.split(b"\r\n")[0] == b"HTTP/1.1 503 Service Unavailable"
            assert b"Retry-After: 1" in head.split(b"\r\n")
            error = orjson.loads(body)["error"]
            assert (set(error), error["code"]) == (
                {"message", "type", "param", "code"},
                "too_many_connections",
            )
            assert "2 connections" in error["message"]

            for _ in range(8):  # ten refusals in all, within one interval of the rate limit
                status, _ = await raw_exchange(
                    listener.host, listener.port, raw_request("GET", "/healthz")
                )
                assert status == 503
            await wait_for(lambda: listener.statistics().refused == 10)
            assert len(logged(log_stream, "connection_limit")) == 1
            clock.advance(10)
            assert (
                await raw_exchange(listener.host, listener.port, raw_request("GET", "/healthz"))
            )[0] == 503
            await wait_for(lambda: len(logged(log_stream, "connection_limit")) == 2)

            second.close()
            await wait_for(lambda: listener.statistics().open_connections == 1)
            models = await sdk.models.list()
            assert "echo" in {model.id for model in models.data}
        stats = listener.statistics()
    assert (stats.accepted, stats.refused) == (3, 11)
    first, later = logged(log_stream, "connection_limit")
    assert (first["level"], first["listener"], first["cap"], first["count"]) == (
        "warning",
        "openai",
        2,
        1,
    )
    assert (later["listener"], later["count"]) == ("openai", 10)  # 9 held back, and this one


def reset_by_peer(sock: socket.socket) -> bool:
    """Whether sending on ``sock`` now fails: the edge's end of it is gone."""
    try:
        sock.send(b"x")
    except (BrokenPipeError, ConnectionResetError):
        return True
    return False


async def test_a_refused_client_that_never_closes_is_cut_after_the_linger():
    """A refused connection is only half-closed so that its client can read the 503 (its
    input is read and discarded meanwhile), but a client that never closes it is cut
    ``REFUSAL_LINGER`` seconds later (on the listener's clock): it cannot hold a descriptor."""
    clock = FakeClock(START)
    doc = edge_doc(max_connections=1, header_timeout_ms=3_600_000)
    async with running(doc, clock) as daemon:
        listener = daemon.listeners["openai"]
        loop = asyncio.get_running_loop()
        async with raw_connection(listener):
            await wait_for(lambda: listener.statistics().open_connections == 1)
            with socket.socket() as sock:
                sock.setblocking(False)
                await loop.sock_connect(sock, (listener.host, listener.port))
                await wait_for(lambda: listener.statistics().refused == 1)
                assert (await receive(sock)).startswith(b"HTTP/1.1 503 ")  # then its end
                await loop.sock_sendall(sock, b"GET /healthz HTTP/1.1\r\n")  # discarded
                assert not reset_by_peer(sock)
                clock.advance(REFUSAL_LINGER)
                await wait_for(lambda: reset_by_peer(sock))
        await wait_for(lambda: listener.statistics().open_connections == 0)


# --- item 3: a streaming client that stops reading -----------------------------------------


@pytest.mark.parametrize("provider", ["openai_compat", "cli"])
async def test_a_stalled_streaming_reader_is_cut_at_write_timeout_and_frees_its_slot(
    log_stream, tmp_path, provider
):
    """A streaming client stops reading: once the edge's send path is full (the listener
    counts one write waiting), ``openai.write_timeout_ms`` later — exactly, not before — the
    relay is cancelled: the upstream call is aborted (the OpenAI-compatible upstream sees its
    handler cancelled; the CLI agent's whole process group is killed), the slot is released
    once, the request logs 499 ``client_stalled`` with the stall in its duration, and the
    client's connection is closed without the end of the stream."""
    clock = FakeClock(START)
    pid_file = tmp_path / "child.pid"
    upstream = CountingUpstream(frames=16384)  # 1 GiB: it never ends by itself
    async with upstream, running(edge_doc(upstream.url), clock) as daemon:
        listener = daemon.listeners["openai"]
        if provider == "cli":  # 8 MB of output (under the 8 MiB cap), and a child to find
            model = "agent"
            prompt = f"[[fake-cli: --flood 8000000 --spawn-child --pid-file {pid_file}]]"
        else:
            model, prompt = "big", "hello"
        async with stalled_stream(listener, model, prompt) as sock:
            await wait_for(lambda: listener.statistics().writes_waiting == 1)
            assert START + WRITE_TIMEOUT in clock.armed
            clock.advance_to(START + WRITE_TIMEOUT - 0.001)
            assert listener.statistics().write_stalls == 0
            assert daemon.scheduler.statistics().in_flight == 1
            clock.advance_to(START + WRITE_TIMEOUT)
            assert listener.statistics().write_stalls == 1
            await wait_for(lambda: daemon.scheduler.statistics().in_flight == 0)
            if provider == "cli":
                child = int(pid_file.read_text())
                await wait_for(lambda: process_ended(child))
            else:
                await wait_for(lambda: upstream.cancelled == 1)
                assert upstream.completed == 0
            received = await receive(sock)  # what the kernel had queued, then the end
            await wait_for(lambda: listener.statistics().open_connections == 0)
        pool = daemon.scheduler.statistics()
        stats = listener.statistics()
        await wait_for(lambda: bool(logged(log_stream, "request")))
    assert b"data: [DONE]" not in received
    assert (pool.in_flight, pool.admitted, pool.released, pool.double_releases) == (0, 1, 1, 0)
    assert (stats.writes_waiting, stats.write_stalls, stats.open_connections) == (0, 1, 0)
    [line] = logged(log_stream, "request")
    assert (line["model"], line["status"], line["code"]) == (model, 499, "client_stalled")
    assert line["duration_ms"] == WRITE_TIMEOUT * 1000  # admitted at START, cut at the deadline
    assert "write_timeout_ms" in line["error"]


async def test_a_slow_reader_that_keeps_reading_is_never_cut(log_stream):
    """The write timer measures a stall, not the whole answer: a client stops reading until
    its stall is a millisecond short of ``write_timeout``, reads a little (the timer is
    disarmed, and re-armed from now when the send path fills again), stops again for as long —
    twice the timeout in all — and then reads the rest: it gets all 8 MiB and ``[DONE]``, and
    the request logs 200."""
    frames = 128
    clock = FakeClock(START)
    upstream = CountingUpstream(frames=frames)
    async with upstream, running(edge_doc(upstream.url), clock) as daemon:
        listener = daemon.listeners["openai"]
        async with stalled_stream(listener, "big", "hello") as sock:
            await wait_for(lambda: listener.statistics().writes_waiting == 1)
            first_deadline = START + WRITE_TIMEOUT
            assert first_deadline in clock.armed
            clock.advance_to(first_deadline - 0.001)
            head = await receive(sock, 1 << 20)  # far more than the edge held back
            second_deadline = clock.now() + WRITE_TIMEOUT
            await wait_for(
                lambda: second_deadline in clock.armed and first_deadline not in clock.armed
            )
            clock.advance_to(second_deadline - 0.001)
            rest = await receive(sock)
        stats = listener.statistics()
        await wait_for(lambda: bool(logged(log_stream, "request")))
    assert (stats.write_stalls, stats.writes_waiting) == (0, 0)
    assert (upstream.completed, upstream.cancelled) == (1, 0)
    events = [e for e in dechunk(head + rest).split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    content = sum(len(json.loads(e[6:])["choices"][0]["delta"]["content"]) for e in events[:-1])
    assert content == frames * FRAME_CONTENT
    [line] = logged(log_stream, "request")
    assert (line["status"], line["code"]) == (200, "ok")


async def test_a_whole_answer_the_client_does_not_read_is_aborted_at_write_timeout(
    fake_openai, log_stream
):
    """A non-streaming answer (16 MiB) to a client that stops reading: the answer was already
    complete (the request logged 200 and the slot is free), the connection is aborted at
    ``write_timeout`` and a rate-limited ``client_stalled`` warning names the listener."""
    fake_openai.behavior = FakeBehavior(reply="x" * (16 << 20), chunks=1)
    clock = FakeClock(START)
    async with running(edge_doc(fake_openai.base_url), clock) as daemon:
        listener = daemon.listeners["openai"]
        loop = asyncio.get_running_loop()
        body = orjson.dumps({"model": "big", "messages": [{"role": "user", "content": "hi"}]})
        request = raw_request(
            "POST", "/v1/chat/completions", [(b"Content-Type", b"application/json")], body
        )
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, TINY_WINDOW)
            sock.setblocking(False)
            await loop.sock_connect(sock, (listener.host, listener.port))
            await loop.sock_sendall(sock, request)
            await wait_for(lambda: listener.statistics().writes_waiting == 1)
            stall_start = clock.now()
            clock.advance_to(stall_start + WRITE_TIMEOUT)
            received = await receive(sock)
        await wait_for(lambda: listener.statistics().open_connections == 0)
        await wait_for(lambda: bool(logged(log_stream, "client_stalled")))
        stats = listener.statistics()
        pool = daemon.scheduler.statistics()
    assert len(received) < 16 << 20  # the end of the answer never came
    assert (stats.write_stalls, stats.writes_waiting) == (1, 0)
    assert (pool.in_flight, pool.released, pool.double_releases) == (0, 1, 0)
    [warning] = logged(log_stream, "client_stalled")
    assert (warning["listener"], warning["count"]) == ("openai", 1)
    [line] = logged(log_stream, "request")
    assert line["status"] == 200


# --- item 4: file descriptors ------------------------------------------------------------

LIMITED_EXEC = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2]))); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)
"""Runs a command with ``RLIMIT_NOFILE`` lowered to ``(soft, hard)`` (not a preexec_fn: the
test process has threads)."""


async def healthz(host: str, port: int) -> int | None:
    """The status of ``GET /healthz`` on a new connection; None when it was closed unanswered."""
    with contextlib.suppress(ConnectionError):
        async with raw_connection_to(host, port) as (reader, writer):
            writer.write(raw_request("GET", "/healthz"))
            answer = await read_to_end(reader)
            if answer.startswith(b"HTTP/1.1 "):
                return int(answer.split()[1])
    return None


async def serve_out_of_descriptors(
    config: Path, until: str = "fd_limit_near"
) -> list[dict[str, Any]]:
    """Run ``iop-edge serve`` (uvloop, as operators do) with a soft/hard open-file limit of
    64/96, open 100 idle connections to it — more than its descriptors — then close them and
    check that it answers again; SIGTERM it (exit 0). The connections stay open until the log
    has ``until``. Its whole log, parsed."""
    config.write_text(json.dumps(edge_doc()))
    iop_edge = str(Path(sys.executable).with_name("iop-edge"))
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", LIMITED_EXEC, "64", "96"),
        *(iop_edge, "serve", "--config", str(config)),
        stderr=asyncio.subprocess.PIPE,
    )
    lines: list[dict[str, Any]] = []

    async def collect() -> None:
        assert process.stderr is not None
        async for raw in process.stderr:
            with contextlib.suppress(ValueError):
                lines.append(json.loads(raw))

    def seen(event: str) -> list[dict[str, Any]]:
        return [line for line in lines if line.get("event") == event]

    collector = asyncio.create_task(collect())
    writers: list[asyncio.StreamWriter] = []
    try:
        await wait_for(lambda: bool(seen("listening")) or collector.done())
        assert seen("listening"), lines
        host, _, port = seen("listening")[0]["openai"].removeprefix("http://").rpartition(":")
        for _ in range(100):  # within the listen backlog: every connect succeeds
            writers.append((await asyncio.open_connection(host, int(port)))[1])
        await wait_for(lambda: bool(seen(until)))
        for writer in writers:
            writer.close()
        # Until it has seen those close, it is still out of descriptors: a new connection is
        # reset, as a client would see it, and the client tries again.
        async with asyncio.timeout(BOUND):
            while await healthz(host, int(port)) != 200:
                pass
    finally:
        for writer in writers:
            writer.close()
        if process.returncode is None:
            process.terminate()
        async with asyncio.timeout(BOUND):
            code = await process.wait()
            await collector
    assert code == 0, lines
    return lines


async def test_serve_raises_the_soft_fd_limit_and_warns_when_low_and_near_it(tmp_path):
    """``iop-edge serve`` under an open-file limit of 64 (soft) / 96 (hard): it raises the soft
    limit to the hard one and logs ``fd_limit`` (64 → 96), and warns ``fd_limit_low`` since 96
    is below twice the connection caps (``max_connections`` 4096 by default). Clients then
    hold more connections than it has descriptors: the first accepted socket numbered at 90 %
    of the limit logs ``fd_limit_near`` (once: rate-limited), and once they close it serves."""
    lines = await serve_out_of_descriptors(tmp_path / "edge.yaml")
    by_event: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_event.setdefault(line.get("event", ""), []).append(line)
    [limit] = by_event["fd_limit"]
    assert (limit["soft_before"], limit["soft"], limit["hard"]) == (64, 96, 96)
    [low] = by_event["fd_limit_low"]
    assert (low["level"], low["soft"], low["max_connections"]) == ("warning", 96, 4096)
    [near] = by_event["fd_limit_near"]
    assert (near["level"], near["listener"], near["soft_limit"]) == ("warning", "openai", 96)
    assert near["fd"] >= 86  # 90 % of 96


async def test_serve_logs_when_it_runs_out_of_descriptors(tmp_path):
    """Issue 10 item 4: running out of descriptors (new connections reset) is logged — also
    under uvloop, whose libuv closes the connections it cannot accept without a word: the
    listener probes for a free descriptor once one near the limit was accepted."""
    lines = await serve_out_of_descriptors(tmp_path / "edge.yaml", until="fd_limit_reached")
    [reached] = [line for line in lines if line.get("event") == "fd_limit_reached"]
    assert (reached["level"], reached["listener"]) == ("warning", "openai")


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("192.0.2.1:0", "the host is not an address of this machine"),
        ("no-such-host.invalid:0", "the host 'no-such-host.invalid' does not resolve"),
    ],
)
async def test_a_listener_that_cannot_bind_says_which_address_and_why(address, reason):
    """Besides a port in use (tests/test_daemon.py, through ``iop-edge serve``): an address
    of another machine (TEST-NET-1, never contacted: bind only) or a host that does not
    resolve. Nothing is left bound."""
    limits = ConnectionLimits(
        keepalive_timeout=5, header_timeout=5, write_timeout=5, max_connections=4
    )
    with pytest.raises(ListenError) as caught:
        await Listener.bind(
            "metrics", web.Application(), address, limits, clock=FakeClock(), log=get_logger()
        )
    message = str(caught.value)
    assert message.startswith(f"the metrics listener cannot listen on {address} (metrics.listen): ")
    assert reason in message

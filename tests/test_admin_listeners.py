"""The console and metrics listeners against idle and hostile connections, and ``/metrics``
against browsers (issue 25, items 2 and 3).

- Item 2: a request body that stops arriving is cut after ``openai.header_timeout_ms`` on every
  listener, not only the OpenAI one; at their cap of 64 the console and metrics listeners evict
  their oldest connection that waits for a request head or body (or idles between requests)
  instead of refusing the operator; only when every connection runs a handler on a fully
  received request is the newcomer refused with the 503.
- Item 3: ``/metrics`` answers no ``Origin`` at all, and on a loopback ``metrics.listen`` only
  loopback ``Host`` names (DNS rebinding); off loopback the Host is not checked.

A real daemon in this process with real sockets on 127.0.0.1; the listeners' timers run on a
:class:`~iop_edge.testing.clock.FakeClock` moved by hand, so a cut happens at an exact time.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from iop_edge.admission import MonotonicClock
from iop_edge.config import parse_config
from iop_edge.config.refresh import refresh
from iop_edge.daemon import Daemon
from iop_edge.options import ServeOptions
from iop_edge.runtime.listeners import ADMIN_MAX_CONNECTIONS, Listener
from iop_edge.supervisor import SupervisorOptions
from iop_edge.testing.clock import FakeClock
from tests.helpers import wait_for
from tests.helpers.reliability import raw_exchange, raw_request

START = 100.0
HEADER_TIMEOUT = 2.0


def edge_doc(metrics_listen: str = "127.0.0.1:0") -> dict[str, Any]:
    """A loopback edge with the console and metrics listeners and a 2 s header timeout."""
    return {
        "openai": {"listen": "127.0.0.1:0", "header_timeout_ms": int(HEADER_TIMEOUT * 1000)},
        "metrics": {"listen": metrics_listen},
        "console": {"listen": "127.0.0.1:0"},
        "models": [{"id": "echo", "context_window_tokens": 4096, "providers": ["cat"]}],
        "nodes": [
            {
                "id": "n1",
                "adapters": [{"name": "shell", "type": "cli", "command": "cat"}],
                "providers": [{"id": "cat", "type": "cli", "category": "cli", "models": ["echo"]}],
            }
        ],
    }


@contextlib.asynccontextmanager
async def running(
    tmp_path: Path, doc: dict[str, Any], clock: FakeClock | None = None, **options: Any
) -> AsyncIterator[Daemon]:
    """A daemon on ``doc`` (its config file not watched; its listeners' timers on ``clock``,
    else the loop's), stopped afterwards."""
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(doc))
    daemon = Daemon(
        parse_config(doc),
        ServeOptions(
            config_path=path,
            watch=False,
            supervisor_options=SupervisorOptions(poll_interval=3600, **options),
        ),
        clock=clock or MonotonicClock(),
    )
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop()


def logged(stream: io.StringIO, event: str) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in stream.getvalue().splitlines() if line.strip())
    return [line for line in lines if line.get("event") == event]


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def connect(listener: Listener, count: int) -> list[Connection]:
    """``count`` TCP connections to ``listener``, opened one after the other (oldest first)."""
    return [await asyncio.open_connection(listener.host, listener.port) for _ in range(count)]


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """What the edge sends until it closes the connection (EOF or reset); a connection the
    edge keeps open fails the test (the wait is bounded)."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        async with asyncio.timeout(10):
            while chunk := await reader.read(65536):
                data += chunk
    return data


def decided(listener: Listener) -> int:
    """How many connections ``listener`` has accepted or refused so far."""
    stats = listener.statistics()
    return stats.accepted + stats.refused


def close_all(connections: list[Connection]) -> None:
    for _, writer in connections:
        writer.close()


#: What a stalled client sends on each listener: a complete head and one byte of its body
#: (the console's handler waits for the rest; the metrics handler answers without it, and the
#: connection then waits for the rest of the body before the next request).
STALLED = {
    "console": b"POST /admin/config/refresh HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    "metrics": b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{",
}
OPERATOR = {"console": "/admin/status", "metrics": "/metrics"}


def stalled_answer(name: str, answer: bytes) -> bool:
    """Whether a stalled request got what it should before its cut: nothing on the console
    (its handler waits for the body), the scrape on the metrics listener."""
    if name == "console":
        return answer == b""
    return answer.startswith(b"HTTP/1.1 200 OK\r\n")


# --- item 2: the operator always gets in -----------------------------------------------------


@pytest.mark.parametrize("name", ["console", "metrics"])
async def test_idle_and_stalled_connections_at_the_cap_never_lock_the_operator_out(
    tmp_path, log_stream, name
):
    """Issue 25 item 2: 64 connections that sent nothing fill the cap; 64 more that each send
    a head and one byte of body evict them, oldest first (not refused); the operator's request
    then evicts the oldest stalled body and is answered at once; the other 63 stalled bodies
    are cut exactly ``header_timeout`` after their heads arrived. Before, the 64 stalled
    bodies held the cap for ever and ``status``, ``restart`` and ``refresh`` got 503."""
    clock = FakeClock(START)
    async with running(tmp_path, edge_doc(), clock) as daemon:
        listener = daemon.listeners[name]
        idle = await connect(listener, ADMIN_MAX_CONNECTIONS)
        await wait_for(lambda: listener.statistics().open_connections == ADMIN_MAX_CONNECTIONS)
        clock.advance_to(START + 1)  # (their head timers, due at START + 2, never fire)

        stalled = await connect(listener, ADMIN_MAX_CONNECTIONS)
        await wait_for(lambda: decided(listener) == 2 * ADMIN_MAX_CONNECTIONS)
        assert listener.statistics().refused == 0  # before: all 64 refused, 503
        assert [await until_closed(reader) for reader, _ in idle] == [b""] * 64
        stats = listener.statistics()
        assert (stats.open_connections, stats.evicted) == (64, 64)

        clock.advance_to(START + 1.5)
        for _, writer in stalled:
            writer.write(STALLED[name])
        body_deadline = START + 1.5 + HEADER_TIMEOUT
        # every head parsed: each connection's head timer went, its body timer came
        await wait_for(lambda: clock.armed == [body_deadline] * ADMIN_MAX_CONNECTIONS)

        status, body = await raw_exchange(
            listener.host, listener.port, raw_request("GET", OPERATOR[name])
        )
        assert status == 200
        if name == "console":
            assert json.loads(body)["edge"] == daemon.config.edge.id
        else:
            assert b"iop_edge_listener_connections" in body
        # the oldest stalled body made room
        assert stalled_answer(name, await until_closed(stalled[0][0]))
        stats = listener.statistics()
        assert (stats.evicted, stats.refused, stats.header_timeouts) == (65, 0, 0)
        assert stats.open_connections == ADMIN_MAX_CONNECTIONS - 1

        clock.advance_to(body_deadline - 0.001)
        assert listener.statistics().open_connections == ADMIN_MAX_CONNECTIONS - 1
        clock.advance_to(body_deadline)
        cut = [await until_closed(reader) for reader, _ in stalled[1:]]
        assert [stalled_answer(name, answer) for answer in cut] == [True] * 63
        await wait_for(lambda: listener.statistics().open_connections == 0)
        assert listener.statistics().header_timeouts == 63
        assert clock.armed == []
        close_all(idle + stalled)
    [evicted] = logged(log_stream, "connection_evicted")  # rate-limited: one line
    assert (evicted["level"], evicted["listener"], evicted["cap"]) == ("warning", name, 64)
    [body_timeout] = logged(log_stream, "body_timeout")
    assert (body_timeout["level"], body_timeout["listener"]) == ("warning", name)
    assert logged(log_stream, "connection_limit") == []


class StuckClassify:
    """The pure refresh, except that the first call hangs until the test sets ``release``."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            self.release.wait(timeout=60)  # bounded: a broken test cannot hang the run
        return refresh(*args, **kwargs)


async def test_a_console_whose_connections_all_run_handlers_refuses_the_newcomer(
    tmp_path, log_stream
):
    """Issue 25 item 2: eviction spares a connection that runs a handler on a fully received
    request. 64 refreshes in flight (the first one's load stuck, the others waiting for it)
    fill the cap: a newcomer gets the 503 ``too_many_connections``, none is evicted, and
    every refresh is answered once the load goes on."""
    classify = StuckClassify()
    try:
        async with running(tmp_path, edge_doc(), classify=classify) as daemon:
            listener = daemon.listeners["console"]
            request = raw_request(
                "POST", "/admin/config/refresh", [(b"Content-Type", b"application/json")]
            )
            refreshes = [
                asyncio.create_task(raw_exchange(listener.host, listener.port, request))
                for _ in range(ADMIN_MAX_CONNECTIONS)
            ]
            await wait_for(lambda: classify.calls == 1)
            await wait_for(lambda: listener.statistics().open_connections == 64)
            status, body = await raw_exchange(
                listener.host, listener.port, raw_request("GET", "/admin/status")
            )
            assert (status, json.loads(body)["error"]["code"]) == (503, "too_many_connections")
            classify.release.set()
            answers = await asyncio.gather(*refreshes)
            assert [status for status, _ in answers] == [200] * 64
            stats = listener.statistics()
            assert (stats.evicted, stats.refused) == (0, 1)
    finally:
        classify.release.set()
    assert len(logged(log_stream, "connection_limit")) == 1
    assert logged(log_stream, "connection_evicted") == []


# --- item 3: /metrics and browsers -----------------------------------------------------------


async def scrape(port: int, headers: dict[str, str]) -> tuple[int, str]:
    """``GET /metrics`` on 127.0.0.1:``port`` with ``headers`` (a ``Host`` among them)."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as response,
    ):
        return response.status, await response.text()


def error_code(text: str) -> str:
    return str(json.loads(text)["error"]["code"])


@pytest.mark.parametrize(
    "origin", ["https://evil.example", "http://127.0.0.1:9464", "http://localhost", "null"]
)
@pytest.mark.parametrize("listen", ["127.0.0.1:0", "0.0.0.0:0"])
async def test_metrics_answer_no_browser_origin(tmp_path, listen, origin):
    """Issue 25 item 3: any ``Origin`` header is 403 ``origin_not_allowed``, on loopback or
    off: a scraper sends none, and a page must not read token refs, models and traffic."""
    async with running(tmp_path, edge_doc(listen)) as daemon:
        port = daemon.listeners["metrics"].port
        status, text = await scrape(port, {"Origin": origin})
        assert (status, error_code(text)) == (403, "origin_not_allowed")
        assert "answers no web page" in json.loads(text)["error"]["message"]
        assert (await scrape(port, {}))[0] == 200


async def test_loopback_metrics_answer_only_loopback_host_names(tmp_path):
    """Issue 25 item 3: on a loopback ``metrics.listen`` a ``Host`` that is not a loopback name
    (a DNS-rebinding page's own name) is 403 ``host_not_allowed``, unknown paths included;
    ``localhost``, ``127.x.y.z`` and ``[::1]``, with or without a port, are answered."""
    async with running(tmp_path, edge_doc()) as daemon:
        port = daemon.listeners["metrics"].port
        for host in ("rebound.example", f"rebound.example:{port}", "10.0.0.5", "0.0.0.0"):
            status, text = await scrape(port, {"Host": host})
            assert (status, error_code(text)) == (403, "host_not_allowed"), host
            assert "metrics.listen" in json.loads(text)["error"]["message"]
        for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", "127.1.2.3", "[::1]"):
            status, text = await scrape(port, {"Host": host})
            assert status == 200, host
            assert "iop_edge_listener_connections" in text
        url = f"http://127.0.0.1:{port}/other"
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, headers={"Host": "rebound.example"}) as response,
        ):
            assert (response.status, error_code(await response.text())) == (
                403,
                "host_not_allowed",
            )


async def test_metrics_off_loopback_answer_any_host_and_are_warned_about(tmp_path, log_stream):
    """Issue 25 item 3: off loopback the operator chose the network: any ``Host`` is answered
    (scrapers name the machine as they please), and the start-up warning stays."""
    async with running(tmp_path, edge_doc("0.0.0.0:0")) as daemon:
        port = daemon.listeners["metrics"].port
        for host in ("edge-1.example.net:9464", "10.0.0.5", "localhost"):
            assert (await scrape(port, {"Host": host}))[0] == 200, host
    assert [e["level"] for e in logged(log_stream, "metrics_not_loopback")] == ["warning"]

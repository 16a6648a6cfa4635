"""Streams that stall (issue 25), end to end: a provider's ``first_token_timeout_ms`` fails
over before the client's first byte (504 ``upstream_timeout`` when no provider is left), its
``stream_idle_timeout_ms`` ends a stream with the API's error event, both change live on a
refresh, and ``request_timeout_ms`` also ends an exchange whose client stopped reading.

The bounds run on the daemon's fake clock, which the test moves (issue 26): a bound passes
exactly at its time, never a millisecond before (:func:`tests.helpers.pass_deadline`), and no
test waits for one — but the live refresh's, whose second half needs a stream paced in real
time within its bounds, so it runs on the loop's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import dump, edge_on, pass_deadline, wait_for

BOUND_MS = 200
START = 1000.0
"""Where the daemon's fake clock starts."""
HELLO: Any = [{"role": "user", "content": "hello through the edge"}]


def two_providers(slow: FakeOpenAI, fast: FakeOpenAI, **slow_fields: Any) -> dict[str, Any]:
    """Model ``chat`` on ``slow`` (tried first: priority 0) and ``fast`` (priority 1), one slot
    each; model ``alone`` on ``slow`` only."""

    def provider(pid: str, adapter: str, priority: int, **fields: Any) -> dict[str, Any]:
        return {"id": pid, "type": "openai_compat", "category": "api", "adapter": adapter,
                "models": ["fake-model"], "priority": priority, **fields}  # fmt: skip

    return {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "models": [
            {"id": "chat", "context_window_tokens": 4096, "providers": ["slow", "fast"]},
            {"id": "alone", "context_window_tokens": 4096, "providers": ["slow"]},
        ],
        "nodes": [
            {
                "id": "local",
                "adapters": [
                    {"name": "a-slow", "type": "openai_compat", "base_url": slow.base_url},
                    {"name": "a-fast", "type": "openai_compat", "base_url": fast.base_url},
                ],
                "providers": [
                    provider("slow", "a-slow", 0, **slow_fields),
                    provider("fast", "a-fast", 1),
                ],
            }
        ],
    }


def request_lines(log_stream: io.StringIO) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in log_stream.getvalue().splitlines() if line.strip())
    return [line for line in lines if line.get("event") == "request"]


def sdk(url: str) -> openai.AsyncOpenAI:
    """An SDK client on ``url``, without retries (use it as ``async with``)."""
    return openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)


@contextlib.asynccontextmanager
async def fakes() -> AsyncIterator[tuple[FakeOpenAI, FakeOpenAI]]:
    async with FakeOpenAI() as slow, FakeOpenAI() as fast:
        yield slow, fast


async def read_sse(url: str, model: str, events: list[bytes] | None = None) -> list[bytes]:
    """The ``data:`` payloads of a streamed chat answer, read raw, each appended to ``events``
    (when given) as soon as its event is whole."""
    events = [] if events is None else events
    body = {"model": model, "stream": True, "messages": HELLO}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/chat/completions", json=body) as response,
    ):
        assert response.status == 200
        rest = b""
        async for chunk in response.content.iter_any():
            *whole, rest = (rest + chunk).split(b"\n\n")
            events.extend(event[6:] for event in whole if event.startswith(b"data: "))
    if rest.startswith(b"data: "):
        events.append(rest[6:])
    return events


async def test_no_first_event_in_time_fails_over_before_the_client_got_a_byte(
    tmp_path: Path, log_stream: io.StringIO
) -> None:
    """``slow`` answers its head, then nothing: at its ``first_token_timeout_ms`` the request
    goes to ``fast``, and the client gets one whole stream (the 200 head was not sent before);
    the log line names the failed-over attempt; slow's connection was closed."""
    clock = FakeClock(START)
    async with fakes() as (slow, fast):
        slow.behavior = FakeBehavior(fault="stall", fault_after=0)
        doc = two_providers(slow, fast, first_token_timeout_ms=BOUND_MS)
        async with (
            edge_on(tmp_path, doc, clock=clock) as edge,
            contextlib.AsyncExitStack() as stack,
        ):
            client = await stack.enter_async_context(sdk(edge.daemon.openai_url))
            due = START + BOUND_MS / 1000  # once slow has the request (its head comes at once)
            deadline = asyncio.create_task(
                pass_deadline(clock, due, lambda: slow.total_requests == 1)
            )
            stream = await client.chat.completions.create(model="chat", messages=HELLO, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            await deadline
            await slow.wait_until(lambda: slow.cancelled == 1)
    assert text == "hello through the edge"
    [line] = request_lines(log_stream)
    assert (line["status"], line["code"], line["provider"], line["attempts"]) == (
        200,
        "ok",
        "fast",
        2,
    )
    assert line["failed_over"] == ["local/slow: timeout"]


async def test_no_first_event_anywhere_is_a_504_upstream_timeout(
    tmp_path: Path, log_stream: io.StringIO
) -> None:
    """With no provider left the client gets 504 ``upstream_timeout`` as an error answer, not a
    200 stream; the log line says which bound passed."""
    clock = FakeClock(START)
    async with fakes() as (slow, fast):
        slow.behavior = FakeBehavior(fault="stall", fault_after=0)
        doc = two_providers(slow, fast, first_token_timeout_ms=BOUND_MS)
        async with (
            edge_on(tmp_path, doc, clock=clock) as edge,
            contextlib.AsyncExitStack() as stack,
        ):
            client = await stack.enter_async_context(sdk(edge.daemon.openai_url))
            due = START + BOUND_MS / 1000
            deadline = asyncio.create_task(
                pass_deadline(clock, due, lambda: slow.total_requests == 1)
            )
            with pytest.raises(openai.APIStatusError) as caught:
                await client.chat.completions.create(model="alone", messages=HELLO, stream=True)
            await deadline  # it failed at the bound, not before
            assert clock.now() == due
            assert edge.daemon.scheduler.statistics().in_flight == 0
    assert caught.value.status_code == 504
    assert caught.value.body["code"] == "upstream_timeout"  # type: ignore[index]
    [line] = request_lines(log_stream)
    assert (line["status"], line["code"]) == (504, "upstream_timeout")
    assert f"first_token_timeout_ms={BOUND_MS}" in line["error"]


async def test_a_stream_idle_past_its_bound_ends_with_the_error_event(
    tmp_path: Path, log_stream: io.StringIO
) -> None:
    """Three events, then silence: ``stream_idle_timeout_ms`` later the stream ends with
    ``data: {"error": ...}`` (``upstream_timeout``) — no ``[DONE]``, no finish reason."""
    clock = FakeClock(START)
    async with fakes() as (slow, fast):
        slow.behavior = FakeBehavior(fault="stall", fault_after=3)
        doc = two_providers(slow, fast, stream_idle_timeout_ms=BOUND_MS)
        async with edge_on(tmp_path, doc, clock=clock) as edge:
            events: list[bytes] = []
            due = START + BOUND_MS / 1000  # idle from the wait after the three events
            deadline = asyncio.create_task(pass_deadline(clock, due, lambda: len(events) == 3))
            await read_sse(edge.daemon.openai_url, "alone", events)
            await deadline
    assert b"[DONE]" not in events
    *chunks, last = [orjson.loads(event) for event in events]
    assert len(chunks) == 3
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert last["error"]["code"] == "upstream_timeout"
    [line] = request_lines(log_stream)
    assert (line["status"], line["code"]) == (200, "upstream_timeout")
    assert f"stream_idle_timeout_ms={BOUND_MS}" in line["error"]


async def test_the_stream_bounds_change_live_on_a_refresh(
    tmp_path: Path, log_stream: io.StringIO
) -> None:
    """Both fields are live: a refresh that sets them is applied (class ``live``), and the next
    request is bounded by them without a restart; removing them lifts the bound again."""
    async with (
        fakes() as (slow, fast),
        edge_on(tmp_path, two_providers(slow, fast)) as edge,
        contextlib.AsyncExitStack() as stack,
    ):
        doc = two_providers(
            slow, fast, first_token_timeout_ms=BOUND_MS, stream_idle_timeout_ms=BOUND_MS
        )
        edge.path.write_text(dump(doc))
        result = await edge.supervisor.refresh("api")
        assert result.result == "applied"
        assert {(e.path, e.change_class, e.applied) for e in result.report} == {
            ("nodes[local].providers[slow].first_token_timeout_ms", "live", True),
            ("nodes[local].providers[slow].stream_idle_timeout_ms", "live", True),
        }
        slow.behavior = FakeBehavior(fault="stall", fault_after=0)
        client = await stack.enter_async_context(sdk(edge.daemon.openai_url))
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model="alone", messages=HELLO, stream=True)
        assert caught.value.status_code == 504
        slow.behavior = FakeBehavior(chunk_delay=BOUND_MS / 1000 / 4)  # well within
        events = await read_sse(edge.daemon.openai_url, "alone")
        assert events[-1] == b"[DONE]"


# -- request_timeout_ms and a client that stopped reading -----------------------------------


@contextlib.asynccontextmanager
async def stalled_reader(url: str, model: str) -> AsyncIterator[socket.socket]:
    """A client with a tiny receive window that asks for a stream, reads the response head and
    then reads nothing more."""
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    body = orjson.dumps({"model": model, "stream": True, "messages": HELLO})
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    loop = asyncio.get_running_loop()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, int(port)))
        await loop.sock_sendall(sock, request)
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            byte = await loop.sock_recv(sock, 1)
            assert byte, head
            head += byte
        assert head.startswith(b"HTTP/1.1 200 "), head
        yield sock


async def test_request_timeout_ends_an_exchange_whose_client_stopped_reading(
    tmp_path: Path, log_stream: io.StringIO
) -> None:
    """The client stops reading a long stream; ``openai.write_timeout_ms`` (60 s) is far longer
    than the provider's ``request_timeout_ms``: when the latter runs out the exchange ends —
    upstream closed, slot released, the request logged 499 ``client_stalled`` naming
    ``request_timeout_ms`` — instead of waiting for the write timeout."""
    timeout_ms = 1000
    clock = FakeClock(START)
    async with fakes() as (slow, fast):
        # 32 MiB of answer in 64 KiB chunks: far more than the socket buffers on the way hold
        slow.behavior = FakeBehavior(reply="x" * (32 << 20), chunks=512)
        doc = two_providers(slow, fast, request_timeout_ms=timeout_ms)
        doc["openai"]["write_timeout_ms"] = 60_000
        async with edge_on(tmp_path, doc, clock=clock) as edge:
            listener = edge.daemon.listeners["openai"]
            stalled = lambda: listener.statistics().writes_waiting == 1  # noqa: E731
            due = START + timeout_ms / 1000  # once the writes wait for the client
            deadline = asyncio.create_task(pass_deadline(clock, due, stalled))
            async with stalled_reader(edge.daemon.openai_url, "alone"):
                await wait_for(lambda: bool(request_lines(log_stream)), timeout=15)
                await deadline  # the exchange ended at request_timeout_ms, not before
                assert clock.now() == due
                assert edge.daemon.scheduler.statistics().in_flight == 0
                await slow.wait_until(lambda: slow.cancelled == 1)
    [line] = request_lines(log_stream)
    assert (line["status"], line["code"]) == (499, "client_stalled")
    assert "request_timeout_ms" in line["error"]

"""The rest of ``/v1/messages``' error types, each as the official ``anthropic`` SDK raises it
against a running edge: ``rate_limit_error`` 429, ``request_too_large`` 413,
``permission_error`` 403, ``api_error`` 500 (an upstream that fails) and ``timeout_error`` 504
(an upstream past its bound, on the daemon's fake clock). The refusals common with the first
batch (400, 401, 404, 529, an upstream's own status, the error event) are in
``test_messages.py``."""

from __future__ import annotations

import asyncio
import io
import socket
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import pass_deadline
from tests.helpers.api import anthropic_client, edge_doc, request_lines, running_edge

HELLO: Any = [{"role": "user", "content": "hello through the edge"}]
START = 1000.0
"""Where the daemon's fake clock starts."""


def error_of(exc: anthropic.APIStatusError) -> dict[str, Any]:
    """The ``error`` object of an Anthropic error body (checking the envelope)."""
    body: Any = exc.body
    assert set(body) == {"type", "error"}
    assert body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    error: dict[str, Any] = body["error"]
    return error


async def ask(client: anthropic.AsyncAnthropic, stream: bool, model: str = "chat-oa") -> Any:
    """One request, streamed (its final message) or not."""
    if not stream:
        return await client.messages.create(model=model, max_tokens=8, messages=HELLO)
    async with client.messages.stream(model=model, max_tokens=8, messages=HELLO) as answer:
        return await answer.get_final_message()


async def read_events(client: anthropic.AsyncAnthropic, events: list[str]) -> None:
    """Stream an answer, appending each event's type to ``events`` as it comes."""
    async with client.messages.stream(model="chat-oa", max_tokens=8, messages=HELLO) as answer:
        async for event in answer:
            events.append(event.type)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_principal_over_its_rate_is_rate_limit_error_429_with_retry_after(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, stream: bool
) -> None:
    doc = edge_doc(fake_oa, fake_ol)
    doc["provider_pool"]["principals"] = [{"ref": "team-a", "max_requests_per_minute": 1}]
    async with running_edge(doc) as edge, anthropic_client(edge) as c:
        await ask(c, stream)
        with pytest.raises(anthropic.RateLimitError) as info:
            await ask(c, stream)
    assert info.value.status_code == 429
    error = error_of(info.value)
    assert error["type"] == "rate_limit_error"
    assert "team-a" in error["message"]
    assert info.value.response.headers["Retry-After"] == "60"
    assert len(fake_oa.requests) == 1


async def test_a_body_past_max_body_bytes_is_request_too_large_413(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    doc = edge_doc(fake_oa, fake_ol)
    doc["openai"]["max_body_bytes"] = 2048
    async with running_edge(doc) as edge, anthropic_client(edge) as c:
        with pytest.raises(anthropic.APIStatusError) as info:
            await c.messages.create(
                model="chat-oa", max_tokens=8, messages=[{"role": "user", "content": "x" * 4096}]
            )
        fits = await c.messages.create(model="chat-oa", max_tokens=8, messages=HELLO)
    assert info.value.status_code == 413
    error = error_of(info.value)
    assert error["type"] == "request_too_large"
    assert "openai.max_body_bytes" in error["message"]
    assert fits.content[0].type == "text"
    assert len(fake_oa.requests) == 1


async def test_an_origin_not_allowed_is_permission_error_403(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    doc = edge_doc(fake_oa, fake_ol)
    doc["openai"]["allowed_origins"] = ["https://app.example"]
    async with running_edge(doc) as edge, anthropic_client(edge) as c:
        with pytest.raises(anthropic.PermissionDeniedError) as info:
            await c.messages.create(
                model="chat-oa",
                max_tokens=8,
                messages=HELLO,
                extra_headers={"Origin": "https://evil.example"},
            )
        allowed = await c.messages.create(
            model="chat-oa",
            max_tokens=8,
            messages=HELLO,
            extra_headers={"Origin": "https://app.example"},
        )
    assert info.value.status_code == 403
    error = error_of(info.value)
    assert error["type"] == "permission_error"
    assert "'https://evil.example'" in error["message"]
    assert "openai.allowed_origins" in error["message"]
    assert allowed.content[0].type == "text"
    assert len(fake_oa.requests) == 1


# -- the upstream fails: api_error ------------------------------------------------------------


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A local port where nothing listens: bound, never listening, so a connect is refused
    (and no other process can take the port while the test runs)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_unreachable_upstream_is_api_error_500(
    fake_oa: FakeOpenAI,
    fake_ol: FakeOllama,
    closed_port: int,
    stream: bool,
    log_stream: io.StringIO,
) -> None:
    doc = edge_doc(fake_oa, fake_ol)
    doc["nodes"][0]["adapters"][0]["base_url"] = f"http://127.0.0.1:{closed_port}/v1"
    async with running_edge(doc) as edge, anthropic_client(edge) as c:
        with pytest.raises(anthropic.InternalServerError) as info:
            await ask(c, stream)
    assert info.value.status_code == 500
    error = error_of(info.value)
    assert error["type"] == "api_error"
    assert "up" in error["message"]  # (the provider, never its URL)
    assert str(closed_port) not in error["message"]
    [line] = request_lines(log_stream)
    assert (line["status"], line["code"], line["stream"]) == (500, "upstream_error", stream)


@pytest.mark.parametrize(
    "broken",
    [
        FakeBehavior(fault="malformed", fault_after=1),  # half a body, then the end
        FakeBehavior(fault="disconnect"),  # the connection closed before any answer
        FakeBehavior(fault="reset", fault_after=1),  # the connection cut mid-body
    ],
    ids=["malformed", "disconnect", "reset"],
)
async def test_a_broken_answer_is_api_error_500(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, broken: FakeBehavior
) -> None:
    fake_oa.behavior = broken
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        with pytest.raises(anthropic.InternalServerError) as info:
            await ask(c, stream=False)
    assert info.value.status_code == 500
    assert error_of(info.value)["type"] == "api_error"


async def test_a_broken_stream_after_its_first_byte_ends_in_an_api_error_event(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, log_stream: io.StringIO
) -> None:
    fake_oa.behavior = FakeBehavior(fault="malformed", fault_after=2)
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        events: list[str] = []
        with pytest.raises(anthropic.APIStatusError) as info:
            await read_events(c, events)
    assert events[0] == "message_start"
    assert "message_stop" not in events
    assert error_of(info.value)["type"] == "api_error"
    [line] = request_lines(log_stream)
    assert (line["status"], line["code"]) == (200, "upstream_error")


# -- the upstream is too slow: timeout_error --------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_past_its_request_timeout_is_timeout_error_504(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, stream: bool, log_stream: io.StringIO
) -> None:
    """The upstream holds the request; at the provider's ``request_timeout_ms`` on the
    daemon's clock (never before) the client gets 504 ``timeout_error`` — streamed too, as no
    byte had gone out."""
    clock = FakeClock(START)
    fake_oa.behavior = FakeBehavior(hold=True)
    doc = edge_doc(fake_oa, fake_ol)
    doc["nodes"][0]["providers"][0]["request_timeout_ms"] = 200
    async with running_edge(doc, clock) as edge, anthropic_client(edge) as c:
        due = START + 0.2
        deadline = asyncio.create_task(pass_deadline(clock, due, lambda: fake_oa.in_flight == 1))
        with pytest.raises(anthropic.APIStatusError) as info:
            await ask(c, stream)
        await deadline  # it failed at the bound, not before
        assert clock.now() == due
        await fake_oa.wait_until(lambda: fake_oa.cancelled == 1)
    assert info.value.status_code == 504
    error = error_of(info.value)
    assert error["type"] == "timeout_error"
    [line] = request_lines(log_stream)
    assert (line["status"], line["code"]) == (504, "upstream_timeout")
    assert "request_timeout_ms=200" in line["error"]

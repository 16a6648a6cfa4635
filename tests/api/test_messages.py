"""``POST /v1/messages`` through a running edge, with the official ``anthropic`` SDK as the client:
translated for each adapter type, streamed and not, its errors in Anthropic's shape, the
keep-alive of a waiting stream, failover before the first byte and the error event after it,
the agent session on the request line."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import aiohttp
import anthropic
import pytest

from iop_edge.api.keepalive import KEEPALIVE_INTERVAL
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import wait_for
from tests.helpers.api import (
    TOKEN,
    anthropic_client,
    edge_doc,
    request_lines,
    running_edge,
)

HELLO: Any = [{"role": "user", "content": "hello through the edge"}]


@pytest.mark.parametrize("model", ["chat-oa", "chat-ol", "chat-cli"])
async def test_a_message_through_each_adapter_type_streamed_equals_the_whole_answer(
    model: str, fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        whole = await c.messages.create(model=model, max_tokens=64, messages=HELLO)
        async with c.messages.stream(model=model, max_tokens=64, messages=HELLO) as stream:
            streamed = await stream.get_final_message()
    assert whole.model == streamed.model == model
    assert whole.role == "assistant"
    assert whole.type == "message"
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in whole.content]
    assert whole.content[0].type == "text"
    assert "hello" in whole.content[0].text
    assert whole.stop_reason == streamed.stop_reason == "end_turn"
    assert whole.id.startswith("msg_")
    assert streamed.id.startswith("msg_")
    assert whole.usage.output_tokens > 0
    assert streamed.usage.output_tokens == whole.usage.output_tokens


async def test_the_bearer_token_of_anthropic_auth_token_is_accepted(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge:
        base = edge.openai_url.removesuffix("/v1")
        async with anthropic.AsyncAnthropic(
            base_url=base, auth_token=TOKEN, max_retries=0
        ) as client:
            answer = await client.messages.create(model="chat-oa", max_tokens=8, messages=HELLO)
    assert answer.content[0].type == "text"
    # The client's own credential never goes upstream.
    sent = fake_oa.requests[-1].headers
    assert "Authorization" not in sent
    assert "x-api-key" not in sent


async def test_the_usage_is_the_upstreams_and_max_tokens_gets_the_groups_floor(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """chat-oa has min_max_tokens 8: a max_tokens of 2 is raised (as for chat)."""
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        answer = await c.messages.create(model="chat-oa", max_tokens=2, messages=HELLO)
    body = fake_oa.requests[-1].json
    assert body["max_tokens"] == 8
    assert body["model"] == "fake-model"
    assert answer.usage.input_tokens == 4  # the fake counts words of every message
    assert answer.usage.output_tokens == 4


async def test_a_stop_sequence_and_the_token_limit_are_the_stop_reasons(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        long: Any = [{"role": "user", "content": " ".join(f"w{i}" for i in range(20))}]
        cut = await c.messages.create(model="chat-oa", max_tokens=8, messages=long)
        stopped = await c.messages.create(
            model="chat-oa", max_tokens=64, messages=HELLO, stop_sequences=["through"]
        )
    assert cut.stop_reason == "max_tokens"
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "through")
    assert fake_oa.requests[-1].json["stop"] == ["through"]


# -- errors, in Anthropic's shape -------------------------------------------------------------


async def test_every_refusal_is_an_anthropic_error_the_sdk_raises_as_its_class(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        with pytest.raises(anthropic.NotFoundError) as unknown:
            await c.messages.create(model="no-such-model", max_tokens=8, messages=HELLO)
        with pytest.raises(anthropic.BadRequestError) as missing:  # (the SDK insists on it)
            await c.post(
                "/v1/messages",
                body={"model": "chat-oa", "messages": HELLO},
                cast_to=anthropic.types.Message,
            )
        with pytest.raises(anthropic.BadRequestError) as server_tool:
            await c.messages.create(
                model="chat-oa",
                max_tokens=8,
                messages=HELLO,
                tools=[{"type": "web_search_20250305", "name": "web_search"}],
            )
        async with anthropic_client(edge, "iop_wrong-token") as stranger:
            with pytest.raises(anthropic.AuthenticationError) as denied:
                await stranger.messages.create(model="chat-oa", max_tokens=8, messages=HELLO)
    assert _body(unknown.value) == {
        "type": "error",
        "error": {"type": "not_found_error", "message": _body(unknown.value)["error"]["message"]},
    }
    assert "no-such-model" in _body(unknown.value)["error"]["message"]
    assert _body(missing.value)["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in _body(missing.value)["error"]["message"]
    assert "tools[0].type" in _body(server_tool.value)["error"]["message"]
    assert denied.value.status_code == 401
    assert _body(denied.value)["error"]["type"] == "authentication_error"


async def test_a_full_queue_is_529_overloaded(fake_oa: FakeOpenAI, fake_ol: FakeOllama) -> None:
    fake_oa.behavior = FakeBehavior(hold=True)
    async with (
        running_edge(edge_doc(fake_oa, fake_ol, capacity=1)) as edge,
        anthropic_client(edge) as c,
    ):
        calls = [
            asyncio.create_task(c.messages.create(model="chat-oa", max_tokens=8, messages=HELLO))
            for _ in range(3)
        ]  # one in flight, two queued (max_queue 2)
        await fake_oa.wait_in_flight(1)
        await wait_for(lambda: edge.scheduler.statistics().queue_depth == 2)
        with pytest.raises(anthropic.OverloadedError) as info:
            await c.messages.create(model="chat-oa", max_tokens=8, messages=HELLO)
        fake_oa.release()
        fake_oa.behavior = FakeBehavior()
        await asyncio.gather(*calls)
    assert info.value.status_code == 529
    assert _body(info.value)["error"]["type"] == "overloaded_error"
    assert info.value.response.headers["Retry-After"] == "1"


async def test_an_upstream_error_status_comes_back_with_its_status_and_its_wording(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    fake_oa.behavior = FakeBehavior(status=400, error_message="prompt is too long: 9000 tokens")
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        with pytest.raises(anthropic.BadRequestError) as info:
            await c.messages.create(model="chat-oa", max_tokens=8, messages=HELLO)
    assert _body(info.value) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "prompt is too long: 9000 tokens"},
    }


async def test_a_failure_after_the_first_byte_is_an_error_event_never_message_stop(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    fake_oa.behavior = FakeBehavior(fault="reset", fault_after=3)
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge:
        raw = await _raw_stream(edge.openai_url, {"model": "chat-oa", "max_tokens": 64})
        async with anthropic_client(edge) as c:
            with pytest.raises(anthropic.APIStatusError) as info:
                async with c.messages.stream(
                    model="chat-oa", max_tokens=64, messages=HELLO
                ) as stream:
                    await stream.get_final_message()
    names = _event_names(raw)
    assert names[0] == "message_start"
    assert names[-1] == "error"
    assert "message_stop" not in names
    assert "message_delta" not in names
    assert _body(info.value)["error"]["type"] == "api_error"


# -- failover, keep-alive ---------------------------------------------------------------------


def _two_providers(first: FakeOpenAI, second: FakeOpenAI) -> dict[str, Any]:
    """Model ``chat`` on providers ``first`` (tried first: priority 0) and ``second``."""

    def provider(pid: str, priority: int) -> dict[str, Any]:
        return {"id": pid, "type": "openai_compat", "category": "api", "adapter": pid,
                "models": ["fake-model"], "priority": priority}  # fmt: skip

    return {
        "openai": {"listen": "127.0.0.1:0"},
        "models": [{"id": "chat", "context_window_tokens": 4096, "providers": ["first", "second"]}],
        "nodes": [
            {
                "id": "local",
                "adapters": [
                    {"name": "first", "type": "openai_compat", "base_url": first.base_url},
                    {"name": "second", "type": "openai_compat", "base_url": second.base_url},
                ],
                "providers": [provider("first", 0), provider("second", 1)],
            }
        ],
    }


async def test_a_failure_before_the_first_byte_fails_over_unseen(log_stream: io.StringIO) -> None:
    async with (
        FakeOpenAI(behavior=FakeBehavior(status=503)) as first,
        FakeOpenAI() as second,
        running_edge(_two_providers(first, second)) as edge,
        anthropic_client(edge, "unused") as c,
    ):
        whole = await c.messages.create(model="chat", max_tokens=64, messages=HELLO)
        async with c.messages.stream(model="chat", max_tokens=64, messages=HELLO) as stream:
            streamed = await stream.get_final_message()
    assert whole.content[0].type == streamed.content[0].type == "text"
    assert [line["provider"] for line in request_lines(log_stream)] == ["second", "second"]
    assert all(line["attempts"] == 2 for line in request_lines(log_stream))


async def test_a_stream_that_waits_in_the_queue_sends_pings_then_its_answer(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """capacity 1, the first request held upstream: the second waits in the queue; each
    KEEPALIVE_INTERVAL on the edge's clock it gets a ping (the head went out with the first),
    and once the slot frees its whole answer follows on the same stream."""
    clock = FakeClock(1000.0)
    fake_oa.behavior = FakeBehavior(hold=True)
    async with (
        running_edge(edge_doc(fake_oa, fake_ol, capacity=1), clock) as edge,
        anthropic_client(edge) as c,
    ):
        held = asyncio.create_task(c.messages.create(model="chat-oa", max_tokens=8, messages=HELLO))
        await fake_oa.wait_in_flight(1)
        async with aiohttp.ClientSession() as session:
            posted = asyncio.create_task(
                session.post(
                    edge.openai_url + "/messages",
                    json={
                        "model": "chat-oa",
                        "max_tokens": 8,
                        "messages": HELLO,
                        "stream": True,
                    },
                    headers={"x-api-key": TOKEN, "anthropic-version": "2023-06-01"},
                )
            )
            # (the head goes out with the first ping: posted is done once it came)
            await wait_for(lambda: edge.scheduler.statistics().queue_depth == 1)
            due = 1000.0 + KEEPALIVE_INTERVAL
            clock.advance_to(due)
            response = await posted
            assert response.status == 200
            first = await response.content.readuntil(b"\n\n")
            clock.advance_to(due + KEEPALIVE_INTERVAL)
            second = await response.content.readuntil(b"\n\n")
            fake_oa.behavior = FakeBehavior()
            fake_oa.release()
            rest = await response.read()
        await held
    assert first == second == b'event: ping\ndata: {"type":"ping"}\n\n'
    names = _event_names(rest)
    assert names[0] == "message_start"
    assert names[-1] == "message_stop"


async def test_a_waiting_stream_refused_after_its_head_went_out_ends_in_an_error_event(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """The queue times out (queue_timeout_ms 30 s) after pings went out: the refusal is an
    overloaded_error event, the status having been 200."""
    clock = FakeClock(1000.0)
    fake_oa.behavior = FakeBehavior(hold=True)
    async with (
        running_edge(edge_doc(fake_oa, fake_ol, capacity=1), clock) as edge,
        anthropic_client(edge) as c,
    ):
        held = asyncio.create_task(c.messages.create(model="chat-oa", max_tokens=8, messages=HELLO))
        await fake_oa.wait_in_flight(1)
        async with aiohttp.ClientSession() as session:
            posted = asyncio.create_task(
                session.post(
                    edge.openai_url + "/messages",
                    json={
                        "model": "chat-oa",
                        "max_tokens": 8,
                        "messages": HELLO,
                        "stream": True,
                    },
                    headers={"x-api-key": TOKEN},
                )
            )
            await wait_for(lambda: edge.scheduler.statistics().queue_depth == 1)
            clock.advance_to(1000.0 + KEEPALIVE_INTERVAL)
            response = await posted
            # The scheduler's one timer is armed for its next deadline (a probe's, then the
            # queue's): keep the clock at the queue's deadline until the refusal came.
            read = asyncio.create_task(response.read())

            def refused() -> bool:
                clock.advance_to(1000.0 + 30.0)
                return read.done()

            await wait_for(refused)
            body = await read
        fake_oa.release()
        await held
    assert response.status == 200
    assert body.startswith(b"event: ping\n")
    assert _event_names(body)[-1] == "error"
    assert b'"overloaded_error"' in body


# -- the request line -------------------------------------------------------------------------


async def test_the_agent_session_is_on_the_request_line_when_valid(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, log_stream: io.StringIO
) -> None:
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        for session in ("5d1e7a2b-9c4e-4e8a-9b3c-6d5e4f3a2b1c", "bad value\twith tab"):
            await c.messages.create(
                model="chat-oa",
                max_tokens=8,
                messages=HELLO,
                extra_headers={"X-Claude-Code-Session-Id": session},
            )
    good, bad = request_lines(log_stream)
    assert (good["endpoint"], good["session_id"]) == (
        "messages",
        "5d1e7a2b-9c4e-4e8a-9b3c-6d5e4f3a2b1c",
    )
    assert bad["session_id"] is None
    assert good["principal_ref"] == "team-a"
    assert good["model"] == "chat-oa"


# -- helpers ----------------------------------------------------------------------------------


async def _raw_stream(openai_url: str, fields: dict[str, Any]) -> bytes:
    """The bytes of a streamed /v1/messages answer, read with a plain HTTP client."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            openai_url + "/messages",
            json={**fields, "messages": HELLO, "stream": True},
            headers={"x-api-key": TOKEN, "anthropic-version": "2023-06-01"},
        ) as response,
    ):
        return await response.read()


def _body(error: anthropic.APIStatusError) -> dict[str, Any]:
    """The error answer's JSON body."""
    body = error.body
    assert isinstance(body, dict)
    return body


def _event_names(raw: bytes) -> list[str]:
    return [
        line[len(b"event: ") :].decode() for line in raw.split(b"\n") if line.startswith(b"event: ")
    ]

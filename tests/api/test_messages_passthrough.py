"""``/v1/messages`` passed through to a provider that serves Anthropic Messages itself
(``native_apis: [messages]``), with the official ``anthropic`` SDK against a running edge.

The answers are compared byte for byte with what a second fake (the *reference*, fresh like
the upstream, so its ids run alike) answers the same body directly: the edge may change only
``model``. What reached the upstream is read from the fake's record."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers.api import TOKEN, anthropic_client, request_lines, running_edge, token_entry
from tests.helpers.claude_code import EPHEMERAL, turn_with_history

HELLO: Any = [{"role": "user", "content": "hello through the edge"}]
SONNET = "claude-sonnet-4-5-20250929"
VERSION = "2023-06-01"
BETA = "interleaved-thinking-2025-05-14,context-management-2025-06-27"
#: a behaviour whose answer has every kind of block (thinking, text, tool_use)
RICH = FakeBehavior(thinking="Think first.", tool_call='get_weather:{"city": "Paris"}')


def passthrough_doc(up: FakeOpenAI, **openai: Any) -> dict[str, Any]:
    """Model ``native`` (alias :data:`SONNET`; ``min_max_tokens`` 8) and ``thinker``
    (``default_thinking_token_budget`` 512) on provider ``nat``, whose adapter declares
    ``native_apis: [messages]``; the client's token is :data:`TOKEN`."""
    return {
        "openai": {
            "listen": "127.0.0.1:0",
            "principal_tokens": [token_entry("app-chat", TOKEN)],
            **openai,
        },
        "models": [
            {
                "id": "native",
                "aliases": [SONNET],
                "context_window_tokens": 200_000,
                "providers": ["nat"],
                "default_max_tokens": 64,
                "min_max_tokens": 8,
            },
            {
                "id": "thinker",
                "context_window_tokens": 200_000,
                "providers": ["nat"],
                "min_max_tokens": 8,
                "default_thinking_token_budget": 512,
            },
        ],
        "nodes": [
            {
                "id": "n1",
                "adapters": [
                    {
                        "name": "vllm",
                        "type": "openai_compat",
                        "base_url": up.base_url,
                        "native_apis": ["messages"],
                    }
                ],
                "providers": [
                    {
                        "id": "nat",
                        "type": "openai_compat",
                        "category": "local_inference",
                        "adapter": "vllm",
                        "models": ["fake-model"],
                    }
                ],
            }
        ],
    }


async def direct(fake: FakeOpenAI, body: dict[str, Any]) -> tuple[int, bytes]:
    """The status and the bytes ``fake`` answers ``body`` with, POSTed to it directly."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{fake.base_url}/messages", json=body) as response,
    ):
        return response.status, await response.read()


async def streamed_bytes(client: anthropic.AsyncAnthropic, **fields: Any) -> bytes:
    """The raw bytes of a streamed answer, read through the SDK."""
    async with client.messages.with_streaming_response.create(**fields, stream=True) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        return b"".join([chunk async for chunk in response.iter_bytes()])


async def ask(client: anthropic.AsyncAnthropic, stream: bool) -> anthropic.types.Message:
    """One request for ``native``, streamed (its final message) or not."""
    if not stream:
        return await client.messages.create(model="native", max_tokens=8, messages=HELLO)
    async with client.messages.stream(model="native", max_tokens=8, messages=HELLO) as answer:
        return await answer.get_final_message()


def as_asked(raw: bytes, model: str) -> bytes:
    """The upstream's bytes with its model name set to the one the client asked for."""
    return raw.replace(b'"model":"fake-model"', b'"model":' + orjson.dumps(model))


def event_names(raw: bytes) -> list[str]:
    return [line[7:].decode() for line in raw.split(b"\n") if line.startswith(b"event: ")]


@pytest.fixture
async def up() -> AsyncIterator[FakeOpenAI]:
    """The passthrough provider's upstream."""
    async with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
async def reference() -> AsyncIterator[FakeOpenAI]:
    """A fake like :func:`up`, asked directly: what the upstream answers without the edge."""
    async with FakeOpenAI() as fake:
        yield fake


# -- the answer is the upstream's -------------------------------------------------------------


async def test_the_answer_and_the_stream_are_the_upstreams_own_but_for_model(
    up: FakeOpenAI, reference: FakeOpenAI
) -> None:
    up.behavior = reference.behavior = RICH
    fields: Any = {"model": "native", "max_tokens": 64, "messages": HELLO}
    upstream = {**fields, "model": "fake-model"}
    async with running_edge(passthrough_doc(up)) as edge, anthropic_client(edge) as c:
        response = await c.messages.with_raw_response.create(**fields)
        whole_raw = await response.read()
        whole = await response.parse()
        stream_raw = await streamed_bytes(c, **fields)
        async with c.messages.stream(**fields) as stream:
            final = await stream.get_final_message()
    assert whole_raw == as_asked((await direct(reference, upstream))[1], "native")
    assert stream_raw == as_asked(
        (await direct(reference, {**upstream, "stream": True}))[1], "native"
    )
    assert b'"model":"native"' in stream_raw
    assert event_names(stream_raw)[-1] == "message_stop"
    assert whole.model == final.model == "native"
    assert [b.type for b in whole.content] == ["thinking", "text", "tool_use"]
    assert [b.model_dump() for b in final.content][:2] == [b.model_dump() for b in whole.content][
        :2
    ]
    assert [r.path for r in up.requests] == ["/v1/messages"] * 3


async def test_the_body_reaches_the_upstream_untouched_but_for_model(up: FakeOpenAI) -> None:
    """Claude Code's request (its model an alias): every field as the client sent it —
    ``cache_control`` everywhere, the billing header, ``context_management``, the thinking
    blocks with their signatures — but ``model``, which is the provider's target; the
    Anthropic headers go with it, the client's credential (either form) does not."""
    body = {**turn_with_history(), "cache_control": EPHEMERAL}
    body["model"] = SONNET
    async with running_edge(passthrough_doc(up)) as edge, aiohttp.ClientSession() as session:
        for credential in ({"x-api-key": TOKEN}, {"Authorization": f"Bearer {TOKEN}"}):
            headers = {**credential, "anthropic-version": VERSION, "anthropic-beta": BETA}
            async with session.post(
                edge.openai_url + "/messages", json=body, headers=headers
            ) as response:
                assert response.status == 200
                raw = await response.read()
            assert event_names(raw)[-1] == "message_stop"
    for sent in up.requests:
        assert sent.path == "/v1/messages"
        assert sent.json == {**body, "model": "fake-model"}
        assert sent.headers["anthropic-version"] == VERSION
        assert sent.headers["anthropic-beta"] == BETA
        assert "x-api-key" not in sent.headers
        assert "Authorization" not in sent.headers
    assert len(up.requests) == 2


async def test_the_generation_policy_is_applied_to_the_native_body(up: FakeOpenAI) -> None:
    """``min_max_tokens`` raises ``max_tokens``; the group's ``default_thinking_token_budget``
    becomes ``thinking`` when the client sent none, and leaves the client's own alone."""
    async with running_edge(passthrough_doc(up)) as edge, anthropic_client(edge) as c:
        await c.messages.create(model="native", max_tokens=2, messages=HELLO)
        raised = up.requests[-1].json
        await c.messages.create(model="thinker", max_tokens=1024, messages=HELLO)
        defaulted = up.requests[-1].json
        await c.messages.create(
            model="thinker", max_tokens=1024, messages=HELLO, thinking={"type": "disabled"}
        )
        own = up.requests[-1].json
    assert raised == {"model": "fake-model", "max_tokens": 8, "messages": HELLO}
    assert "thinking" not in raised
    assert defaulted["thinking"] == {"type": "enabled", "budget_tokens": 512}
    assert own["thinking"] == {"type": "disabled"}
    assert own["max_tokens"] == defaulted["max_tokens"] == 1024


async def test_provider_auth_forwarding_works_as_for_chat() -> None:
    """With ``provider_auth`` on, the client's X-IOP-Provider-Authorization goes upstream as
    ``Authorization: Bearer`` (the upstream requires it), the header itself does not — for a
    message and for a count; without it the edge answers 401 before any upstream call."""
    async with FakeOpenAI(api_key="sk-upstream") as up:
        doc = passthrough_doc(up, provider_auth={"enabled": True})
        async with running_edge(doc) as edge, anthropic_client(edge) as c:
            answer = await c.messages.create(
                model="native",
                max_tokens=8,
                messages=HELLO,
                extra_headers={"X-IOP-Provider-Authorization": "sk-upstream"},
            )
            counted = await c.messages.count_tokens(
                model="native",
                messages=HELLO,
                extra_headers={"X-IOP-Provider-Authorization": "sk-upstream"},
            )
            with pytest.raises(anthropic.AuthenticationError) as missing:
                await c.messages.create(model="native", max_tokens=8, messages=HELLO)
    assert [r.path for r in up.requests] == ["/v1/messages", "/v1/messages/count_tokens"]
    for sent in up.requests:
        assert sent.headers["Authorization"] == "Bearer sk-upstream"
        assert "X-IOP-Provider-Authorization" not in sent.headers
        assert "x-api-key" not in sent.headers
    assert counted.input_tokens == 4  # (the upstream's count: it took the key)
    assert answer.content[0].type == "text"
    assert missing.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, anthropic.BadRequestError),
        (413, anthropic.APIStatusError),
        (500, anthropic.InternalServerError),
        (529, anthropic.OverloadedError),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_error_status_is_relayed_with_its_status_and_body(
    up: FakeOpenAI,
    reference: FakeOpenAI,
    status: int,
    error_class: type[anthropic.APIStatusError],
    stream: bool,
) -> None:
    up.behavior = reference.behavior = FakeBehavior(
        status=status, error_message="prompt is too long: 201000 tokens > 200000 maximum"
    )
    async with running_edge(passthrough_doc(up)) as edge, anthropic_client(edge) as c:
        with pytest.raises(error_class) as info:
            await ask(c, stream)
    expected_status, expected = await direct(
        reference, {"model": "fake-model", "max_tokens": 8, "messages": HELLO}
    )
    assert info.value.status_code == expected_status == status
    assert await info.value.response.aread() == expected


async def test_an_upstream_error_event_is_relayed_as_it_came_and_ends_the_stream(
    up: FakeOpenAI, reference: FakeOpenAI, log_stream: io.StringIO
) -> None:
    up.behavior = reference.behavior = FakeBehavior(
        fault="error", fault_after=3, error_code="overloaded_error", error_message="Overloaded"
    )
    fields: Any = {"model": "native", "max_tokens": 64, "messages": HELLO}
    async with running_edge(passthrough_doc(up)) as edge, anthropic_client(edge) as c:
        raw = await streamed_bytes(c, **fields)
        with pytest.raises(anthropic.APIStatusError) as info:
            async with c.messages.stream(**fields) as stream:
                await stream.get_final_message()
    _, expected = await direct(reference, {**fields, "model": "fake-model", "stream": True})
    assert raw == as_asked(expected, "native")
    names = event_names(raw)
    assert names == ["message_start", "ping", "content_block_start", "error"]
    assert info.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    line = request_lines(log_stream)[0]
    assert (line["status"], line["code"]) == (200, "upstream_error")
    assert "Overloaded" in line["error"]


async def test_the_request_line_has_the_upstreams_usage(
    up: FakeOpenAI, log_stream: io.StringIO
) -> None:
    """Input from message_start (or the Message), output from message_delta (the last)."""
    async with running_edge(passthrough_doc(up)) as edge, anthropic_client(edge) as c:
        whole = await c.messages.create(model="native", max_tokens=64, messages=HELLO)
        async with c.messages.stream(model="native", max_tokens=64, messages=HELLO) as stream:
            final = await stream.get_final_message()
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (4, 4)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (4, 4)
    lines = request_lines(log_stream)
    assert [(x["prompt_tokens"], x["completion_tokens"]) for x in lines] == [(4, 4), (4, 4)]
    assert [(x["endpoint"], x["provider"], x["stream"]) for x in lines] == [
        ("messages", "nat", False),
        ("messages", "nat", True),
    ]
    assert not any(x["usage_estimated"] for x in lines)


# -- a mixed group, aliases -------------------------------------------------------------------


def mixed_doc(native: FakeOpenAI, chat_only: FakeOpenAI) -> dict[str, Any]:
    """Model ``mixed`` on ``nat`` (tried first; ``native_apis`` on the provider) and ``chat``
    (a chat-only server, translated)."""

    def provider(pid: str, priority: int, **fields: Any) -> dict[str, Any]:
        return {"id": pid, "type": "openai_compat", "category": "api", "adapter": pid,
                "models": ["fake-model"], "priority": priority, **fields}  # fmt: skip

    return {
        "openai": {"listen": "127.0.0.1:0"},
        "models": [{"id": "mixed", "context_window_tokens": 4096, "providers": ["nat", "chat"]}],
        "nodes": [
            {
                "id": "n1",
                "adapters": [
                    {"name": "nat", "type": "openai_compat", "base_url": native.base_url},
                    {"name": "chat", "type": "openai_compat", "base_url": chat_only.base_url},
                ],
                "providers": [
                    provider("nat", 0, native_apis=["messages"]),
                    provider("chat", 1),
                ],
            }
        ],
    }


async def test_a_mixed_group_fails_over_from_native_to_translated_before_the_first_byte(
    log_stream: io.StringIO,
) -> None:
    async with (
        FakeOpenAI(behavior=FakeBehavior(status=503)) as native,
        FakeOpenAI(serves_messages=False) as chat_only,
        running_edge(mixed_doc(native, chat_only)) as edge,
        anthropic_client(edge, "unused") as c,
    ):
        whole = await c.messages.create(model="mixed", max_tokens=64, messages=HELLO)
        async with c.messages.stream(model="mixed", max_tokens=64, messages=HELLO) as stream:
            streamed = await stream.get_final_message()
        raw = await streamed_bytes(c, model="mixed", max_tokens=64, messages=HELLO)
    for message in (whole, streamed):
        assert message.model == "mixed"
        assert message.stop_reason == "end_turn"
        assert [b.type for b in message.content] == ["text"]
        assert message.content[0].text == "hello through the edge"  # type: ignore[union-attr]
    names = event_names(raw)  # one Message's stream: nothing of the failed attempt
    assert (names[0], names.count("message_start"), names[-1]) == (
        "message_start",
        1,
        "message_stop",
    )
    assert "error" not in names
    assert {r.path for r in native.requests} == {"/v1/messages"}
    assert [r.path for r in chat_only.requests] == ["/v1/chat/completions"] * 3
    lines = request_lines(log_stream)
    assert [(x["provider"], x["status"]) for x in lines] == [("chat", 200)] * 3
    assert lines[0]["attempts"] == 2
    assert lines[0]["failed_over"] == ["n1/nat: status_5xx"]


async def test_an_alias_names_the_answer_and_the_upstream_gets_the_target(
    up: FakeOpenAI, log_stream: io.StringIO
) -> None:
    async with running_edge(passthrough_doc(up)) as edge, anthropic_client(edge) as c:
        whole = await c.messages.create(model=SONNET, max_tokens=64, messages=HELLO)
        async with c.messages.stream(model=SONNET, max_tokens=64, messages=HELLO) as stream:
            final = await stream.get_final_message()
    assert whole.model == final.model == SONNET
    assert [r.json["model"] for r in up.requests] == ["fake-model", "fake-model"]
    assert [x["model"] for x in request_lines(log_stream)] == [SONNET, SONNET]


#: what only Anthropic (or an upstream that speaks Messages) can honour: a server tool and MCP
SERVER_TOOLS: Any = {
    "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
    "mcp_servers": [{"type": "url", "url": "https://mcp.example.com/sse", "name": "docs"}],
}


async def test_what_only_passthrough_can_honour_is_forwarded_untouched(up: FakeOpenAI) -> None:
    """A server tool and mcp_servers, which the translation refuses, go to a provider that
    speaks Messages as they came (the group has no other provider), and count there too."""
    body = {"model": "native", "max_tokens": 16, "messages": HELLO, **SERVER_TOOLS}
    async with running_edge(passthrough_doc(up)) as edge, anthropic_client(edge) as c:
        answer = await c.post("/v1/messages", body=body, cast_to=anthropic.types.Message)
        counted = await c.messages.count_tokens(
            model="native", messages=HELLO, extra_body=SERVER_TOOLS
        )
    whole, counting = up.requests
    assert answer.model == "native"
    assert whole.json == {**body, "model": "fake-model"}
    assert counting.path == "/v1/messages/count_tokens"
    assert counting.json["tools"] == SERVER_TOOLS["tools"]
    assert counted.input_tokens > 0


async def test_without_a_provider_that_speaks_messages_it_is_the_translations_400(
    fake_oa: FakeOpenAI,
) -> None:
    """The same body for a group of chat-only providers: the translation's refusal, naming the
    field, before admission (nothing reaches the upstream), for counting too."""
    doc = passthrough_doc(fake_oa)
    del doc["nodes"][0]["adapters"][0]["native_apis"]
    body = {"model": "native", "max_tokens": 16, "messages": HELLO, **SERVER_TOOLS}
    async with running_edge(doc) as edge, anthropic_client(edge) as c:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await c.post("/v1/messages", body=body, cast_to=anthropic.types.Message)
        with pytest.raises(anthropic.BadRequestError) as not_counted:
            await c.messages.count_tokens(model="native", messages=HELLO, extra_body=SERVER_TOOLS)
    for error in (refused.value, not_counted.value):
        assert isinstance(error.body, dict)
        assert error.body["error"]["message"].startswith("mcp_servers: ")
    assert not fake_oa.requests

"""The fake OpenAI-compatible upstream's native Anthropic Messages: the official ``anthropic``
SDK, pointed straight at it, is its client, so the SDK's own parser checks the fake's Message
and its event grammar."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest

from iop_edge.testing.fake_behavior import BEHAVIOR_HEADER, FakeBehavior
from iop_edge.testing.fake_messages import fake_signature
from iop_edge.testing.fake_openai import FakeOpenAI

ASK: dict[str, Any] = {
    "model": "fake-model",
    "max_tokens": 1024,
    "system": "Be brief.",
    "messages": [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": [{"type": "text", "text": "tell me three words"}]},
    ],
}
"""Input: 2 (system) + 2 + 2 + 4 = 10 words; the reply echoes the last user message."""

FRAME = re.compile(rb"event: ([a-z_]+)\ndata: (\{[^\n]*\})\n\n")


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(api_key="sk-upstream") as server:
        yield server


@pytest.fixture
async def client(fake: FakeOpenAI) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(
        base_url=fake.origin, api_key="sk-upstream", max_retries=0
    ) as sdk:
        yield sdk


async def post(fake: FakeOpenAI, path: str, body: object, **headers: str) -> tuple[int, bytes]:
    """POST ``body`` (JSON) to the fake with its key; the status and the raw body."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{fake.origin}{path}",
            data=orjson.dumps(body),
            headers={"x-api-key": "sk-upstream", **headers},
        ) as response,
    ):
        return response.status, await response.read()


async def test_a_message_echoes_the_last_user_text_with_its_usage(client, fake):
    message = await client.messages.create(**ASK)
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.model == "fake-model"
    assert message.id.startswith("msg_fake")
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [
        ("text", "tell me three words")
    ]
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (10, 4)
    sent = fake.requests[-1]
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    assert sent.json == ASK
    assert sent.headers["Authorization"] == "Bearer sk-upstream"  # (how this SDK sends a key)
    assert sent.headers["anthropic-version"] == client.default_headers["anthropic-version"]


SCRIPTED = FakeBehavior(
    reply="Let me look.",
    thinking="The user wants the weather.",
    tool_call='get_weather:{"city": "Paris", "unit": "celsius"}',
)


async def test_the_streamed_final_message_equals_the_non_streamed_one(client, fake):
    fake.behavior = SCRIPTED
    created = await client.messages.create(**ASK)
    async with client.messages.stream(**ASK) as stream:
        thoughts = [event.thinking async for event in stream if event.type == "thinking"]
        final = await stream.get_final_message()
    expected = created.to_dict(exclude_none=True)
    got = final.to_dict(exclude_none=True)
    assert got.pop("id") != expected.pop("id")  # (each answer has its own)
    assert got["content"][2].pop("id") != expected["content"][2].pop("id")
    assert got == expected
    assert thoughts == ["The ", "user ", "wants ", "the ", "weather."]
    thinking, text, tool = created.content
    assert thinking.type == "thinking"
    assert thinking.thinking == "The user wants the weather."
    assert thinking.signature == fake_signature("The user wants the weather.")
    assert (text.type, text.text) == ("text", "Let me look.")
    assert tool.type == "tool_use"
    assert (tool.name, tool.input) == ("get_weather", {"city": "Paris", "unit": "celsius"})
    assert created.stop_reason == "tool_use"
    # 5 thinking words + 3 text words + 5 pieces of the input's 36 characters
    assert (created.usage.input_tokens, created.usage.output_tokens) == (10, 13)


async def test_the_event_stream_is_anthropics_grammar_frame_by_frame(fake):
    fake.behavior = SCRIPTED
    status, raw = await post(fake, "/v1/messages", {**ASK, "stream": True})
    assert status == 200
    frames = FRAME.findall(raw)
    assert b"".join(b"event: %s\ndata: %s\n\n" % frame for frame in frames) == raw
    events = [(name.decode(), orjson.loads(data)) for name, data in frames]
    assert all(name == data["type"] for name, data in events)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert (start["content"], start["stop_reason"], start["usage"]) == (
        [],
        None,
        {"input_tokens": 10, "output_tokens": 1},
    )
    blocks = [
        (d["index"], d["content_block"]["type"]) for n, d in events if n == "content_block_start"
    ]
    assert blocks == [(0, "thinking"), (1, "text"), (2, "tool_use")]
    deltas = [(d["index"], d["delta"]["type"]) for n, d in events if n == "content_block_delta"]
    assert {kind for index, kind in deltas if index == 0} == {"thinking_delta", "signature_delta"}
    assert deltas[5] == (0, "signature_delta")  # after the five words of thinking
    assert {kind for index, kind in deltas if index == 2} == {"input_json_delta"}
    stops = [d["index"] for n, d in events if n == "content_block_stop"]
    assert stops == [0, 1, 2]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"] == {"output_tokens": 13}


async def test_stop_sequences_and_max_tokens_end_the_text_as_anthropic_says(client):
    ask = {**ASK, "messages": [{"role": "user", "content": "one two three four"}]}
    message = await client.messages.create(**ask, stop_sequences=["four", "three"])
    assert message.content[0].text == "one two "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "three")
    message = await client.messages.create(**{**ask, "max_tokens": 2})
    assert message.content[0].text == "one two "
    assert (message.stop_reason, message.stop_sequence) == ("max_tokens", None)
    assert message.usage.output_tokens == 2


async def test_count_tokens_counts_system_messages_and_tools(client, fake):
    tool = {"name": "get_weather", "input_schema": {"type": "object"}}
    counted = await client.messages.count_tokens(
        model="fake-model", system=ASK["system"], messages=ASK["messages"], tools=[tool]
    )
    assert counted.input_tokens == 11
    assert fake.requests[-1].path == "/v1/messages/count_tokens"


@pytest.mark.parametrize(
    ("status", "error_class", "kind"),
    [
        (400, anthropic.BadRequestError, "invalid_request_error"),
        (404, anthropic.NotFoundError, "not_found_error"),
        (429, anthropic.RateLimitError, "rate_limit_error"),
        (500, anthropic.InternalServerError, "api_error"),
        (529, anthropic.OverloadedError, "overloaded_error"),
    ],
)
async def test_an_error_status_is_in_anthropics_shape(client, fake, status, error_class, kind):
    fake.behavior = FakeBehavior(status=status, error_message="told to fail", retry_after="7")
    with pytest.raises(error_class) as info:
        await client.messages.create(**ASK)
    assert info.value.status_code == status
    assert info.value.body == {"type": "error", "error": {"type": kind, "message": "told to fail"}}
    assert info.value.response.headers["Retry-After"] == "7"
    with pytest.raises(error_class):
        await client.messages.count_tokens(model="fake-model", messages=ASK["messages"])


async def test_a_malformed_request_is_refused_in_anthropics_shape(fake):
    status, raw = await post(fake, "/v1/messages", {"model": "fake-model", "messages": []})
    assert status == 400
    assert orjson.loads(raw) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"x-api-key": "sk-upstream"}, 200),
        ({"x-api-key": "", "Authorization": "Bearer sk-upstream"}, 200),
        ({"x-api-key": "wrong"}, 401),
        ({"x-api-key": "", "Authorization": "Bearer wrong"}, 401),
    ],
)
async def test_the_key_is_taken_as_x_api_key_or_as_a_bearer_token(fake, headers, status):
    got, raw = await post(fake, "/v1/messages", ASK, **headers)
    assert got == status
    if status == 401:
        assert orjson.loads(raw)["error"]["type"] == "authentication_error"


async def test_an_error_event_mid_stream_makes_the_sdk_raise(client, fake):
    fake.behavior = FakeBehavior(fault="error", fault_after=4, error_message="Overloaded")
    async with client.messages.stream(**ASK) as stream:
        with pytest.raises(anthropic.APIStatusError) as info:
            await stream.get_final_message()
    assert info.value.body == {
        "type": "error",
        "error": {"type": "api_error", "message": "Overloaded"},
    }
    status, raw = await post(
        fake,
        "/v1/messages",
        {**ASK, "stream": True},
        **{BEHAVIOR_HEADER: "fault=error&fault_after=3&error_code=overloaded_error"},
    )
    assert status == 200  # (the error came after the head)
    names = [name for name, _ in FRAME.findall(raw)]
    assert names == [b"message_start", b"ping", b"content_block_start", b"error"]
    assert b'"type":"overloaded_error"' in raw


async def test_a_directive_scripts_a_tool_call_through_the_conversation(client):
    directive = FakeBehavior(tool_call='Read:{"file_path": "/a.py"}').directive()
    ask = {**ASK, "messages": [{"role": "user", "content": f"read it {directive}"}]}
    message = await client.messages.create(**ask)
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[0].text == "read it"
    assert message.content[1].input == {"file_path": "/a.py"}


def test_a_tool_call_must_name_a_tool_and_give_a_json_object():
    with pytest.raises(ValueError, match="has no tool name"):
        FakeBehavior(tool_call=":{}")
    with pytest.raises(ValueError, match="is not a JSON object"):
        FakeBehavior(tool_call="Read:[1]")
    with pytest.raises(ValueError, match="is not JSON"):
        FakeBehavior().with_overrides("tool_call=Read%3A%7Bnope")


async def test_a_chat_only_fake_answers_404_on_messages():
    async with (
        FakeOpenAI(serves_messages=False) as fake,
        anthropic.AsyncAnthropic(base_url=fake.origin, api_key="x", max_retries=0) as sdk,
    ):
        with pytest.raises(anthropic.NotFoundError):
            await sdk.messages.create(**ASK)
        with pytest.raises(anthropic.NotFoundError):
            await sdk.messages.count_tokens(model="fake-model", messages=ASK["messages"])

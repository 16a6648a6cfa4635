"""The fake OpenAI-compatible upstream's native OpenAI Responses: the official ``openai`` SDK,
pointed straight at it, is its client, so the SDK's own parser and stream accumulator check the
fake's Response objects and its event grammar."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from iop_edge.testing.fake_behavior import BEHAVIOR_HEADER, FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": False,
    }
]
ASK: dict[str, Any] = {
    "model": "fake-model",
    "instructions": "Be brief.",
    "input": [
        {"role": "user", "content": "first question"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "first answer"}],
        },
        {"role": "user", "content": [{"type": "input_text", "text": "tell me three words"}]},
    ],
    "tools": TOOLS,
}
"""Input: 2 (instructions) + 2 + 2 + 4 words + 1 tool = 11; the reply echoes the last user
message."""

SCRIPTED = FakeBehavior(
    reply="Let me look.",
    thinking="The user wants the weather.",
    tool_call='get_weather:{"city": "Paris", "unit": "celsius"}',
)
"""5 thinking words + 3 text words + 5 pieces of the 36 characters of the arguments."""

FRAME = re.compile(rb"event: ([a-z_.]+)\ndata: (\{[^\n]*\})\n\n")


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(api_key="sk-upstream") as server:
        yield server


@pytest.fixture
async def client(fake: FakeOpenAI) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=fake.base_url, api_key="sk-upstream", max_retries=0
    ) as sdk:
        yield sdk


async def post(fake: FakeOpenAI, body: object, **headers: str) -> tuple[int, bytes]:
    """POST ``body`` (JSON) to the fake's /v1/responses with its key; the status and body."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{fake.base_url}/responses",
            data=orjson.dumps(body),
            headers={"Authorization": "Bearer sk-upstream", **headers},
        ) as response,
    ):
        return response.status, await response.read()


def events_of(raw: bytes) -> list[tuple[str, Any]]:
    """The (name, data) of every frame of a raw stream, which must be nothing but frames."""
    frames = FRAME.findall(raw)
    assert b"".join(b"event: %s\ndata: %s\n\n" % frame for frame in frames) == raw
    return [(name.decode(), orjson.loads(data)) for name, data in frames]


async def test_a_response_echoes_the_last_user_text_with_its_usage(client, fake):
    response = await client.responses.create(**ASK)
    assert response.object == "response"
    assert response.id.startswith("resp_fake")
    assert (response.model, response.status) == ("fake-model", "completed")
    assert response.output_text == "tell me three words"
    [message] = response.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    assert response.usage is not None
    assert response.usage.to_dict() == {
        "input_tokens": 11,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 4,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }
    assert (response.instructions, response.tools[0].name) == ("Be brief.", "get_weather")
    sent = fake.requests[-1]
    assert (sent.method, sent.path) == ("POST", "/v1/responses")
    assert sent.json == ASK
    assert sent.headers["Authorization"] == "Bearer sk-upstream"


async def test_the_streamed_final_response_equals_the_non_streamed_one(client, fake):
    fake.behavior = SCRIPTED
    created = await client.responses.create(**ASK)
    async with client.responses.stream(**ASK) as stream:
        texts = [
            event.delta async for event in stream if event.type == "response.output_text.delta"
        ]
        final = await stream.get_final_response()
    expected = created.to_dict(exclude_none=True)
    got = final.to_dict(exclude_none=True)
    for item in (got, *got["output"]):
        item.pop("id")
    for item in (expected, *expected["output"]):
        item.pop("id")
    assert got["output"][2].pop("call_id") != expected["output"][2].pop("call_id")
    assert got.pop("created_at") >= expected.pop("created_at")
    assert got == expected
    assert texts == ["Let ", "me ", "look."]
    reasoning, message, call = created.output
    assert reasoning.type == "reasoning"
    assert [part.text for part in reasoning.content or []] == ["The user wants the weather."]
    assert message.type == "message"
    assert created.output_text == "Let me look."
    assert call.type == "function_call"
    assert (call.name, orjson.loads(call.arguments)) == (
        "get_weather",
        {"city": "Paris", "unit": "celsius"},
    )
    assert call.call_id.startswith("call_fake")
    assert created.usage is not None
    assert (created.usage.output_tokens, created.usage.output_tokens_details.reasoning_tokens) == (
        13,
        5,
    )


async def test_the_event_stream_is_openais_grammar_frame_by_frame(fake):
    fake.behavior = SCRIPTED
    status, raw = await post(fake, {**ASK, "stream": True})
    assert status == 200
    events = events_of(raw)
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    names = [name for name, _ in events]
    reasoning = [
        "response.output_item.added",
        "response.content_part.added",
        *["response.reasoning_text.delta"] * 5,
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    message = [
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    call = [
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * 5,
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert names == [
        "response.created",
        "response.in_progress",
        *reasoning,
        *message,
        *call,
        "response.completed",
    ]
    created = events[0][1]["response"]
    assert (created["status"], created["output"], created["usage"]) == ("in_progress", [], None)
    items = [data for name, data in events if name.startswith("response.output_item.")]
    assert [(d["output_index"], d["item"]["type"]) for d in items] == [
        (0, "reasoning"),
        (0, "reasoning"),
        (1, "message"),
        (1, "message"),
        (2, "function_call"),
        (2, "function_call"),
    ]
    assert (items[2]["item"]["content"], items[2]["item"]["status"]) == ([], "in_progress")
    arguments = [d["delta"] for n, d in events if n == "response.function_call_arguments.delta"]
    assert "".join(arguments) == '{"city": "Paris", "unit": "celsius"}'
    assert all(len(piece) <= 8 for piece in arguments)
    ids = {d["item_id"] for n, d in events if n == "response.function_call_arguments.delta"}
    assert ids == {items[4]["item"]["id"]}
    completed = events[-1][1]["response"]
    assert completed["status"] == "completed"
    assert completed["output"] == [
        d["item"] for n, d in events if n.endswith(".done") and "item" in d
    ]
    assert completed["usage"]["output_tokens"] == 13


async def test_a_reasoning_summary_is_streamed_when_the_request_asks_for_one(client, fake):
    fake.behavior = FakeBehavior(thinking="Think it over.")
    ask = {**ASK, "reasoning": {"effort": "low", "summary": "auto"}}
    async with client.responses.stream(**ask) as stream:
        summary = [
            event.delta
            async for event in stream
            if event.type == "response.reasoning_summary_text.delta"
        ]
        final = await stream.get_final_response()
    assert summary == ["Think ", "it ", "over."]
    reasoning = final.output[0]
    assert reasoning.type == "reasoning"
    assert [(s.type, s.text) for s in reasoning.summary] == [("summary_text", "Think it over.")]
    assert reasoning.content is None
    assert final.reasoning is not None
    assert (final.reasoning.effort, final.reasoning.summary) == ("low", "auto")


async def test_max_output_tokens_ends_the_text_as_incomplete(client, fake):
    fake.behavior = FakeBehavior(tool_call="get_weather")  # (not called once the text is cut)
    response = await client.responses.create(**{**ASK, "max_output_tokens": 2})
    assert (response.status, response.output_text) == ("incomplete", "tell me ")
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert [(item.type, item.status) for item in response.output] == [("message", "incomplete")]
    status, raw = await post(fake, {**ASK, "max_output_tokens": 2, "stream": True})
    assert status == 200
    name, last = events_of(raw)[-1]
    assert name == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["usage"]["output_tokens"] == 2


@pytest.mark.parametrize(
    ("status", "error_class", "kind"),
    [
        (400, openai.BadRequestError, "invalid_request_error"),
        (404, openai.NotFoundError, "invalid_request_error"),
        (429, openai.RateLimitError, "rate_limit_error"),
        (500, openai.InternalServerError, "server_error"),
    ],
)
async def test_an_error_status_is_an_openai_envelope(client, fake, status, error_class, kind):
    fake.behavior = FakeBehavior(
        status=status, error_message="told to fail", error_code="fake_code", retry_after="7"
    )
    with pytest.raises(error_class) as info:
        await client.responses.create(**ASK)
    assert info.value.status_code == status
    assert info.value.body == {
        "message": "told to fail",
        "type": kind,
        "param": None,
        "code": "fake_code",
    }
    assert info.value.response.headers["Retry-After"] == "7"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "fake-model"}, "input"),
        ({"model": "fake-model", "input": []}, "input"),
        ({"input": "hello"}, "model"),
    ],
)
async def test_a_malformed_request_is_refused_in_the_envelope(fake, body, param):
    status, raw = await post(fake, body)
    assert status == 400
    assert orjson.loads(raw)["error"] == {
        "message": f"Missing required parameter: '{param}'.",
        "type": "invalid_request_error",
        "param": param,
        "code": "missing_required_parameter",
    }


async def test_a_wrong_key_is_refused(fake):
    status, raw = await post(fake, ASK, Authorization="Bearer wrong")
    assert status == 401
    assert orjson.loads(raw)["error"]["code"] == "invalid_api_key"


async def test_an_error_fault_mid_stream_is_a_response_failed_event(client, fake):
    fake.behavior = FakeBehavior(
        fault="error", fault_after=4, error_code="rate_limit_exceeded", error_message="Slow down"
    )
    async with client.responses.stream(**ASK) as stream:
        seen = [event async for event in stream]
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            await stream.get_final_response()
    assert [event.type for event in seen] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.failed",
    ]
    failed = seen[-1]
    assert failed.type == "response.failed"
    assert failed.sequence_number == 4
    assert failed.response.status == "failed"
    assert failed.response.error is not None
    assert (failed.response.error.code, failed.response.error.message) == (
        "rate_limit_exceeded",
        "Slow down",
    )
    with pytest.raises(openai.InternalServerError):
        await client.responses.create(**ASK)  # (not streamed: a 500 instead)


async def test_a_malformed_fault_breaks_an_events_json(fake):
    status, raw = await post(
        fake, {**ASK, "stream": True}, **{BEHAVIOR_HEADER: "fault=malformed&fault_after=2"}
    )
    assert status == 200
    assert raw.endswith(
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",\n\n'
    )
    assert [name for name, _ in FRAME.findall(raw)] == [
        b"response.created",
        b"response.in_progress",
    ]


async def test_a_held_request_counts_in_flight_until_release(client, fake):
    fake.behavior = FakeBehavior(hold=True)
    task = asyncio.create_task(client.responses.create(**ASK))
    async with asyncio.timeout(5):
        await fake.wait_in_flight(1)
    assert (fake.in_flight, fake.completed) == (1, 0)
    fake.release()
    response = await task
    assert response.output_text == "tell me three words"
    assert (fake.in_flight, fake.completed) == (0, 1)


async def test_a_function_call_round_trip_through_a_directive(client, fake):
    directive = FakeBehavior(tool_call='get_weather:{"city": "Oslo"}').directive()
    first = await client.responses.create(
        model="fake-model", input=f"weather in Oslo {directive}", tools=TOOLS
    )
    assert [item.type for item in first.output] == ["message", "function_call"]
    assert first.output_text == "weather in Oslo"
    call = first.output[1]
    assert call.type == "function_call"
    second = await client.responses.create(
        model="fake-model",
        input=[
            {"role": "user", "content": "weather in Oslo"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny and mild"},
        ],
        tools=TOOLS,
        previous_response_id=first.id,
    )
    assert second.previous_response_id == first.id
    assert second.output_text == "weather in Oslo"  # (the last user message, echoed)
    assert second.usage is not None
    assert second.usage.input_tokens == 3 + 3 + 1  # message + function_call_output + tool


async def test_a_fake_without_responses_answers_404():
    async with (
        FakeOpenAI(serves_responses=False) as fake,
        openai.AsyncOpenAI(base_url=fake.base_url, api_key="x", max_retries=0) as sdk,
    ):
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.create(model="fake-model", input="hello")
        assert fake.total_requests == 0

"""The Responses translation read by the official ``openai`` SDK itself, over real HTTP.

A tiny server on 127.0.0.1 (:class:`~tests.helpers.canned_server.CannedServer`) answers with
the bytes the translation renders — a Response as JSON, a Responses event stream as
``text/event-stream`` — and the SDK parses them as it parses OpenAI's API:
``client.responses.stream(...).get_final_response()`` must equal ``client.responses.create(...)``,
tool-call arguments and reasoning must stream as the SDK's events, and a failure after the first
event must not give a final response. The server keeps what the SDK sends, so the request
translation is checked on the SDK's own serialisation — of its own output items sent back, of a
structured-output request, of Codex's request shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest
from pydantic import BaseModel

from iop_edge.translate.chat_events import decode_completion
from iop_edge.translate.responses_reply import response_body
from iop_edge.translate.responses_request import translate_responses
from iop_edge.translate.responses_stream import ResponsesStreamTranslator
from tests.helpers import codex
from tests.helpers.canned_server import CannedServer
from tests.helpers.responses import without_parsed
from tests.helpers.translate import Call, Plan, completion, frames

MODEL = "qwen3-coder"
ASK: dict[str, Any] = {"model": MODEL, "input": "Hello", "instructions": "Be brief."}
USAGE = {"prompt_tokens": 20, "completion_tokens": 8}
PLANS = {
    "plain text": Plan((("text", "Hello"), ("text", ", world"), ("text", "!")), usage=USAGE),
    "reasoning then text": Plan(
        (("reasoning", "The user greets. "), ("reasoning", "Greet back."), ("text", "Hi!")),
        usage={**USAGE, "completion_tokens_details": {"reasoning_tokens": 5}},
    ),
    "text then a call with arguments over many chunks": Plan(
        (
            ("text", "Let me look."),
            Call("call_abc", "get_weather", ('{"ci', 'ty": "Pa', 'ris", "unit', '": "C"}')),
        ),
        finish="tool_calls",
        usage=USAGE,
    ),
    "two calls, one without an upstream id": Plan(
        (
            Call("call_1", "get_weather", ('{"city":', ' "Rome"}')),
            Call("", "get_time", ('{"tz": "CET"}',)),
        ),
        finish="tool_calls",
        usage={**USAGE, "prompt_tokens_details": {"cached_tokens": 12}},
    ),
    "no usage reported": Plan((("text", "estimated"),)),
}


def fields(request: dict[str, Any]) -> dict[str, Any]:
    """The renderers' keywords for the translation of ``request``."""
    translated = translate_responses(request)
    return {
        "response_id": "resp_sdk1",
        "created_at": 1_700_000_000,
        "model": translated.internal.model,
        "echo": translated.echo,
        "estimated_input_tokens": 9,
        "include": translated.include,
    }


def streamed_bytes(plan: Plan, request: dict[str, Any] = ASK) -> bytes:
    translator = ResponsesStreamTranslator(**fields(request))
    raw = frames(plan)
    out = b"".join(translator.feed(raw[i : i + 7]) for i in range(0, len(raw), 7))
    return out + translator.end()


def whole_bytes(plan: Plan, request: dict[str, Any] = ASK) -> bytes:
    answer = decode_completion(orjson.dumps(completion(plan)))
    return response_body(answer, **fields(request))


@pytest.fixture
def server() -> Iterator[CannedServer]:
    canned = CannedServer()
    yield canned
    canned.close()


@pytest.fixture
def client(server: CannedServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as sdk:
        yield sdk


def serve_stream(server: CannedServer, body: bytes) -> None:
    server.answer(body, content_type="text/event-stream")


@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
def test_the_sdks_final_streamed_response_equals_the_non_streamed_response(server, client, plan):
    server.answer(whole_bytes(plan))
    created = client.responses.create(**ASK)
    serve_stream(server, streamed_bytes(plan))
    with client.responses.stream(**ASK) as stream:
        final = stream.get_final_response()
    # (the stream's final response is parsed: the SDK adds parsed and parsed_arguments)
    assert without_parsed(final.model_dump()) == created.model_dump()
    assert (created.id, created.model, created.status, created.instructions) == (
        "resp_sdk1",
        MODEL,
        "completed",
        "Be brief.",
    )


def test_what_the_sdk_reads_is_what_the_upstream_said(server, client):
    serve_stream(server, streamed_bytes(PLANS["text then a call with arguments over many chunks"]))
    with client.responses.stream(**ASK) as stream:
        snapshots = [
            e.snapshot for e in stream if e.type == "response.function_call_arguments.delta"
        ]
        final = stream.get_final_response()
    # (the SDK adds the argument deltas up as they come)
    assert snapshots == [
        '{"ci',
        '{"city": "Pa',
        '{"city": "Paris", "unit',
        '{"city": "Paris", "unit": "C"}',
    ]
    assert final.output_text == "Let me look."
    message, call = final.output
    assert message.type == "message"
    assert call.type == "function_call"
    assert (call.call_id, call.name, call.arguments) == (
        "call_abc",
        "get_weather",
        '{"city": "Paris", "unit": "C"}',
    )
    assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.total_tokens) == (
        20,
        8,
        28,
    )

    serve_stream(server, streamed_bytes(PLANS["two calls, one without an upstream id"]))
    with client.responses.stream(**ASK) as stream:
        final = stream.get_final_response()
    assert [(c.call_id, c.name) for c in final.output if c.type == "function_call"] == [
        ("call_1", "get_weather"),
        ("call_sdk1_1", "get_time"),
    ]
    assert final.usage.input_tokens_details.cached_tokens == 12

    serve_stream(server, streamed_bytes(PLANS["reasoning then text"]))
    with client.responses.stream(**ASK) as stream:
        thinking = [e.delta for e in stream if e.type == "response.reasoning_text.delta"]
        final = stream.get_final_response()
    assert thinking == ["The user greets. ", "Greet back."]
    reasoning = final.output[0]
    assert reasoning.type == "reasoning"
    assert reasoning.content is not None
    assert [part.text for part in reasoning.content] == ["The user greets. Greet back."]
    assert final.output_text == "Hi!"
    assert final.usage.output_tokens_details.reasoning_tokens == 5


def test_a_cut_answer_is_incomplete_for_the_sdk_streamed_or_not(server, client):
    plan = Plan((("text", "This answer is cu"),), finish="length", usage=USAGE)
    server.answer(whole_bytes(plan))
    created = client.responses.create(**ASK)
    assert created.status == "incomplete"
    assert created.incomplete_details is not None
    assert created.incomplete_details.reason == "max_output_tokens"
    serve_stream(server, streamed_bytes(plan))
    with client.responses.stream(**ASK) as stream:
        last = list(stream)[-1]
        assert last.type == "response.incomplete"
        assert without_parsed(last.response.model_dump()) == created.model_dump()
        # (as with OpenAI: the SDK's final response is a completed one's)
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            stream.get_final_response()


def test_a_failure_after_the_first_event_gives_the_sdk_no_final_response(server, client):
    translator = ResponsesStreamTranslator(**fields(ASK))
    raw = frames(PLANS["plain text"])
    body = translator.feed(raw[: raw.index(b"\n\n", raw.index(b", world")) + 2])
    body += translator.fail("upstream_error", "The provider 'gpu-1' failed.")
    serve_stream(server, body)
    seen: list[str] = []
    with client.responses.stream(**ASK) as stream:
        for event in stream:
            seen.append(event.type)
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            stream.get_final_response()
    assert "response.output_text.delta" in seen
    assert seen[-1] == "response.failed"
    assert "response.completed" not in seen

    serve_stream(server, body)
    events = list(client.responses.create(**ASK, stream=True))
    failed = events[-1]
    assert failed.type == "response.failed"
    assert failed.response.status == "failed"
    assert failed.response.error is not None
    assert (failed.response.error.code, failed.response.error.message) == (
        "server_error",
        "The provider 'gpu-1' failed.",
    )
    assert failed.response.output_text == "Hello, world"


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}


def test_a_function_calling_round_trip_with_the_sdks_own_items(server, client):
    """The client sends the Response's output items back, then the call's output: the next
    request translates into the assistant's call and the tool's result."""
    plan = PLANS["text then a call with arguments over many chunks"]
    ask = {**ASK, "input": "Weather in Paris?", "tools": [WEATHER_TOOL]}
    server.answer(whole_bytes(plan, ask))
    first = client.responses.create(**ask)
    call = first.output[-1]
    assert call.type == "function_call"
    server.answer(whole_bytes(PLANS["plain text"], ask))
    follow_up = [
        {"role": "user", "content": "Weather in Paris?"},
        *first.output,
        {"type": "function_call_output", "call_id": call.call_id, "output": "18C, sunny"},
    ]
    client.responses.create(**{**ask, "input": follow_up})
    chat = translate_responses(server.requests[-1]).internal.chat
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "unit": "C"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": "18C, sunny"},
    ]
    assert chat["tools"][0]["function"]["strict"] is True


def test_reasoning_sent_back_by_the_sdk_reaches_the_upstream_again(server, client):
    ask = {**ASK, "include": ["reasoning.encrypted_content"], "store": False}
    server.answer(whole_bytes(PLANS["reasoning then text"], ask))
    first = client.responses.create(**ask)
    assert first.output[0].type == "reasoning"
    assert first.output[0].encrypted_content is not None
    server.answer(whole_bytes(PLANS["plain text"], ask))
    client.responses.create(
        **{**ask, "input": [*first.output, {"role": "user", "content": "And?"}]}
    )
    messages = translate_responses(server.requests[-1]).internal.chat["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": "Hi!",
        "reasoning_content": "The user greets. Greet back.",
    }


class Weather(BaseModel):
    city: str
    celsius: int


def test_structured_output_through_the_sdks_parse(server, client):
    plan = Plan((("text", '{"city": "Paris", "celsius": 18}'),), usage=USAGE)
    server.answer(whole_bytes(plan))
    parsed = client.responses.parse(**ASK, text_format=Weather)
    assert parsed.output_parsed == Weather(city="Paris", celsius=18)
    response_format = translate_responses(server.requests[-1]).internal.chat["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "Weather"
    assert response_format["json_schema"]["strict"] is True
    assert response_format["json_schema"]["schema"]["required"] == ["city", "celsius"]


def test_codexs_request_as_the_sdk_sends_it_translates_as_codexs_own(server, client):
    request = codex.turn_with_history()
    serve_stream(server, streamed_bytes(PLANS["plain text"]))
    with client.responses.stream(**{k: v for k, v in request.items() if k != "stream"}) as stream:
        assert stream.get_final_response().output_text == "Hello, world!"
    sent = server.requests[-1]
    assert sent["stream"] is True
    assert translate_responses(sent) == translate_responses(request)

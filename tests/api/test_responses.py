"""``POST /v1/responses`` translated, with the official ``openai`` SDK against a running edge:
each adapter type streamed and not (the stream's final response is the whole one), the model
asked for (an alias too), usage, structured output, the reasoning effort, the errors in
OpenAI's envelope, an answer cut by ``max_output_tokens``, and a failure after the first event
(``response.failed``, never ``response.completed``; nothing stored)."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import wait_for
from tests.helpers.api import edge_client, edge_doc, request_lines
from tests.helpers.responses import check_responses_grammar, read_events, without_parsed

ASK = "hello through the edge"
LONG = " ".join(f"w{i}" for i in range(20))


def without_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items without their ``id`` (made from the response's id: each answer its own)."""
    return [{k: v for k, v in item.items() if k != "id"} for item in items]


def item_ids_follow(response: Any) -> bool:
    """Whether the items' ids are ``<prefix>_<the response id's core>_<output index>``."""
    core = response.id.removeprefix("resp_")
    prefixes = {"reasoning": "rs", "message": "msg", "function_call": "fc"}
    return all(
        item.id == f"{prefixes[item.type]}_{core}_{index}"
        for index, item in enumerate(response.output)
    )


async def raw_stream(client: openai.AsyncOpenAI, **fields: Any) -> bytes:
    """The bytes of a streamed response, read through the SDK."""
    async with client.responses.with_streaming_response.create(**fields, stream=True) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        return b"".join([chunk async for chunk in answer.iter_bytes()])


async def final_of(client: openai.AsyncOpenAI, **fields: Any) -> Any:
    """The SDK's final response of a streamed request."""
    async with client.responses.stream(**fields) as stream:
        return await stream.get_final_response()


async def last_event(client: openai.AsyncOpenAI, **fields: Any) -> Any:
    """The last event the SDK reads from a streamed request (its final response is only that
    of ``response.completed``)."""
    async with client.responses.stream(**fields) as stream:
        events = [event async for event in stream]
    return events[-1]


# -- each adapter type ------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["chat-oa", "chat-ol", "chat-cli"])
async def test_a_response_through_each_adapter_type_streamed_equals_the_whole_one(
    model: str, fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """The stream's final response is the whole response but for the ids (each response has
    its own, and its items' are made from it); the stream follows Responses' grammar."""
    async with edge_client(edge_doc(fake_oa, fake_ol)) as (_, c):
        whole = await c.responses.create(model=model, input=ASK)
        streamed = await final_of(c, model=model, input=ASK)
        raw = await raw_stream(c, model=model, input=ASK)
    dumped, final = whole.model_dump(), without_parsed(streamed.model_dump())
    assert without_ids(final.pop("output")) == without_ids(dumped.pop("output"))
    for response in (dumped, final):
        del response["id"], response["created_at"]
    assert final == dumped
    assert whole.model == streamed.model == model
    assert whole.status == streamed.status == "completed"
    assert whole.object == "response"
    assert whole.id.startswith("resp_")
    assert streamed.id.startswith("resp_")
    assert whole.id != streamed.id
    assert item_ids_follow(whole)
    assert item_ids_follow(streamed)
    assert [item.type for item in whole.output] == ["message"]
    assert "hello" in whole.output_text
    assert whole.usage is not None
    assert whole.usage.output_tokens > 0
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    events = read_events(raw)
    check_responses_grammar(events)
    assert events[-1][0] == "response.completed"


async def test_the_usage_is_the_upstreams_and_the_model_the_alias_asked_for(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """chat-oa's alias: the answer names the alias; the upstream gets its own model. The fake
    counts 4 words in, 4 chunks out; ``min_max_tokens`` 8 raises a ``max_output_tokens`` of 2
    (the reply of 4 words is then whole)."""
    doc = edge_doc(fake_oa, fake_ol)
    doc["models"][0]["aliases"] = ["gpt-5-codex"]
    async with edge_client(doc) as (_, c):
        whole = await c.responses.create(model="gpt-5-codex", input=ASK, max_output_tokens=2)
        sent = fake_oa.requests[-1].json
        streamed = await final_of(c, model="gpt-5-codex", input=ASK)
        streamed_sent = fake_oa.requests[-1].json
    assert whole.model == streamed.model == "gpt-5-codex"
    assert sent["model"] == "fake-model"
    assert sent["max_tokens"] == 8
    assert "max_output_tokens" not in sent
    assert streamed_sent["stream_options"] == {"include_usage": True}
    assert streamed_sent["max_tokens"] == 64  # the group's default_max_tokens
    for response in (whole, streamed):
        assert response.status == "completed"
        assert response.output_text == ASK
        assert response.usage is not None
        assert (response.usage.input_tokens, response.usage.output_tokens) == (4, 4)
        assert response.usage.total_tokens == 8
        assert response.usage.input_tokens_details.cached_tokens == 0
        assert response.usage.output_tokens_details.reasoning_tokens == 0
    assert whole.max_output_tokens == 2  # echoed as the client sent it


async def test_instructions_and_metadata_are_echoed_and_instructions_go_first(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with edge_client(edge_doc(fake_oa, fake_ol)) as (_, c):
        whole = await c.responses.create(
            model="chat-oa",
            input=ASK,
            instructions="Be brief.",
            metadata={"ticket": "T-1"},
            temperature=0.5,
            user="u-42",
        )
    sent = fake_oa.requests[-1].json
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": ASK},
    ]
    assert (sent["temperature"], sent["user"]) == (0.5, "u-42")
    assert "metadata" not in sent
    assert (whole.instructions, whole.metadata, whole.temperature) == (
        "Be brief.",
        {"ticket": "T-1"},
        0.5,
    )


# -- structured output, reasoning effort ------------------------------------------------------


class Answer(BaseModel):
    """The structured output of the tests: ``{"a": <int>}``."""

    a: int


SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}},
    "required": ["a"],
    "additionalProperties": False,
}


async def test_a_json_schema_format_is_the_upstreams_response_format_and_parse_reads_it(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    fake_oa.behavior = FakeBehavior(reply='{"a": 1}')
    text: Any = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}}
    async with edge_client(edge_doc(fake_oa, fake_ol)) as (_, c):
        whole = await c.responses.create(model="chat-oa", input=ASK, text=text)
        sent = fake_oa.requests[-1].json
        parsed = await c.responses.parse(model="chat-oa", input=ASK, text_format=Answer)
        parsed_sent = fake_oa.requests[-1].json
        async with c.responses.stream(model="chat-oa", input=ASK, text_format=Answer) as stream:
            streamed = await stream.get_final_response()
        await c.responses.create(
            model="chat-oa", input=ASK, text={"format": {"type": "json_object"}}
        )
        object_sent = fake_oa.requests[-1].json
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": SCHEMA},
    }
    assert whole.output_text == '{"a": 1}'
    assert whole.text is not None
    assert whole.text.format is not None
    assert whole.text.format.type == "json_schema"
    assert parsed.output_parsed == Answer(a=1)
    assert streamed.output_parsed == Answer(a=1)
    schema = parsed_sent["response_format"]["json_schema"]
    assert (schema["name"], schema["strict"]) == ("Answer", True)
    assert schema["schema"]["properties"] == {"a": {"title": "A", "type": "integer"}}
    assert object_sent["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize(
    ("effort", "sent", "think"),
    [("low", "low", "low"), ("high", "high", "high"), ("minimal", "minimal", "low")],
)
async def test_reasoning_effort_is_reasoning_effort_and_ollamas_think(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, effort: Any, sent: str, think: str
) -> None:
    async with edge_client(edge_doc(fake_oa, fake_ol)) as (_, c):
        whole = await c.responses.create(model="chat-oa", input=ASK, reasoning={"effort": effort})
        await c.responses.create(model="chat-ol", input=ASK, reasoning={"effort": effort})
    assert fake_oa.requests[-1].json["reasoning_effort"] == sent
    assert fake_ol.requests[-1].json["think"] == think
    assert whole.reasoning is not None
    assert whole.reasoning.effort == effort


# -- errors -----------------------------------------------------------------------------------


async def test_every_refusal_is_an_openai_error(fake_oa: FakeOpenAI, fake_ol: FakeOllama) -> None:
    async with edge_client(edge_doc(fake_oa, fake_ol)) as (edge, c):
        with pytest.raises(openai.BadRequestError) as built_in:
            await c.responses.create(
                model="chat-oa",
                input=ASK,
                tools=[
                    {"type": "function", "name": "f", "parameters": {}, "strict": False},
                    {"type": "web_search"},
                ],
            )
        with pytest.raises(openai.NotFoundError) as unknown:
            await c.responses.create(model="no-such-model", input=ASK)
        with pytest.raises(openai.BadRequestError) as background:
            await c.responses.create(model="chat-oa", input=ASK, background=True)
        async with openai.AsyncOpenAI(
            base_url=edge.openai_url, api_key="iop_wrong-token", max_retries=0
        ) as stranger:
            with pytest.raises(openai.AuthenticationError) as denied:
                await stranger.responses.create(model="chat-oa", input=ASK)
    assert fake_oa.total_requests == 0
    assert built_in.value.param == "tools[1].type"
    assert "'web_search'" in built_in.value.message
    assert "built-in tool" in built_in.value.message
    assert built_in.value.type == "invalid_request_error"
    assert unknown.value.code == "model_not_found"
    assert "no-such-model" in unknown.value.message
    assert background.value.param == "background"
    assert denied.value.status_code == 401


async def test_a_full_queue_is_429_with_retry_after(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    fake_oa.behavior = FakeBehavior(hold=True)
    async with edge_client(edge_doc(fake_oa, fake_ol, capacity=1)) as (edge, c):
        calls = [
            asyncio.create_task(c.responses.create(model="chat-oa", input=ASK)) for _ in range(3)
        ]  # one in flight, two queued (max_queue 2)
        await fake_oa.wait_in_flight(1)
        await wait_for(lambda: edge.scheduler.statistics().queue_depth == 2)
        with pytest.raises(openai.RateLimitError) as info:
            await c.responses.create(model="chat-oa", input=ASK)
        fake_oa.release()
        fake_oa.behavior = FakeBehavior()
        answers = await asyncio.gather(*calls)
    assert info.value.code == "queue_full"
    assert info.value.response.headers["Retry-After"] == "1"
    assert [a.output_text for a in answers] == [ASK] * 3


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, openai.BadRequestError),
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
    ],
)
async def test_an_upstream_error_status_is_relayed_with_its_wording(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, status: int, error_class: type[Exception]
) -> None:
    fake_oa.behavior = FakeBehavior(status=status, error_message="prompt is too long")
    async with edge_client(edge_doc(fake_oa, fake_ol)) as (_, c):
        with pytest.raises(error_class) as whole:
            await c.responses.create(model="chat-oa", input=ASK)
        with pytest.raises(error_class) as streamed:
            await final_of(c, model="chat-oa", input=ASK)
    for info in (whole, streamed):
        assert isinstance(info.value, openai.APIStatusError)
        assert info.value.status_code == status
        assert "prompt is too long" in info.value.message


async def test_an_answer_cut_by_max_output_tokens_is_incomplete(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """The fake stops at ``max_tokens`` chunks (finish ``length``): the Response is
    ``incomplete`` for ``max_output_tokens``, its message too; the stream ends with
    ``response.incomplete``."""
    async with edge_client(edge_doc(fake_oa, fake_ol)) as (_, c):
        whole = await c.responses.create(model="chat-oa", input=LONG, max_output_tokens=8)
        raw = await raw_stream(c, model="chat-oa", input=LONG, max_output_tokens=8)
        last = await last_event(c, model="chat-oa", input=LONG, max_output_tokens=8)
    assert last.type == "response.incomplete"
    for response in (whole, last.response):
        assert response.status == "incomplete"
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
        assert response.output_text == "w0 w1 w2 w3 w4 w5 w6 w7 "
        assert [item.status for item in response.output] == ["incomplete"]  # type: ignore[union-attr]
    events = read_events(raw)
    check_responses_grammar(events)
    assert events[-1][0] == "response.incomplete"
    assert "response.completed" not in [name for name, _ in events]
    assert events[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


# -- failure after the first event ------------------------------------------------------------


async def test_a_failure_after_the_first_event_is_response_failed_and_nothing_is_stored(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, log_stream: io.StringIO
) -> None:
    """The upstream resets the connection after 3 frames: the stream's last event is
    ``response.failed`` (its Response ``failed`` with an error, its output the text so far),
    never ``response.completed``; the SDK gives no final response (its last event is
    ``response.failed``); the request line says ``upstream_error``; and the response is not
    stored."""
    fake_oa.behavior = FakeBehavior(fault="reset", fault_after=3)
    async with edge_client(edge_doc(fake_oa, fake_ol)) as (_, c):
        raw = await raw_stream(c, model="chat-oa", input=ASK)
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            await final_of(c, model="chat-oa", input=ASK)
        last = await last_event(c, model="chat-oa", input=ASK)
        events = read_events(raw)
        failed = events[-1][1]["response"]
        with pytest.raises(openai.NotFoundError) as info:
            await c.responses.retrieve(failed["id"])
    names = [name for name, _ in events]
    check_responses_grammar(events)
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == "response.failed"
    assert "response.completed" not in names
    assert names.count("response.failed") == 1
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "server_error"
    assert "provider 'up'" in failed["error"]["message"]
    assert failed["output"][0]["status"] == "incomplete"
    assert last.type == "response.failed"
    assert last.response.status == "failed"
    assert info.value.code == "response_not_found"
    lines = request_lines(log_stream)
    assert len(lines) == 4  # (the three streams, then the GET)
    for line in lines[:3]:
        assert (line["status"], line["code"], line["model"]) == (200, "upstream_error", "chat-oa")
        assert line["stream"] is True

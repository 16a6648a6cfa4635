"""``/v1/responses`` passed through to a provider that serves OpenAI Responses itself
(``native_apis: [responses]``), with the official ``openai`` SDK against a running edge.

The answers are compared byte for byte with what a second fake (the *reference*, fresh like the
upstream, so its ids run alike) answers the same body directly: the edge may change only the
Response's ``model`` (and the fakes' ``created_at`` is their clock's second, taken from the
edge's answer). What reached the upstream is read from the fake's record. The stored responses
work across the two ways: a conversation started on a passthrough provider continues on a
translated one, and the other way round."""

from __future__ import annotations

import io
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers.api import TOKEN, request_lines, running_edge, token_entry
from tests.helpers.responses import read_events, without_parsed

ASK = "hello through the edge"
CODEX = "gpt-5-codex"
#: a behaviour whose answer has every kind of item (reasoning, message, function_call)
RICH = FakeBehavior(thinking="Think first.", tool_call='get_weather:{"city": "Paris"}')
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}
_CREATED_AT = re.compile(rb'"created_at":(\d+)')


def passthrough_doc(up: FakeOpenAI) -> dict[str, Any]:
    """Model ``native`` (alias :data:`CODEX`; ``min_max_tokens`` 8) on provider ``nat``, whose
    adapter declares ``native_apis: [responses]``, and model ``chat`` on provider ``tr``: the
    same upstream through an adapter without it (translated). The client's token is
    :data:`TOKEN`."""

    def provider(pid: str) -> dict[str, Any]:
        return {"id": pid, "type": "openai_compat", "category": "local_inference",
                "adapter": pid, "models": ["fake-model"]}  # fmt: skip

    return {
        "openai": {"listen": "127.0.0.1:0", "principal_tokens": [token_entry("app", TOKEN)]},
        "models": [
            {
                "id": "native",
                "aliases": [CODEX],
                "context_window_tokens": 200_000,
                "providers": ["nat"],
                "min_max_tokens": 8,
            },
            {"id": "chat", "context_window_tokens": 200_000, "providers": ["tr"]},
        ],
        "nodes": [
            {
                "id": "n1",
                "adapters": [
                    {
                        "name": "nat",
                        "type": "openai_compat",
                        "base_url": up.base_url,
                        "native_apis": ["responses"],
                    },
                    {"name": "tr", "type": "openai_compat", "base_url": up.base_url},
                ],
                "providers": [provider("nat"), provider("tr")],
            }
        ],
    }


async def direct(fake: FakeOpenAI, body: dict[str, Any]) -> tuple[int, bytes]:
    """The status and the bytes ``fake`` answers ``body`` with, POSTed to it directly."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{fake.base_url}/responses", json=body) as response,
    ):
        return response.status, await response.read()


def as_relayed(expected: bytes, got: bytes, model: str) -> bytes:
    """The reference's bytes as the edge should relay them: the Response's ``model`` the one
    the client asked for, and ``created_at`` (the fakes' wall-clock second) the answer's."""
    stamps = set(_CREATED_AT.findall(got))
    assert len(stamps) == 1, f"the answer has created_at values {stamps}"
    [stamp] = stamps
    assert time.time() - 60 < int(stamp) <= time.time()
    return _CREATED_AT.sub(b'"created_at":' + stamp, expected).replace(
        b'"model":"fake-model"', b'"model":' + orjson.dumps(model)
    )


async def streamed_bytes(client: openai.AsyncOpenAI, **fields: Any) -> bytes:
    """The raw bytes of a streamed answer, read through the SDK."""
    async with client.responses.with_streaming_response.create(**fields, stream=True) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        return b"".join([chunk async for chunk in answer.iter_bytes()])


async def ask(client: openai.AsyncOpenAI, stream: bool) -> Any:
    """One request for ``native``: streamed (its final response) or not."""
    if not stream:
        return await client.responses.create(model="native", input=ASK)
    async with client.responses.stream(model="native", input=ASK) as answer:
        return await answer.get_final_response()


def sdk(edge: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=edge.openai_url, api_key=TOKEN, max_retries=0)


@pytest.fixture
async def up() -> AsyncIterator[FakeOpenAI]:
    """The upstream, which serves both Responses and chat."""
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
    fields: Any = {"model": CODEX, "input": ASK, "tools": [WEATHER], "max_output_tokens": 64}
    upstream = {**fields, "model": "fake-model"}
    async with running_edge(passthrough_doc(up)) as edge, sdk(edge) as c:
        answer = await c.responses.with_raw_response.create(**fields)
        whole_raw, whole = answer.content, answer.parse()
        stream_raw = await streamed_bytes(c, **fields)
        async with c.responses.stream(**fields) as stream:
            final = await stream.get_final_response()
    _, expected_whole = await direct(reference, upstream)
    _, expected_stream = await direct(reference, {**upstream, "stream": True})
    assert whole_raw == as_relayed(expected_whole, whole_raw, CODEX)
    assert stream_raw == as_relayed(expected_stream, stream_raw, CODEX)
    assert b'"model":"fake-model"' not in stream_raw
    assert read_events(stream_raw)[-1][0] == "response.completed"
    assert whole.model == final.model == CODEX
    assert whole.id == "resp_fake1"  # the upstream's own id
    assert [item.type for item in whole.output] == ["reasoning", "message", "function_call"]
    # (the fake numbers its ids per answer: the stream's final response is the third answer)
    drop = {"id", "call_id"}
    assert [
        {k: v for k, v in item.items() if k not in drop}
        for item in without_parsed(final.model_dump())["output"]
    ] == [{k: v for k, v in item.items() if k not in drop} for item in whole.model_dump()["output"]]
    assert [r.path for r in up.requests] == ["/v1/responses"] * 3


async def test_the_body_reaches_the_upstream_untouched_but_for_model_and_the_floor(
    up: FakeOpenAI,
) -> None:
    """Every field as the client sent it (tools, include, reasoning, metadata, store...) but
    ``model``, the provider's target; ``min_max_tokens`` 8 raises a ``max_output_tokens`` of
    2, and adds none when the client sent none."""
    body: Any = {
        "model": CODEX,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]}
        ],
        "instructions": "Be brief.",
        "tools": [WEATHER],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "low", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "metadata": {"ticket": "T-1"},
        "store": False,
        "prompt_cache_key": "conversation-1",
        "service_tier": "auto",
    }
    async with running_edge(passthrough_doc(up)) as edge, sdk(edge) as c:
        await c.responses.create(**body)
        untouched = up.requests[-1].json
        await c.responses.create(**body, max_output_tokens=2)
        raised = up.requests[-1].json
        await c.responses.create(**body, max_output_tokens=100)
        own = up.requests[-1].json
    assert untouched == {**body, "model": "fake-model"}
    assert raised == {**body, "model": "fake-model", "max_output_tokens": 8}
    assert own == {**body, "model": "fake-model", "max_output_tokens": 100}
    for sent in up.requests:
        assert sent.path == "/v1/responses"
        assert "Authorization" not in sent.headers  # (the client's token never goes upstream)


async def test_the_request_line_has_the_upstreams_usage(
    up: FakeOpenAI, log_stream: io.StringIO
) -> None:
    async with running_edge(passthrough_doc(up)) as edge, sdk(edge) as c:
        whole = await c.responses.create(model="native", input=ASK)
        async with c.responses.stream(model="native", input=ASK) as stream:
            final = await stream.get_final_response()
    for response in (whole, final):
        assert response.usage is not None
        assert (response.usage.input_tokens, response.usage.output_tokens) == (4, 4)
    lines = request_lines(log_stream)
    assert [(x["prompt_tokens"], x["completion_tokens"]) for x in lines] == [(4, 4), (4, 4)]
    assert [(x["endpoint"], x["provider"], x["stream"], x["code"]) for x in lines] == [
        ("responses", "nat", False, "ok"),
        ("responses", "nat", True, "ok"),
    ]
    assert not any(x["usage_estimated"] for x in lines)


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, openai.BadRequestError),
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_error_status_is_relayed_with_its_status_and_body(
    up: FakeOpenAI,
    reference: FakeOpenAI,
    status: int,
    error_class: type[openai.APIStatusError],
    stream: bool,
) -> None:
    up.behavior = reference.behavior = FakeBehavior(
        status=status, error_message="the prompt is too long", error_code="context_too_long"
    )
    async with running_edge(passthrough_doc(up)) as edge, sdk(edge) as c:
        with pytest.raises(error_class) as info:
            await ask(c, stream)
    expected_status, expected = await direct(
        reference, {"model": "fake-model", "input": ASK, **({"stream": True} if stream else {})}
    )
    assert info.value.status_code == expected_status == status
    assert await info.value.response.aread() == expected
    assert info.value.code == "context_too_long"


async def test_an_upstream_response_failed_is_relayed_once_and_nothing_is_stored(
    up: FakeOpenAI, reference: FakeOpenAI, log_stream: io.StringIO
) -> None:
    """The upstream fails after 3 events with its own ``response.failed``: relayed as it came
    (but for ``model``), once, the edge adding nothing after it; the request line says
    ``upstream_error``; the failed response is not stored."""
    up.behavior = reference.behavior = FakeBehavior(
        fault="error", fault_after=3, error_message="The model crashed."
    )
    async with running_edge(passthrough_doc(up)) as edge, sdk(edge) as c:
        raw = await streamed_bytes(c, model="native", input=ASK)
        with pytest.raises(openai.NotFoundError):
            await c.responses.retrieve("resp_fake1")
    _, expected = await direct(reference, {"model": "fake-model", "input": ASK, "stream": True})
    assert raw == as_relayed(expected, raw, "native")
    names = [name for name, _ in read_events(raw)]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.failed",
    ]
    failed = read_events(raw)[-1][1]["response"]
    assert (failed["status"], failed["model"]) == ("failed", "native")
    assert failed["error"] == {"code": "server_error", "message": "The model crashed."}
    line = request_lines(log_stream)[0]
    assert (line["status"], line["code"], line["provider"]) == (200, "upstream_error", "nat")


async def test_an_upstream_that_breaks_off_ends_the_stream_with_an_error_event(
    up: FakeOpenAI, log_stream: io.StringIO
) -> None:
    """The upstream resets the connection after 3 events, with no event of its own: the edge
    relays what came, then OpenAI's ``error`` event naming the provider (it has no Response of
    its own to fail), never ``response.completed``; nothing is stored."""
    up.behavior = FakeBehavior(fault="reset", fault_after=3)
    async with running_edge(passthrough_doc(up)) as edge, sdk(edge) as c:
        raw = await streamed_bytes(c, model="native", input=ASK)
        with pytest.raises(openai.NotFoundError):
            await c.responses.retrieve("resp_fake1")
    events = read_events(raw)
    assert [name for name, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "error",
    ]
    error = events[-1][1]
    assert (error["type"], error["code"]) == ("error", "upstream_error")
    assert "provider 'nat'" in error["message"]
    line = request_lines(log_stream)[0]
    assert (line["status"], line["code"]) == (200, "upstream_error")
    assert "cut short" in line["error"]


# -- stored conversations ---------------------------------------------------------------------


def user_item(text: str) -> Any:
    """A user message item as the edge keeps a string input."""
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def test_previous_response_id_sends_the_stored_items_before_the_new_input(
    up: FakeOpenAI,
) -> None:
    """The edge resolves ``previous_response_id`` itself: the upstream gets the stored
    conversation (the first input, then the first response's output items as the upstream
    gave them) followed by the new input, and no ``previous_response_id``; the stored
    response is the one the client got (its ``model`` the asked one)."""
    async with running_edge(passthrough_doc(up)) as edge, sdk(edge) as c:
        first = await c.responses.create(model="native", input=ASK)
        got = await c.responses.retrieve(first.id)
        async with c.responses.stream(
            model="native", input="and then?", previous_response_id=first.id
        ) as stream:
            second = await stream.get_final_response()
        continued = up.requests[-1].json
        await c.responses.create(
            model="native", input=[user_item("last")], previous_response_id=second.id
        )
        third = up.requests[-1].json
    assert got.model_dump() == first.model_dump()
    assert got.model == "native"
    first_output = [item.model_dump(exclude_none=True) for item in first.output]
    assert continued == {
        "model": "fake-model",
        "input": [user_item(ASK), *first_output, user_item("and then?")],
        "stream": True,
    }
    second_output = [item.model_dump(exclude_none=True) for item in second.output]
    assert third == {
        "model": "fake-model",
        "input": [
            user_item(ASK),
            *first_output,
            user_item("and then?"),
            *second_output,
            user_item("last"),
        ],
    }
    assert second.previous_response_id is None  # (the upstream never saw one)


async def test_a_conversation_moves_between_passthrough_and_translation(
    up: FakeOpenAI,
) -> None:
    """Started on the passthrough model, continued on the translated one (the items become
    chat messages, the reasoning as ``reasoning_content``, the call and its output as a tool
    call and a ``tool`` message), then continued again on the passthrough model (the
    translated response's items go upstream as Responses items)."""
    up.behavior = FakeBehavior(
        reply="Let me check.", thinking="Think first.", tool_call="get_weather"
    )
    async with running_edge(passthrough_doc(up)) as edge, sdk(edge) as c:
        first = await c.responses.create(model="native", input=ASK, tools=[WEATHER])
        call = first.output[-1]
        assert call.type == "function_call"
        up.behavior = FakeBehavior(reply="It is sunny.")
        output: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "sun"}
        second = await c.responses.create(
            model="chat", input=[output], previous_response_id=first.id, tools=[WEATHER]
        )
        translated = up.requests[-1]
        up.behavior = FakeBehavior()
        third = await c.responses.create(
            model="native", input="thanks", previous_response_id=second.id
        )
        passed = up.requests[-1]
    assert translated.path == "/v1/chat/completions"
    assert translated.json["messages"] == [
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "Think first.",
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "sun"},
    ]
    assert second.model == "chat"
    assert second.output_text == "It is sunny."
    assert passed.path == "/v1/responses"
    assert passed.json["input"] == [
        user_item(ASK),
        *[item.model_dump(exclude_none=True) for item in first.output],
        output,
        *[item.model_dump(exclude_none=True) for item in second.output],
        user_item("thanks"),
    ]
    assert "previous_response_id" not in passed.json
    assert third.model == "native"
    assert third.output_text == "thanks"

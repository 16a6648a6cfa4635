"""``POST /v1/messages/count_tokens`` with the official ``anthropic`` SDK against a running edge:
counted by a passthrough provider, by the upstream's tokenizer (vLLM's and llama.cpp's
dialects), or by the edge's estimate — the ``x-iop-token-count`` header says which — without a
slot; its errors and its request line."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import anthropic
import pytest

from iop_edge.api.count_tokens import COUNT_HEADER
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_messages import input_tokens
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.fake_tokenizer import FakeTokenizer, fake_chat_tokens
from iop_edge.translate.count_tokens import count_input_tokens
from iop_edge.translate.messages_request import translate_request
from tests.helpers import BOUND
from tests.helpers.api import TOKEN, anthropic_client, edge_doc, request_lines, running_edge
from tests.helpers.claude_code import PNG

WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
#: a request to count: a system prompt, one user message, one tool
COUNTED: Any = {
    "system": "You are terse.",
    "messages": [{"role": "user", "content": "hello upstream world"}],
    "tools": [WEATHER],
}
#: the Anthropic headers a client sends (a passthrough count forwards them)
ANTHROPIC = {"anthropic-version": "2023-06-01", "anthropic-beta": "token-counting-2024-11-01"}


async def count(
    client: anthropic.AsyncAnthropic, model: str, **fields: Any
) -> tuple[int, str, Any]:
    """The count, how it was counted (the header), and the answer's headers."""
    response = await client.messages.with_raw_response.count_tokens(model=model, **fields)
    counted = await response.parse()
    return counted.input_tokens, response.headers[COUNT_HEADER], response.headers


def native(doc: dict[str, Any]) -> dict[str, Any]:
    """:func:`edge_doc` with its ``openai_compat`` adapter serving Messages natively."""
    doc["nodes"][0]["adapters"][0]["native_apis"] = ["messages"]
    return doc


async def test_a_passthrough_provider_counts_itself(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """The body goes to the provider's /messages/count_tokens (model: its target, the Anthropic
    headers forwarded, never the client's key), and its answer is the count."""
    async with (
        running_edge(native(edge_doc(fake_oa, fake_ol))) as edge,
        anthropic_client(edge) as c,
    ):
        counted, method, headers = await count(c, "chat-oa", **COUNTED, extra_headers=ANTHROPIC)
    [sent] = fake_oa.requests
    assert (counted, method) == (input_tokens(COUNTED), "passthrough")
    assert counted == 7  # (the fake's count: 3 + 3 words, 1 tool)
    assert headers["x-iop-provider"] == "up"
    assert sent.path == "/v1/messages/count_tokens"
    assert sent.json == {**COUNTED, "model": "fake-model"}
    assert sent.headers["anthropic-version"] == ANTHROPIC["anthropic-version"]
    assert sent.headers["anthropic-beta"] == ANTHROPIC["anthropic-beta"]
    assert "x-api-key" not in sent.headers
    assert "Authorization" not in sent.headers


@pytest.mark.parametrize(
    ("behavior", "method"),
    [
        (FakeBehavior(status=503), "estimate"),
        (FakeBehavior(status=500), "estimate"),
        (FakeBehavior(status=429, retry_after="5"), "estimate"),
        (FakeBehavior(fault="disconnect"), "estimate"),
        (FakeBehavior(status=400, error_message="messages: too many images"), None),
    ],
    ids=["503", "500", "429", "disconnect", "400"],
)
async def test_a_passthrough_count_that_fails_is_counted_the_next_way(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, behavior: FakeBehavior, method: str | None
) -> None:
    """An upstream that failed (unreachable, 429, 5xx) only moves the count to the next way
    (the module's contract); its judgement of the request (a 400) comes back as it came."""
    fake_oa.behavior = behavior
    async with (
        running_edge(native(edge_doc(fake_oa, fake_ol))) as edge,
        anthropic_client(edge) as c,
    ):
        if method is None:
            with pytest.raises(anthropic.BadRequestError) as info:
                await count(c, "chat-oa", **COUNTED)
            assert info.value.body == {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "messages: too many images"},
            }
            return
        counted, how, _ = await count(c, "chat-oa", **COUNTED)
    assert (counted, how) == (count_input_tokens({**COUNTED, "model": "chat-oa"}), method)
    assert fake_oa.requests[0].path == "/v1/messages/count_tokens"


@pytest.mark.parametrize("dialect", ["vllm", "llama_cpp"])
async def test_the_upstreams_tokenizer_counts_the_translated_chat(
    fake_ol: FakeOllama, dialect: FakeTokenizer
) -> None:
    chat = translate_request({**COUNTED, "model": "chat-oa"}, counting=True).chat
    async with (
        FakeOpenAI(tokenizer=dialect) as fake_oa,
        running_edge(edge_doc(fake_oa, fake_ol)) as edge,
        anthropic_client(edge) as c,
    ):
        counted, method, headers = await count(c, "chat-oa", **COUNTED)
        plain, _, _ = await count(c, "chat-oa", messages=COUNTED["messages"])
    assert method == "tokenizer"
    assert counted == fake_chat_tokens(chat["messages"], chat["tools"])
    assert plain == 6  # <|user|> hello upstream world <|end|> <|assistant|>
    assert headers["x-iop-provider"] == "up"
    assert fake_oa.requests[-1].path == "/tokenize"


@pytest.mark.parametrize("model", ["chat-oa", "chat-ol", "chat-cli", "legacy"])
async def test_otherwise_the_edges_estimate(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, model: str
) -> None:
    """chat-oa's upstream (and the route ``legacy``'s) has no tokenizer (404); ollama and cli
    never have one."""
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        counted, method, headers = await count(c, model, **COUNTED)
    assert method == "estimate"
    assert counted == count_input_tokens({**COUNTED, "model": model})
    assert "x-iop-provider" not in headers
    assert not fake_ol.requests  # (ollama is never asked)


def _tool_turn(result: Any) -> list[Any]:
    return [
        {"role": "user", "content": "read the log"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", **result}]},
    ]


async def test_the_estimate_counts_system_tools_tool_results_and_images(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    hello: Any = [{"role": "user", "content": "hello"}]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    variants: dict[str, Any] = {
        "system": {"messages": hello, "system": "You are a careful engineer. " * 8},
        "tools": {"messages": hello, "tools": [WEATHER]},
        "image": {
            "messages": [{"role": "user", "content": [image, {"type": "text", "text": "hello"}]}]
        },
    }
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        base, _, _ = await count(c, "chat-ol", messages=hello)
        more = {name: (await count(c, "chat-ol", **fields))[0] for name, fields in variants.items()}
        short, _, _ = await count(c, "chat-ol", messages=_tool_turn({"content": "ok"}))
        long, _, _ = await count(c, "chat-ol", messages=_tool_turn({"content": "ok " * 100}))
        blocks = _tool_turn({"content": [{"type": "text", "text": "ok " * 100}]})
        long_blocks, _, _ = await count(c, "chat-ol", messages=blocks)
    assert base == count_input_tokens({"model": "m", "messages": hello})
    for name, fields in variants.items():
        assert more[name] > base, name
        assert more[name] == count_input_tokens({"model": "m", **fields}), name
    assert more["image"] >= base + 1600
    assert long > short
    assert long_blocks == long


async def test_counting_takes_no_slot(fake_oa: FakeOpenAI, fake_ol: FakeOllama) -> None:
    """The group's only slot held by a request parked upstream: count_tokens answers at once,
    and nothing was submitted to admission."""
    fake_oa.behavior = FakeBehavior(hold=True)
    async with (
        running_edge(edge_doc(fake_oa, fake_ol, capacity=1)) as edge,
        anthropic_client(edge) as c,
    ):
        held = asyncio.create_task(
            c.messages.create(model="chat-oa", max_tokens=8, messages=COUNTED["messages"])
        )
        await fake_oa.wait_in_flight(1)
        before = edge.scheduler.statistics()
        async with asyncio.timeout(BOUND):  # (a wait for the slot would be 30 s in the queue)
            counted, method, _ = await count(c, "chat-oa", **COUNTED)
        after = edge.scheduler.statistics()
        fake_oa.release()
        await held
    assert method == "estimate"
    assert counted > 0
    assert (before.in_flight, after.in_flight, after.queue_depth) == (1, 1, 0)
    assert after.submitted == before.submitted


# -- errors, the request line -----------------------------------------------------------------


async def test_an_unknown_or_forbidden_model_is_404_and_a_bad_key_401(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    doc = edge_doc(fake_oa, fake_ol)
    doc["provider_pool"]["principals"] = [{"ref": "team-a", "models": ["chat-ol"]}]
    async with running_edge(doc) as edge, anthropic_client(edge) as c:
        with pytest.raises(anthropic.NotFoundError) as unknown:
            await c.messages.count_tokens(model="no-such-model", **COUNTED)
        with pytest.raises(anthropic.NotFoundError) as forbidden:
            await c.messages.count_tokens(model="chat-oa", **COUNTED)
        counted = await c.messages.count_tokens(model="chat-ol", **COUNTED)
        async with anthropic_client(edge, "iop_wrong-token") as stranger:
            with pytest.raises(anthropic.AuthenticationError) as denied:
                await stranger.messages.count_tokens(model="chat-ol", **COUNTED)
    for refused in (unknown.value, forbidden.value):
        assert refused.status_code == 404
        assert refused.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    said = [
        str(e.body["error"]["message"]).replace(model, "M")  # type: ignore[index]
        for e, model in ((unknown.value, "no-such-model"), (forbidden.value, "chat-oa"))
    ]
    assert said[0] == said[1]  # (the allow-list leaks no model's existence)
    assert counted.input_tokens > 0
    assert denied.value.status_code == 401
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert not fake_oa.requests


async def test_the_request_line_of_a_count(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, log_stream: io.StringIO
) -> None:
    async with (
        running_edge(native(edge_doc(fake_oa, fake_ol))) as edge,
        anthropic_client(edge) as c,
    ):
        await c.messages.count_tokens(
            model="chat-oa",
            **COUNTED,
            extra_headers={"X-Claude-Code-Session-Id": "session-1", "x-request-id": "count-1"},
        )
        with pytest.raises(anthropic.NotFoundError):
            await c.messages.count_tokens(model="no-such-model", **COUNTED)
    counted, unknown = request_lines(log_stream)
    assert {k: counted[k] for k in ("endpoint", "model", "provider", "status", "code")} == {
        "endpoint": "messages/count_tokens",
        "model": "chat-oa",
        "provider": "up",
        "status": 200,
        "code": "ok",
    }
    assert (counted["request_id"], counted["session_id"]) == ("count-1", "session-1")
    assert counted["principal_ref"] == "team-a"
    assert (unknown["endpoint"], unknown["status"], unknown["code"]) == (
        "messages/count_tokens",
        404,
        "model_not_found",
    )
    assert TOKEN not in log_stream.getvalue()

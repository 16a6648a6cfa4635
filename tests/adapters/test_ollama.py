"""SPEC §7 ollama: OpenAI chat → /api/chat (options mapped) and NDJSON → OpenAI chunks, against
the fake Ollama on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web

from iop_edge.adapters import (
    AdapterSet,
    Executor,
    UnsupportedRequestError,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
)
from iop_edge.errors import AdapterError
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_behavior import FakeBehavior, Fault
from iop_edge.testing.fake_ollama import FakeOllama, fake_thinking
from iop_edge.testing.fake_upstream import fake_embedding
from tests.helpers import pass_deadline
from tests.helpers.adapters import (
    CannedUpstream,
    Relayed,
    chat,
    collect,
    content_of,
    dead_port,
    frames_until_error,
    payloads,
    reply_json,
    run_call,
    serve,
)

SetFactory = Callable[..., AdapterSet]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOllama]:
    async with FakeOllama(strict_models=True) as server:
        yield server


def ollama_set(
    sets: SetFactory, base_url: str, clock: FakeClock | None = None, **provider: Any
) -> AdapterSet:
    return sets(
        [{"name": "local", "type": "ollama", "base_url": base_url}],
        [{"id": "o1", "type": "ollama", "adapter": "local", **provider}],
        clock,
    )


@pytest.fixture
def executor(sets: SetFactory, fake: FakeOllama) -> Executor:
    return ollama_set(sets, fake.base_url, context_size=4096).for_provider("o1")


async def test_request_maps_messages_target_and_options(
    executor: Executor, fake: FakeOllama
) -> None:
    call = chat(
        "why is the sky blue",
        target="fake-model:latest",
        max_tokens=64,
        temperature=0.3,
        top_p=0.9,
        stop="END",
        seed=7,
    )
    call.body["messages"].insert(0, {"role": "developer", "content": "Be brief."})
    await executor.complete(call)

    sent = fake.requests[-1]
    assert sent.path == "/api/chat"
    assert sent.headers["Content-Type"] == "application/json"
    assert sent.json == {
        "model": "fake-model:latest",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "why is the sky blue"},
        ],
        "stream": False,
        "options": {
            "num_predict": 64,
            "temperature": 0.3,
            "top_p": 0.9,
            "seed": 7,
            "stop": ["END"],
            "num_ctx": 4096,
        },
    }


async def test_max_completion_tokens_wins_and_content_parts_and_images_are_converted(
    executor: Executor, fake: FakeOllama
) -> None:
    call = chat(target="fake-model", max_tokens=10, max_completion_tokens=3, stop=["a", "b"])
    call.body["messages"] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look "},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}},
                {"type": "text", "text": "here"},
            ],
        }
    ]
    await executor.complete(call)
    sent = fake.requests[-1].json
    assert sent["options"]["num_predict"] == 3
    assert sent["options"]["stop"] == ["a", "b"]
    assert sent["messages"] == [{"role": "user", "content": "look here", "images": ["iVBORw0K"]}]


async def test_an_image_by_url_is_refused_before_any_request(
    executor: Executor, fake: FakeOllama
) -> None:
    call = chat()
    call.body["messages"] = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y"}}]}
    ]
    with pytest.raises(UnsupportedRequestError) as caught:
        await executor.complete(call)
    assert caught.value.status == 400
    assert caught.value.code == "invalid_request_error"
    assert fake.total_requests == 0


async def test_non_streaming_answer_is_a_chat_completion_with_usage(executor: Executor) -> None:
    reply = await executor.complete(chat("tell me three words", target="fake-model"))
    assert reply.status == 200
    body = reply_json(reply)
    assert body["object"] == "chat.completion"
    assert body["id"] == "chatcmpl-req-1"
    assert body["model"] == "fake-model"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "tell me three words"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (4, 4)


async def test_done_reason_length_becomes_finish_reason_length(executor: Executor) -> None:
    reply = await executor.complete(chat("one two three four", target="fake-model", max_tokens=2))
    body = reply_json(reply)
    assert body["choices"][0]["message"]["content"] == "one two "
    assert body["choices"][0]["finish_reason"] == "length"


async def test_stream_becomes_openai_chunks(executor: Executor, fake: FakeOllama) -> None:
    stream = await executor.open_stream(chat("one two three", target="fake-model", stream=True))
    assert isinstance(stream, UpstreamStream)
    assert stream.status == 200
    chunks = payloads(await collect(stream))

    assert fake.requests[-1].json["stream"] is True
    assert chunks[-1] == "[DONE]"
    data = chunks[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-req-1" for c in data)
    assert data[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"].get("content") for c in data[1:-1]] == [
        "one ",
        "two ",
        "three",
    ]
    assert data[-1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert all("usage" not in c for c in data)  # the client did not ask for it
    assert (stream.usage.prompt_tokens, stream.usage.completion_tokens) == (3, 3)


async def test_stream_usage_chunk_when_the_client_asks(executor: Executor) -> None:
    call = chat("a b", target="fake-model", stream=True, stream_options={"include_usage": True})
    chunks = payloads(await collect(await executor.open_stream(call)))
    assert chunks[-2]["choices"] == []
    assert chunks[-2]["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    assert chunks[-3]["choices"][0]["finish_reason"] == "stop"
    assert content_of(chunks[:-2]) == "a b"


async def test_headers_reach_ollama(sets: SetFactory, fake: FakeOllama) -> None:
    adapter_set = sets(
        [
            {
                "name": "local",
                "type": "ollama",
                "base_url": fake.base_url,
                "headers": {"X-Proxy-Key": "configured"},
            }
        ],
        [{"id": "o1", "type": "ollama", "adapter": "local"}],
    )
    call = chat(target="fake-model", headers={"Authorization": "Bearer from-call"})
    await adapter_set.for_provider("o1").complete(call)
    sent = fake.requests[-1].headers
    assert sent["X-Proxy-Key"] == "configured"
    assert sent["Authorization"] == "Bearer from-call"


async def test_ollama_error_status_comes_back_as_an_openai_envelope(executor: Executor) -> None:
    reply = await executor.complete(chat(target="no-such-model"))
    assert reply.status == 404
    assert reply_json(reply)["error"]["message"] == (
        'model "no-such-model" not found, try pulling it first'
    )
    streamed = await executor.open_stream(chat(target="no-such-model", stream=True))
    assert isinstance(streamed, UpstreamReply)
    assert streamed.status == 404


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("reset", "cut short"),
        ("malformed", "not valid JSON"),
        ("error", "reported an error mid-stream: The fake upstream was told"),
    ],
)
async def test_a_broken_ndjson_stream_raises_from_the_frames(
    executor: Executor, fake: FakeOllama, fault: Fault, reason: str
) -> None:
    fake.enqueue(FakeBehavior(fault=fault, fault_after=1))
    stream = await executor.open_stream(chat("one two three", target="fake-model", stream=True))
    assert isinstance(stream, UpstreamStream)
    received, error = await frames_until_error(stream)
    assert content_of(payloads(received)) == "one "
    assert error.code == "upstream_error"
    assert reason in str(error)
    assert "ollama provider 'o1'" in str(error)


async def test_a_stream_that_ends_before_done_is_a_failure(sets: SetFactory) -> None:
    async def truncated(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        await response.write(b'{"message":{"role":"assistant","content":"x"},"done":false}\n')
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/api/chat", truncated)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        executor = ollama_set(sets, f"http://127.0.0.1:{runner.addresses[0][1]}").for_provider("o1")
        stream = await executor.open_stream(chat(stream=True))
        with pytest.raises(AdapterError, match='ended before the "done": true line'):
            await collect(stream)
    finally:
        await runner.cleanup()


async def test_connection_refused_is_an_upstream_error(sets: SetFactory) -> None:
    url = f"http://127.0.0.1:{dead_port()}"
    with pytest.raises(AdapterError) as caught:
        await ollama_set(sets, url).for_provider("o1").complete(chat())
    assert caught.value.code == "upstream_error"
    assert caught.value.status == 502
    assert f"{url}/api/chat" in str(caught.value)
    assert "'o1'" in str(caught.value)


async def test_a_stall_times_out_and_cancellation_aborts_upstream(
    sets: SetFactory, fake: FakeOllama
) -> None:
    clock = FakeClock()
    executor = ollama_set(sets, fake.base_url, clock, request_timeout_ms=300).for_provider("o1")
    fake.enqueue(FakeBehavior(fault="stall", fault_after=1))
    stream = await executor.open_stream(chat(target="fake-model", stream=True))
    deadline = asyncio.create_task(pass_deadline(clock, 0.3))
    with pytest.raises(AdapterError) as caught:
        await collect(stream)
    await deadline
    assert caught.value.code == "upstream_timeout"
    assert caught.value.status == 504
    async with asyncio.timeout(5):
        await fake.wait_until(lambda: fake.cancelled == 1)

    fake.behavior = FakeBehavior(hold=True)
    task = asyncio.create_task(executor.complete(chat(target="fake-model")))
    async with asyncio.timeout(5):
        await fake.wait_in_flight(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(5):
        await fake.wait_until(lambda: fake.cancelled == 2 and fake.in_flight == 0)


async def test_completions_endpoint_is_an_invalid_request(
    executor: Executor, fake: FakeOllama
) -> None:
    call = UpstreamCall("completions", {"model": "m", "prompt": "hi"}, "fake-model", False, {}, "r")
    with pytest.raises(UnsupportedRequestError) as caught:
        await executor.complete(call)
    assert caught.value.status == 400
    assert caught.value.code == "invalid_request_error"
    assert "/v1/chat/completions" in str(caught.value)
    assert fake.total_requests == 0


# -- issue 15: tools, fields Ollama cannot honour, embeddings -----------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 2),
        ("logprobs", True),
        ("top_logprobs", 3),
        ("logit_bias", {"50256": -100}),
        ("tool_choice", "required"),
        ("functions", [{"name": "f"}]),
        ("modalities", ["text", "audio"]),
        ("reasoning_effort", "extreme"),
        ("top_k", 40),
    ],
)
async def test_a_field_ollama_cannot_honour_is_a_400_naming_it(
    executor: Executor, fake: FakeOllama, field: str, value: Any
) -> None:
    """Issue 15: never silently dropped; refused before any request reaches Ollama."""
    with pytest.raises(UnsupportedRequestError) as caught:
        await executor.complete(chat(**{field: value}))
    assert (caught.value.status, caught.value.code) == (400, "unsupported_parameter")
    assert caught.value.param == field
    assert f"'{field}' cannot be honoured by ollama provider 'o1'" in str(caught.value)
    assert fake.statistics().total_requests == 0


async def test_tool_calls_from_ollama_keep_their_ids(sets: SetFactory) -> None:
    """Ollama's own call ids are kept; arguments become a JSON string; a call without an id
    gets call_<request id>_<n>."""

    async def answer(request: web.Request) -> web.Response:
        calls = [
            {"id": "call_abc", "function": {"name": "a", "arguments": {"x": 1}}},
            {"function": {"name": "b", "arguments": {}}},
        ]
        body = {
            "model": "m",
            "message": {"role": "assistant", "content": "", "tool_calls": calls},
            "done": True,
            "done_reason": "stop",
        }
        return web.json_response(body)

    async with serve("/api/chat", answer) as origin:
        executor = ollama_set(sets, origin).for_provider("o1")
        reply = reply_json(await executor.complete(chat(request_id="r7", model="group")))
    message = reply["choices"][0]["message"]
    assert reply["model"] == "group"
    assert reply["choices"][0]["finish_reason"] == "tool_calls"
    assert message["content"] is None
    assert message["tool_calls"] == [
        {"id": "call_abc", "type": "function", "function": {"name": "a", "arguments": '{"x":1}'}},
        {"id": "call_r7_1", "type": "function", "function": {"name": "b", "arguments": "{}"}},
    ]


async def test_tool_call_arguments_that_are_not_a_json_object_are_a_400(
    executor: Executor, fake: FakeOllama
) -> None:
    call = chat("hi")
    call.body["messages"] += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1]"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    with pytest.raises(UnsupportedRequestError) as caught:
        await executor.complete(call)
    assert caught.value.param == "messages[1].tool_calls[0].function.arguments"
    assert fake.statistics().total_requests == 0


async def test_embeddings_become_api_embed_and_come_back_in_openai_form(
    executor: Executor, fake: FakeOllama
) -> None:
    call = UpstreamCall(
        "embeddings",
        {"model": "m", "input": ["x y", "z"], "encoding_format": "float", "user": "u"},
        "fake-model",
        False,
        {},
        "r-e",
        "embed-group",
    )
    reply = reply_json(await executor.complete(call))
    assert fake.requests[-1].path == "/api/embed"
    assert fake.requests[-1].json == {"model": "fake-model", "input": ["x y", "z"]}
    assert fake.requests[-1].headers["x-request-id"] == "r-e"
    assert reply == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": fake_embedding("x y")},
            {"object": "embedding", "index": 1, "embedding": fake_embedding("z")},
        ],
        "model": "embed-group",
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }


async def test_an_embed_answer_with_the_wrong_count_is_an_upstream_error(
    sets: SetFactory,
) -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.json_response({"model": "m", "embeddings": [[0.5]], "prompt_eval_count": 1})

    async with serve("/api/embed", answer) as origin:
        executor = ollama_set(sets, origin).for_provider("o1")
        call = UpstreamCall("embeddings", {"model": "m", "input": ["a", "b"]}, "m", False, {}, "r")
        with pytest.raises(AdapterError, match="1 embeddings for 2 inputs"):
            await executor.complete(call)


# -- issue 27: reasoning ------------------------------------------------------------------------


async def test_reasoning_in_history_goes_back_as_the_messages_thinking(
    executor: Executor, fake: FakeOllama
) -> None:
    """An assistant turn's reasoning_content is Ollama's message thinking: never lost, never
    mixed into the content."""
    call = chat("and now?")
    call.body["messages"][:0] = [
        {"role": "user", "content": "read the log"},
        {
            "role": "assistant",
            "content": "It failed at step 3.",
            "reasoning_content": "The log ends with an error at step 3.",
        },
    ]
    await executor.complete(call)
    sent = fake.requests[-1].json["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": "It failed at step 3.",
        "thinking": "The log ends with an error at step 3.",
    }
    assert all("thinking" not in m for m in (sent[0], sent[2]))


async def test_reasoning_of_a_tool_calling_turn_is_kept_with_its_calls(
    executor: Executor, fake: FakeOllama
) -> None:
    call = chat("go on")
    call.body["messages"][:0] = [
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I should list the files first.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]
    await executor.complete(call)
    sent = fake.requests[-1].json["messages"]
    assert sent[0] == {
        "role": "assistant",
        "content": "",
        "thinking": "I should list the files first.",
        "tool_calls": [{"function": {"name": "ls", "arguments": {}}}],
    }


@pytest.mark.parametrize(
    ("effort", "think"),
    [
        ("none", False),
        ("minimal", "low"),
        ("low", "low"),
        ("medium", "medium"),
        ("high", "high"),
        ("xhigh", "high"),
        ("max", "high"),
    ],
)
async def test_reasoning_effort_becomes_think(
    executor: Executor, fake: FakeOllama, effort: str, think: bool | str
) -> None:
    await executor.complete(chat(reasoning_effort=effort))
    assert fake.requests[-1].json["think"] == think


@pytest.mark.parametrize(
    ("fields", "think"),
    [
        ({"thinking_token_budget": 0}, False),
        ({"thinking_token_budget": 2048}, True),
        ({"thinking_token_budget": 0, "reasoning_effort": "high"}, False),
        ({"thinking_token_budget": 2048, "reasoning_effort": "low"}, "low"),
    ],
)
async def test_a_zero_thinking_budget_turns_thinking_off_and_a_positive_one_on(
    executor: Executor, fake: FakeOllama, fields: dict[str, Any], think: bool | str
) -> None:
    """A budget of 0 wins over any effort; above 0 the effort's level, else on."""
    await executor.complete(chat(**fields))
    assert fake.requests[-1].json["think"] == think


async def test_no_reasoning_field_leaves_think_to_the_model(
    executor: Executor, fake: FakeOllama
) -> None:
    await executor.complete(chat())
    assert "think" not in fake.requests[-1].json


async def test_the_thinking_ollama_answers_comes_back_as_reasoning_content(
    executor: Executor, fake: FakeOllama
) -> None:
    """Non-streamed in message.reasoning_content, streamed as reasoning_content deltas before
    the content."""
    reply = reply_json(await executor.complete(chat("why", reasoning_effort="high")))
    message = reply["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (fake_thinking("why"), "why")

    frames = payloads(
        await collect(
            await executor.open_stream(chat("why", stream=True, thinking_token_budget=64))
        )
    )
    deltas = [c["choices"][0]["delta"] for c in frames if isinstance(c, dict) and c["choices"]]
    reasoning = [d["reasoning_content"] for d in deltas if d.get("reasoning_content")]
    assert reasoning == [fake_thinking("why")]
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert deltas.index({"reasoning_content": fake_thinking("why")}) < first_content
    assert content_of(frames) == "why"


TWO_CALLS: Any = [
    {"function": {"name": "read", "arguments": {"path": "a"}}},
    {"function": {"name": "read", "arguments": {"path": "b"}}},
]
TOOL: Any = [{"type": "function", "function": {"name": "read", "parameters": {}}}]


@pytest.mark.parametrize("stream", [False, True])
async def test_parallel_tool_calls_false_keeps_the_first_call_only(
    sets: SetFactory, stream: bool
) -> None:
    """Ollama cannot be told to call one tool at a time (what Codex asks for): the edge keeps
    the answer's first call and drops the rest; without the field both come back."""
    message = {"role": "assistant", "content": "", "tool_calls": TWO_CALLS}
    whole = {"model": "m", "message": message, "done": True, "done_reason": "stop"}
    last = {**whole, "message": {"role": "assistant", "content": ""}}
    lines = [
        orjson.dumps({"model": "m", "message": message, "done": False}) + b"\n",
        orjson.dumps(last) + b"\n",
    ]
    upstream = CannedUpstream(
        lines if stream else [orjson.dumps(whole)],
        content_type="application/x-ndjson" if stream else "application/json",
    )
    async with serve("/api/chat", upstream.handle) as origin:
        executor = ollama_set(sets, origin).for_provider("o1")
        counted = []
        for single in (True, False):
            extra: Any = {"parallel_tool_calls": False} if single else {}
            got = await run_call(executor, chat("read", stream=stream, tools=TOOL, **extra))
            if isinstance(got, Relayed):
                assert got.error is None
                text = got.frames.decode()
                counted.append(text.count('"name":"read"'))
            else:
                calls = orjson.loads(got.body)["choices"][0]["message"]["tool_calls"]
                counted.append(len(calls))
    assert counted == [1, 2]

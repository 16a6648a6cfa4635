"""SPEC §7 openai_compat: passthrough to a real OpenAI-compatible server (the fake) over
127.0.0.1 — target mapping, untouched fields, headers, usage, errors, timeouts, cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDictProxy

from iop_edge.adapters import AdapterSet, Executor, UpstreamCall, UpstreamReply, UpstreamStream
from iop_edge.adapters.openai_format import with_model
from iop_edge.adapters.relay import MAX_FRAME_BYTES
from iop_edge.errors import AdapterError
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_behavior import FakeBehavior, Fault
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.fake_upstream import fake_embedding
from tests.helpers import pass_deadline
from tests.helpers.adapters import (
    chat,
    collect,
    content_of,
    dead_port,
    frames_until_error,
    payloads,
    reply_json,
    serve,
    split_frames,
)

SetFactory = Callable[..., AdapterSet]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


def provider_set(
    sets: SetFactory, base_url: str, clock: FakeClock | None = None, **provider: Any
) -> AdapterSet:
    return sets(
        [{"name": "api", "type": "openai_compat", "base_url": base_url}],
        [{"id": "p1", "type": "openai_compat", "adapter": "api", **provider}],
        clock,
    )


@pytest.fixture
def executor(sets: SetFactory, fake: FakeOpenAI) -> Executor:
    return provider_set(sets, fake.base_url).for_provider("p1")


async def test_non_streaming_body_goes_through_with_model_set_to_the_target(
    executor: Executor, fake: FakeOpenAI
) -> None:
    call = chat(
        "tell me three words",
        target="upstream-name",
        temperature=0.25,
        x_vendor_field={"nested": [1, 2, {"deep": None}]},
        max_tokens=50,
    )
    reply = await executor.complete(call)

    sent = fake.requests[-1]
    assert sent.path == "/v1/chat/completions"
    assert sent.json == {**call.body, "model": "upstream-name"}
    assert list(sent.json) == list(call.body)  # field order kept, model replaced in place
    assert call.body["model"] == "m"  # the caller's body is not modified
    assert reply.status == 200
    body = reply_json(reply)
    assert body["object"] == "chat.completion"
    assert body["model"] == "upstream-name"
    assert body["choices"][0]["message"]["content"] == "tell me three words"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (4, 4)


async def test_non_streaming_body_is_returned_byte_for_byte(executor: Executor) -> None:
    reply = await executor.complete(chat("exact bytes"))
    # The fake serialises with orjson: re-serialising the parsed body gives the same bytes
    # only if the adapter returned them untouched (no reformatting, no re-ordering).
    assert reply.body == orjson.dumps(orjson.loads(reply.body))
    assert b'"system_fingerprint":"fp_fake"' in reply.body


async def test_streaming_relays_every_chunk_and_hides_the_usage_it_asked_for(
    executor: Executor, fake: FakeOpenAI
) -> None:
    stream = await executor.open_stream(chat("one two three", stream=True))
    assert isinstance(stream, UpstreamStream)
    assert stream.status == 200
    frames = await collect(stream)

    sent = fake.requests[-1].json
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    chunks = payloads(frames)
    assert chunks[-1] == "[DONE]"
    data = chunks[:-1]
    assert len(data) == 5  # role, three words, finish — and no usage-only chunk
    assert data[0]["choices"][0]["delta"]["role"] == "assistant"
    assert content_of(data) == "one two three"
    assert data[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in chunk for chunk in data)
    assert (stream.usage.prompt_tokens, stream.usage.completion_tokens) == (3, 3)


async def test_streaming_client_that_asked_for_usage_gets_the_usage_chunk(
    executor: Executor, fake: FakeOpenAI
) -> None:
    call = chat("a b", stream=True, stream_options={"include_usage": True})
    stream = await executor.open_stream(call)
    chunks = payloads(await collect(stream))

    assert fake.requests[-1].json["stream_options"] == {"include_usage": True}
    assert chunks[-2]["choices"] == []
    assert chunks[-2]["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    assert (stream.usage.prompt_tokens, stream.usage.completion_tokens) == (2, 2)


async def test_streaming_client_that_refused_usage_is_left_alone(
    executor: Executor, fake: FakeOpenAI
) -> None:
    call = chat("a b", stream=True, stream_options={"include_usage": False})
    stream = await executor.open_stream(call)
    chunks = payloads(await collect(stream))

    assert fake.requests[-1].json["stream_options"] == {"include_usage": False}
    assert all("usage" not in chunk for chunk in chunks[:-1])
    assert stream.usage.prompt_tokens is None
    assert stream.usage.completion_tokens is None


async def test_call_stream_flag_wins_over_the_body(executor: Executor, fake: FakeOpenAI) -> None:
    call = UpstreamCall(
        endpoint="chat/completions",
        body={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        target="fake-model",
        stream=True,
        headers={},
        request_id="r",
    )
    frames = await collect(await executor.open_stream(call))
    assert fake.requests[-1].json["stream"] is True
    assert frames[-1] == b"data: [DONE]\n\n"


async def test_headers_come_from_execution_fields_then_from_the_call(sets: SetFactory) -> None:
    async with FakeOpenAI(api_key="sk-provider") as fake:
        adapter_set = sets(
            [
                {
                    "name": "api",
                    "type": "openai_compat",
                    "base_url": fake.base_url,
                    "headers": {"X-Team": "adapter", "Authorization": "Bearer sk-wrong"},
                }
            ],
            [{"id": "p1", "type": "openai_compat", "adapter": "api"}],
        )
        executor = adapter_set.for_provider("p1")
        without = await executor.complete(chat())
        assert without.status == 401  # the configured header alone is the wrong key

        call = chat(headers={"authorization": "Bearer sk-provider", "X-Call": "1"})
        reply = await executor.complete(call)

        assert reply.status == 200
        sent = fake.requests[-1].headers
        assert isinstance(sent, CIMultiDictProxy)
        assert sent.getall("Authorization") == ["Bearer sk-provider"]
        assert sent["X-Team"] == "adapter"
        assert sent["X-Call"] == "1"
        assert sent["Content-Type"] == "application/json"


async def test_upstream_error_status_and_envelope_pass_through(
    executor: Executor, fake: FakeOpenAI
) -> None:
    fake.behavior = FakeBehavior(status=500, error_message="GPU on fire", error_code="boom")
    reply = await executor.complete(chat())
    assert reply.status == 500
    assert reply_json(reply) == {
        "error": {"message": "GPU on fire", "type": "server_error", "param": None, "code": "boom"}
    }

    fake.behavior = FakeBehavior(status=429, error_message="slow down")
    streamed = await executor.open_stream(chat(stream=True))
    assert isinstance(streamed, UpstreamReply)
    assert streamed.status == 429
    assert reply_json(streamed)["error"]["message"] == "slow down"


async def test_a_non_json_upstream_error_is_wrapped_and_its_body_kept_for_the_log_only(
    sets: SetFactory,
) -> None:
    """Issue 10: an upstream's HTML error page never reaches the client; the client gets the
    upstream's status in an OpenAI envelope naming the provider, the log the page's start."""
    page = "<html><body>nginx: bad gateway " + "x" * 2000 + "</body></html>"

    async def bad_gateway(request: web.Request) -> web.Response:
        return web.Response(status=502, text=page)

    async with serve("/v1/chat/completions", bad_gateway) as origin:
        executor = provider_set(sets, f"{origin}/v1").for_provider("p1")
        reply = await executor.complete(chat())
        streamed = await executor.open_stream(chat(stream=True))
    for got in (reply, streamed):
        assert isinstance(got, UpstreamReply)
        assert got.status == 502
        error = reply_json(got)["error"]
        assert error["type"] == "server_error"
        assert error["code"] == "upstream_error"
        assert "'p1'" in error["message"]
        assert "nginx" not in error["message"]
        assert "html" not in got.body.decode()
        assert got.detail is not None
        assert got.detail.startswith("the upstream answered 502 Bad Gateway: <html><body>nginx")
        assert len(got.detail) <= 560  # 500 characters of the page, and the status line


async def test_connection_refused_is_an_upstream_error_naming_provider_and_url(
    sets: SetFactory,
) -> None:
    url = f"http://127.0.0.1:{dead_port()}/v1"
    executor = provider_set(sets, url).for_provider("p1")
    for attempt in (executor.complete(chat()), executor.open_stream(chat(stream=True))):
        with pytest.raises(AdapterError) as caught:
            await attempt
        assert caught.value.code == "upstream_error"
        assert caught.value.status == 502
        message = str(caught.value)
        assert "provider 'p1'" in message
        assert f"{url}/chat/completions" in message
        assert "cannot connect" in message


async def test_secret_header_values_and_url_credentials_stay_out_of_messages(
    sets: SetFactory,
) -> None:
    port = dead_port()
    adapter_set = sets(
        [
            {
                "name": "api",
                "type": "openai_compat",
                "base_url": f"http://user:hunter2@127.0.0.1:{port}/v1",
                "headers": {"Authorization": "Bearer sk-secret"},
            }
        ],
        [{"id": "p1", "type": "openai_compat", "adapter": "api"}],
    )
    with pytest.raises(AdapterError) as caught:
        await adapter_set.for_provider("p1").complete(chat(headers={"X-Key": "call-secret"}))
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message
    assert "hunter2" not in message
    assert "sk-secret" not in message
    assert "call-secret" not in message


async def test_malformed_non_streaming_body_is_an_upstream_error(
    executor: Executor, fake: FakeOpenAI
) -> None:
    fake.enqueue(FakeBehavior(fault="malformed"))
    with pytest.raises(AdapterError) as caught:
        await executor.complete(chat())
    assert caught.value.code == "upstream_error"
    assert "not valid JSON" in str(caught.value)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("reset", "cut short"),
        ("malformed", "not valid JSON"),
        ("error", "reported an error mid-stream: The fake upstream was told"),
    ],
)
async def test_a_broken_stream_raises_from_the_frames_after_what_was_relayed(
    executor: Executor, fake: FakeOpenAI, fault: Fault, reason: str
) -> None:
    fake.enqueue(FakeBehavior(fault=fault, fault_after=2))
    stream = await executor.open_stream(chat("one two three", stream=True))
    assert isinstance(stream, UpstreamStream)
    received, error = await frames_until_error(stream)
    assert len(received) == 2  # the role and the first word were relayed as they came
    assert error.code == "upstream_error"
    assert reason in str(error)
    assert "provider 'p1'" in str(error)


async def test_a_stream_that_ends_without_done_is_a_failure(sets: SetFactory) -> None:
    async def truncated(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n')
        await response.write_eof()
        return response

    async with serve("/v1/chat/completions", truncated) as origin:
        executor = provider_set(sets, f"{origin}/v1").for_provider("p1")
        stream = await executor.open_stream(chat(stream=True))
        with pytest.raises(AdapterError, match=r"ended before data: \[DONE\]"):
            await collect(stream)


async def test_sse_comments_fields_crlf_and_split_writes_are_normalised(
    sets: SetFactory,
) -> None:
    chunk = b'{"id":"c","object":"chat.completion.chunk","choices":[{"delta":{"content":"hi"}}]}'

    async def wire_details(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b": keep-alive\r\n\r\n")
        await response.write(b"event: message\r\nid: 1\r\nda")  # a line split across writes
        await response.write(b"ta: " + chunk[:20])
        await response.write(chunk[20:] + b"\r\n\r\n")
        await response.write(b"data:[DONE]\n\n")
        return response

    async with serve("/v1/chat/completions", wire_details) as origin:
        stream = (
            await provider_set(sets, f"{origin}/v1")
            .for_provider("p1")
            .open_stream(chat(stream=True))
        )
        frames = await collect(stream)
    assert frames == [b"data: " + chunk + b"\n\n", b"data: [DONE]\n\n"]


async def test_an_endless_line_is_capped(sets: SetFactory) -> None:
    async def no_newline(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        block = b"x" * 65536
        for _ in range(MAX_FRAME_BYTES // len(block) + 2):
            await response.write(block)
        return response

    async with serve("/v1/chat/completions", no_newline) as origin:
        executor = provider_set(sets, f"{origin}/v1").for_provider("p1")
        stream = await executor.open_stream(chat(stream=True))
        with pytest.raises(AdapterError, match=f"exceeds the {MAX_FRAME_BYTES}-byte limit"):
            await collect(stream)


async def test_a_stall_mid_stream_times_out_and_the_upstream_sees_the_abort(
    sets: SetFactory, fake: FakeOpenAI
) -> None:
    clock = FakeClock()
    executor = provider_set(sets, fake.base_url, clock, request_timeout_ms=300).for_provider("p1")
    fake.enqueue(FakeBehavior(fault="stall", fault_after=1))
    stream = await executor.open_stream(chat(stream=True))
    assert isinstance(stream, UpstreamStream)
    frames = stream.frames
    async with stream:
        first = await anext(frames)
        assert b'"role":"assistant"' in first
        deadline = asyncio.create_task(pass_deadline(clock, 0.3))  # mid-stream
        with pytest.raises(AdapterError) as caught:
            await anext(frames)
        await deadline
    assert caught.value.code == "upstream_timeout"
    assert caught.value.status == 504
    assert "request_timeout_ms=300" in str(caught.value)
    async with asyncio.timeout(5):
        await fake.wait_until(lambda: fake.cancelled == 1)


async def test_a_slow_answer_times_out_before_the_response(
    sets: SetFactory, fake: FakeOpenAI
) -> None:
    clock = FakeClock()
    executor = provider_set(sets, fake.base_url, clock, request_timeout_ms=200).for_provider("p1")
    fake.behavior = FakeBehavior(hold=True)
    for sent, attempt in enumerate(
        (executor.complete(chat()), executor.open_stream(chat(stream=True))), start=1
    ):
        arrived = lambda sent=sent: fake.total_requests == sent  # noqa: E731
        deadline = asyncio.create_task(pass_deadline(clock, clock.now() + 0.2, arrived))
        with pytest.raises(AdapterError) as caught:
            await attempt
        await deadline
        assert caught.value.code == "upstream_timeout"
        assert caught.value.status == 504
    async with asyncio.timeout(5):
        await fake.wait_until(lambda: fake.cancelled == 2 and fake.in_flight == 0)


async def test_cancelling_the_caller_aborts_the_upstream_request(
    executor: Executor, fake: FakeOpenAI
) -> None:
    fake.behavior = FakeBehavior(hold=True)
    task = asyncio.create_task(executor.complete(chat()))
    async with asyncio.timeout(5):
        await fake.wait_in_flight(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(5):
        await fake.wait_until(lambda: fake.cancelled == 1 and fake.in_flight == 0)
    assert fake.completed == 0


async def test_cancelling_a_stream_consumer_aborts_the_upstream_request(
    executor: Executor, fake: FakeOpenAI
) -> None:
    fake.enqueue(FakeBehavior(fault="stall", fault_after=2))
    stream = await executor.open_stream(chat("one two", stream=True))
    assert isinstance(stream, UpstreamStream)
    received: list[bytes] = []
    second = asyncio.Event()

    async def consume() -> None:
        async for piece in stream.frames:
            received.extend(split_frames(piece))
            if len(received) >= 2:
                second.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await second.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await stream.aclose()
    async with asyncio.timeout(5):
        await fake.wait_until(lambda: fake.cancelled == 1)


async def test_aclose_of_an_abandoned_stream_aborts_the_upstream_request(
    executor: Executor, fake: FakeOpenAI
) -> None:
    fake.enqueue(FakeBehavior(fault="stall", fault_after=1))
    stream = await executor.open_stream(chat(stream=True))
    assert isinstance(stream, UpstreamStream)
    await anext(stream.frames)
    await stream.aclose()
    await stream.aclose()  # idempotent
    async with asyncio.timeout(5):
        await fake.wait_until(lambda: fake.cancelled == 1)

    # A stream closed before its first frame releases its connection too.
    fake.enqueue(FakeBehavior(fault="stall", fault_after=0))
    unread = await executor.open_stream(chat(stream=True))
    assert isinstance(unread, UpstreamStream)
    await unread.aclose()
    async with asyncio.timeout(5):
        await fake.wait_until(lambda: fake.cancelled == 2)


async def test_legacy_completions_endpoint_passes_through(
    executor: Executor, fake: FakeOpenAI
) -> None:
    body = {"model": "m", "prompt": "say this back", "max_tokens": 2, "echo": False}
    call = UpstreamCall("completions", body, "fake-model", False, {}, "r1")
    reply = await executor.complete(call)
    assert fake.requests[-1].path == "/v1/completions"
    assert fake.requests[-1].json == {**body, "model": "fake-model"}
    parsed = reply_json(reply)
    assert parsed["object"] == "text_completion"
    assert parsed["choices"][0]["text"] == "say this "
    assert reply.usage.completion_tokens == 2

    streamed = UpstreamCall("completions", {**body, "stream": True}, "fake-model", True, {}, "r2")
    chunks = payloads(await collect(await executor.open_stream(streamed)))
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == "say this "
    assert chunks[-1] == "[DONE]"


async def test_endpoint_field_overrides_the_chat_path(sets: SetFactory, fake: FakeOpenAI) -> None:
    adapter_set = sets(
        [
            {
                "name": "api",
                "type": "openai_compat",
                "base_url": fake.origin,
                "endpoint": "/v1/chat/completions",
            }
        ],
        [{"id": "p1", "type": "openai_compat", "adapter": "api"}],
    )
    reply = await adapter_set.for_provider("p1").complete(chat("via endpoint"))
    assert reply.status == 200
    assert fake.requests[-1].path == "/v1/chat/completions"


async def test_one_connection_pool_per_adapter_instance_shared_by_its_providers(
    sets: SetFactory,
) -> None:
    peers: list[tuple[str, int]] = []
    answer = {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
    }

    async def handler(request: web.Request) -> web.Response:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        await request.read()
        return web.json_response(answer)

    async with serve("/v1/chat/completions", handler) as origin:
        base_url = f"{origin}/v1"
        adapter_set = sets(
            [
                {"name": "api", "type": "openai_compat", "base_url": base_url},
                {"name": "other", "type": "openai_compat", "base_url": base_url},
            ],
            [
                {"id": "p1", "type": "openai_compat", "adapter": "api"},
                {"id": "p2", "type": "openai_compat", "adapter": "api"},
                {"id": "p3", "type": "openai_compat", "adapter": "other"},
            ],
        )
        for provider in ("p1", "p2", "p1", "p3"):
            reply = await adapter_set.for_provider(provider).complete(chat())
            assert reply.status == 200
        await adapter_set.aclose()
    # p1 and p2 reuse one kept-alive connection of adapter "api"; p3 has its own pool.
    assert peers[0] == peers[1] == peers[2]
    assert peers[3] != peers[0]


# -- issue 15: the answer's model, embeddings, x-request-id ------------------------------------


def test_with_model_replaces_the_compact_pair_in_the_bytes_or_re_encodes() -> None:
    raw = b'{"id":"x","model":"fake-model","choices":[]}'
    assert with_model(raw, orjson.loads(raw), "group") == (
        b'{"id":"x","model":"group","choices":[]}'
    )
    assert with_model(raw, orjson.loads(raw), "fake-model") is raw  # nothing to do
    spaced = b'{"id": "x", "model": "fake-model"}'
    assert orjson.loads(with_model(spaced, orjson.loads(spaced), "group")) == {
        "id": "x",
        "model": "group",
    }
    # Twice the same pair (a nested object): never guess which is the key, re-encode.
    twice = b'{"model":"m","extra":{"model":"m"}}'
    assert orjson.loads(with_model(twice, orjson.loads(twice), "g")) == {
        "model": "g",
        "extra": {"model": "m"},
    }


async def test_every_streamed_chunk_names_the_clients_model(
    executor: Executor, fake: FakeOpenAI
) -> None:
    call = chat(stream=True, model="my-group", stream_options={"include_usage": True})
    chunks = payloads(await collect(await executor.open_stream(call)))
    assert fake.requests[-1].json["model"] == "fake-model"
    assert {c["model"] for c in chunks[:-1]} == {"my-group"}


async def test_a_streamed_chunk_in_another_spelling_is_re_encoded(sets: SetFactory) -> None:
    async def spaced(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"id": "c", "model": "up", "choices": []}\n\n')
        await response.write(b"data: [DONE]\n\n")
        return response

    async with serve("/v1/chat/completions", spaced) as origin:
        executor = provider_set(sets, f"{origin}/v1").for_provider("p1")
        chunks = payloads(await collect(await executor.open_stream(chat(stream=True, model="g"))))
    assert chunks == [{"id": "c", "model": "g", "choices": []}, "[DONE]"]


async def test_embeddings_pass_through_with_the_clients_model(
    executor: Executor, fake: FakeOpenAI
) -> None:
    body = {"model": "embed", "input": ["a b"], "encoding_format": "float", "dimensions": 4}
    call = UpstreamCall("embeddings", body, "fake-model", False, {}, "rid-9", "embed")
    reply = await executor.complete(call)
    assert isinstance(reply, UpstreamReply)
    sent = fake.requests[-1]
    assert sent.path == "/v1/embeddings"
    assert sent.json == {**body, "model": "fake-model"}  # no stream field added
    assert sent.headers["x-request-id"] == "rid-9"
    answer = orjson.loads(reply.body)
    assert answer["model"] == "embed"
    assert answer["data"][0]["embedding"] == fake_embedding("a b", 4)
    assert reply.usage.prompt_tokens == 2


def scripted(events: list[bytes]) -> Callable[[web.Request], Any]:
    """An upstream that streams exactly ``events`` (each one SSE ``data:`` payload), arriving
    in one piece and split across reads alike, then ``[DONE]``."""

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        body = b"".join(b"data: " + event + b"\n\n" for event in events) + b"data: [DONE]\n\n"
        half = len(body) // 2  # (a line cut in two by the network)
        await response.write(body[:half])
        await response.write(body[half:])
        return response

    return stream


async def test_streamed_events_keep_usage_errors_and_the_clients_model_exact(
    sets: SetFactory,
) -> None:
    """Events like the first are relayed without being decoded: the upstream's ``"usage":null``
    hidden, its model replaced in the bytes. Any other — the usage, an event spelling the model
    otherwise or naming another one — is parsed, so usage stays exact and the model right."""
    chunk = b'{"id":"c","model":"up","choices":[{"index":0,"delta":{"content":"%s"}}],"usage":null}'
    events = [
        chunk % b"a",
        chunk % b'\\"usage\\": \\"error\\"',  # (words of the answer, not fields)
        b'{"id":"c","model": "up","choices":[{"index":0,"delta":{"content":"b"}}],"usage":null}',
        b'{"id":"c","model":"other","choices":[{"index":0,"delta":{"content":"c"}}]}',
        chunk % b"d",
        b'{"id":"c","model":"up","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":4}}',
    ]
    async with serve("/v1/chat/completions", scripted(events)) as origin:
        executor = provider_set(sets, f"{origin}/v1").for_provider("p1")
        stream = await executor.open_stream(chat(stream=True, model="g"))
        chunks = payloads(await collect(stream))
    assert [c["choices"][0]["delta"]["content"] for c in chunks[:-1]] == [
        "a",
        '"usage": "error"',
        "b",
        "c",
        "d",
    ]
    assert {c["model"] for c in chunks[:-1]} == {"g"}
    assert all("usage" not in c for c in chunks[:-1])  # the client did not ask for it
    assert chunks[-1] == "[DONE]"
    assert (stream.usage.prompt_tokens, stream.usage.completion_tokens) == (7, 4)


@pytest.mark.parametrize(
    "bad",
    [
        b'{"id":"c","model":"up","choices":[{"delta":',  # cut short: not framed as an object
        b'{"error":{"message":"overloaded"}}',  # an error in the stream, after normal events
    ],
)
async def test_a_broken_event_after_normal_ones_is_still_an_upstream_error(
    sets: SetFactory, bad: bytes
) -> None:
    chunk = b'{"id":"c","model":"up","choices":[{"index":0,"delta":{"content":"x"}}]}'
    async with serve("/v1/chat/completions", scripted([chunk, chunk, bad])) as origin:
        executor = provider_set(sets, f"{origin}/v1").for_provider("p1")
        frames, error = await frames_until_error(
            await executor.open_stream(chat(stream=True, model="g"))
        )
    assert len(frames) == 2  # the normal events reach the client first
    assert isinstance(error, AdapterError)
    assert error.code == "upstream_error"


def paced(groups: list[list[bytes]], sent: list[asyncio.Event]) -> Callable[[web.Request], Any]:
    """An upstream that writes each group of SSE ``data:`` payloads in one write and waits for
    the test to set the group's event (it has read what came) before the next; ``[DONE]`` is
    the last group's own write. Runs of ordinary events then reach the edge as whole reads."""

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for group, read in zip(groups, sent, strict=True):
            await response.write(b"".join(b"data: " + event + b"\n\n" for event in group))
            await read.wait()
        await response.write(b"data: [DONE]\n\n")
        return response

    return stream


CHUNK = b'{"id":"c","model":"up","choices":[{"index":0,"delta":{"content":"%s"}}],"usage":null}'


async def read_paced(
    sets: SetFactory, groups: list[list[bytes]]
) -> tuple[list[bytes], AdapterError | None, UpstreamStream]:
    """The frames relayed for ``groups`` (read group by group: the next is written once the
    frames of this one came; a usage-only event is hidden, so it has none), and the error that
    ended them."""
    sent = [asyncio.Event() for _ in groups]
    frames: list[bytes] = []
    expected = 0
    async with serve("/v1/chat/completions", paced(groups, sent)) as origin:
        executor = provider_set(sets, f"{origin}/v1").for_provider("p1")
        stream = await executor.open_stream(chat(stream=True, model="g"))
        assert isinstance(stream, UpstreamStream)
        async with asyncio.timeout(10), stream:
            try:
                for group, read in zip(groups, sent, strict=True):
                    expected += sum(1 for event in group if b'"usage":{' not in event)
                    while len(frames) < expected:
                        frames.extend(split_frames(await anext(stream.frames)))
                    read.set()
                frames.extend(split_frames(b"".join([piece async for piece in stream.frames])))
            except AdapterError as exc:
                return frames, exc, stream
    return frames, None, stream


async def test_whole_reads_of_ordinary_events_keep_the_rules_of_each_event(
    sets: SetFactory,
) -> None:
    """A network read of events like the first is relayed as a block (model replaced, our
    ``"usage":null`` hidden, in one pass); a read holding anything else — an event naming
    another model, the usage — goes event by event, so the model and the usage stay exact."""
    groups = [
        [CHUNK % b"a"],
        [CHUNK % b"b", CHUNK % b"c", CHUNK % b"d"],
        [CHUNK % b"e", b'{"id":"c","model":"other","choices":[{"delta":{"content":"f"}}]}'],
        [
            CHUNK % b"g",
            b'{"id":"c","model":"up","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":4}}',
        ],
    ]
    frames, error, stream = await read_paced(sets, groups)
    assert error is None
    chunks = payloads(frames)
    assert chunks[-1] == "[DONE]"
    assert [content_of([c]) for c in chunks[:-1]] == list("abcdefg")
    assert {c["model"] for c in chunks[:-1]} == {"g"}
    assert all("usage" not in c for c in chunks[:-1])  # the client did not ask for it
    assert (
        frames[1]
        == b"data: "
        + (CHUNK % b"b").replace(b',"usage":null', b"").replace(b'"model":"up"', b'"model":"g"')
        + b"\n\n"
    )
    assert (stream.usage.prompt_tokens, stream.usage.completion_tokens) == (7, 4)


@pytest.mark.parametrize(
    "bad",
    [
        b'{"error":{"message":"overloaded"}}',
        b'{"id":"c","model":"up","choices":[],"error":{"message":"overloaded"}}',
        b'{"id":"c","model":"up","choices":[{"delta":',  # cut short: not framed as an object
    ],
)
async def test_an_error_inside_a_read_of_ordinary_events_is_seen(
    sets: SetFactory, bad: bytes
) -> None:
    groups = [[CHUNK % b"a"], [CHUNK % b"b", bad, CHUNK % b"c"]]
    frames, error, _ = await read_paced(sets, groups)
    assert isinstance(error, AdapterError)
    assert error.code == "upstream_error"
    assert [content_of([c]) for c in payloads(frames)] == ["a", "b"]  # what came before it


async def test_a_usage_spelt_otherwise_inside_a_run_is_still_read(sets: SetFactory) -> None:
    spaced = (
        b'{"id":"c","model":"up","choices":[{"index":0,"delta":{"content":"x"}}],'
        b'"usage": {"prompt_tokens":3,"completion_tokens":2}}'
    )
    groups = [[CHUNK % b"a"], [CHUNK % b"b", spaced, CHUNK % b"c"]]
    frames, error, stream = await read_paced(sets, groups)
    assert error is None
    assert [content_of([c]) for c in payloads(frames)[:-1]] == ["a", "b", "x", "c"]
    assert (stream.usage.prompt_tokens, stream.usage.completion_tokens) == (3, 2)

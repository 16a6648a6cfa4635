"""The fake OpenAI upstream speaks the real protocol: the official ``openai`` SDK is its client."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from iop_edge.testing.fake_behavior import BEHAVIOR_HEADER, FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.fake_upstream import shape_reply, split_reply

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "first question"},
    {"role": "assistant", "content": "first answer"},
    {"role": "user", "content": "tell me three words"},
]
"""Prompt: 2 + 2 + 2 + 4 = 10 words; the reply echoes the last user message (4 words)."""


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def client(fake: FakeOpenAI) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=fake.base_url, api_key="sk-upstream", max_retries=0
    ) as sdk:
        yield sdk


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as http:
        yield http


def chat_body(content: str = "tell me three words", **extra: object) -> dict[str, object]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], **extra}


async def read_lines(response: aiohttp.ClientResponse, into: list[bytes]) -> None:
    """Append every line of a response body to ``into`` as it arrives."""
    async for line in response.content:
        into.append(line)


async def read_sse(response: aiohttp.ClientResponse) -> list[str]:
    """Return the data fields of every SSE event of a response."""
    text = (await response.read()).decode()
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(event.startswith("data: ") for event in events), events
    return [event[len("data: ") :] for event in events]


# -- the protocol, through the SDK -----------------------------------------------------------


async def test_chat_completion_echoes_last_user_message_with_usage(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """A non-streaming chat is a `chat.completion` with the echo and word-count usage."""
    completion = await client.chat.completions.create(model="gpt-x", messages=MESSAGES)

    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == "gpt-x"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "tell me three words"
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (10, 4)
    assert completion.usage.total_tokens == 14

    recorded = fake.requests[-1]
    assert (recorded.method, recorded.path) == ("POST", "/v1/chat/completions")
    assert recorded.headers["Authorization"] == "Bearer sk-upstream"
    assert recorded.json["model"] == "gpt-x"
    assert recorded.json["messages"] == MESSAGES
    assert fake.statistics().completed == 1


async def test_chat_stream_is_role_content_finish_chunks(client: openai.AsyncOpenAI) -> None:
    """A stream: role chunk, one content chunk per word, a finish chunk, and no usage chunk."""
    stream = await client.chat.completions.create(
        model="fake-model",
        messages=MESSAGES,
        stream=True,
    )
    chunks = [chunk async for chunk in stream]

    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [chunk.choices[0].delta.content for chunk in chunks[1:-1]] == [
        "tell ",
        "me ",
        "three ",
        "words",
    ]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(chunk.usage is None and chunk.choices for chunk in chunks)


async def test_chat_stream_include_usage_sends_final_usage_chunk(
    client: openai.AsyncOpenAI,
) -> None:
    """`stream_options.include_usage` adds a last chunk with empty choices and the usage."""
    stream = await client.chat.completions.create(
        model="fake-model",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]

    *content, last = chunks
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (10, 4)
    assert all(chunk.usage is None for chunk in content)
    assert content[-1].choices[0].finish_reason == "stop"


async def test_sync_client_chat_and_stream(fake: FakeOpenAI) -> None:
    """The synchronous SDK client (run in a thread, the fake in this loop) works both ways."""

    def use_sync_client() -> tuple[str | None, str]:
        with openai.OpenAI(base_url=fake.base_url, api_key="sk", max_retries=0) as sdk:
            completion = sdk.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "sync hello"}]
            )
            stream = sdk.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": "sync stream"}],
                stream=True,
            )
            streamed = "".join(
                chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices
            )
        return completion.choices[0].message.content, streamed

    assert await asyncio.to_thread(use_sync_client) == ("sync hello", "sync stream")
    assert fake.total_requests == 2


async def test_legacy_completions_streaming_and_not(client: openai.AsyncOpenAI) -> None:
    """`/v1/completions` answers `text_completion` objects; `max_tokens` cuts with `length`."""
    completion = await client.completions.create(
        model="fake-model", prompt="one two three four", max_tokens=2
    )
    assert completion.object == "text_completion"
    assert completion.choices[0].text == "one two "
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (4, 2)

    stream = await client.completions.create(
        model="fake-model",
        prompt="one two three",
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == "one two three"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3


async def test_models_list(client: openai.AsyncOpenAI) -> None:
    """`GET /v1/models` is an OpenAI list of model objects."""
    models = [model async for model in client.models.list()]
    assert [(model.id, model.object) for model in models] == [("fake-model", "model")]


async def test_stop_and_max_completion_tokens_shape_the_reply(client: openai.AsyncOpenAI) -> None:
    """`stop` cuts at the first stop sequence; `max_completion_tokens` caps the chunks."""
    stopped = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "alpha beta. gamma"}], stop=["."]
    )
    assert stopped.choices[0].message.content == "alpha beta"
    assert stopped.choices[0].finish_reason == "stop"

    capped = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "a b c d e"}],
        max_completion_tokens=3,
    )
    assert capped.choices[0].message.content == "a b c "
    assert capped.choices[0].finish_reason == "length"


# -- errors ----------------------------------------------------------------------------------


async def test_status_500_raises_sdk_internal_server_error(client: openai.AsyncOpenAI) -> None:
    """`x-fake-behavior: status=500` answers 500 with the OpenAI error envelope."""
    behavior = FakeBehavior(status=500, error_message="upstream exploded", error_code="boom")
    with pytest.raises(openai.InternalServerError) as caught:
        await client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            extra_headers={BEHAVIOR_HEADER: behavior.to_query()},
        )
    assert caught.value.status_code == 500
    assert caught.value.body == {
        "message": "upstream exploded",
        "type": "server_error",
        "param": None,
        "code": "boom",
    }


async def test_retry_after_rides_on_an_error_status(client: openai.AsyncOpenAI) -> None:
    """`retry_after` adds a `Retry-After` header to the error answer (a throttling server)."""
    behavior = FakeBehavior(status=429, retry_after="7")
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers={BEHAVIOR_HEADER: behavior.to_query()}
        )
    assert caught.value.response.headers["Retry-After"] == "7"
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi [[fake:status=429]]"}]
        )
    assert "Retry-After" not in caught.value.response.headers


async def test_listing_behavior_fails_the_model_list_while_chat_works(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """`listing` is what `GET /v1/models` gets (a health check failing on a live server)."""
    fake.listing = FakeBehavior(status=503)
    with pytest.raises(openai.InternalServerError) as caught:
        await client.models.list()
    assert caught.value.status_code == 503
    reply = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert reply.choices[0].message.content == "tell me three words"
    fake.listing = FakeBehavior()
    assert [model.id async for model in client.models.list()] == ["fake-model"]


async def test_directive_in_user_message_selects_behavior(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """A `[[fake:...]]` directive works where headers cannot reach, and is not echoed."""
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi [[fake:status=429]]"}]
        )
    reply = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi [[fake:reply=fixed%20text]] there"}]
    )
    assert reply.choices[0].message.content == "fixed text"
    assert fake.requests[-1].behavior.reply == "fixed text"


async def test_api_key_is_checked_when_configured() -> None:
    """With `api_key`, a wrong bearer gets 401 `invalid_api_key` (SDK AuthenticationError)."""
    async with (
        FakeOpenAI(api_key="right") as fake,
        openai.AsyncOpenAI(base_url=fake.base_url, api_key="wrong", max_retries=0) as sdk,
    ):
        with pytest.raises(openai.AuthenticationError) as caught:
            await sdk.chat.completions.create(model="m", messages=MESSAGES)
        assert caught.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            await sdk.models.list()
        sdk_ok = sdk.with_options(api_key="right")
        assert (await sdk_ok.chat.completions.create(model="m", messages=MESSAGES)).choices


async def test_strict_models_rejects_unknown_model() -> None:
    """With `strict_models`, an unlisted model is 404 `model_not_found` (SDK NotFoundError)."""
    async with (
        FakeOpenAI(models=["known"], strict_models=True) as fake,
        openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0) as sdk,
    ):
        with pytest.raises(openai.NotFoundError) as caught:
            await sdk.chat.completions.create(model="unknown", messages=MESSAGES)
        assert caught.value.code == "model_not_found"
        assert (await sdk.chat.completions.create(model="known", messages=MESSAGES)).choices


async def test_malformed_body_and_behavior_are_400_envelopes(
    fake: FakeOpenAI, session: aiohttp.ClientSession
) -> None:
    """Bad JSON, a missing field and an unknown behaviour field are 400s that say what is wrong."""
    url = f"{fake.base_url}/chat/completions"
    async with session.post(url, data=b"{not json") as response:
        assert response.status == 400
        assert (await response.json())["error"]["type"] == "invalid_request_error"
    async with session.post(url, json={"model": "m"}) as response:
        assert response.status == 400
        error = (await response.json())["error"]
        assert (error["param"], error["code"]) == ("messages", "missing_required_parameter")
    async with session.post(url, json=chat_body(), headers={BEHAVIOR_HEADER: "lag=1"}) as response:
        assert response.status == 400
        assert "lag: unknown fake behaviour field" in (await response.json())["error"]["message"]
    assert len(fake.requests) == 3


# -- wire format and faults ------------------------------------------------------------------


async def test_sse_wire_format_and_exact_chunk_count(
    fake: FakeOpenAI, session: aiohttp.ClientSession
) -> None:
    """Each SSE event is one JSON chunk, `chunks=5` gives five content events, then `[DONE]`."""
    fake.behavior = FakeBehavior(reply="abcdefghij", chunks=5)
    async with session.post(
        f"{fake.base_url}/chat/completions", json=chat_body(stream=True)
    ) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = await read_sse(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert [chunk["choices"][0]["delta"] for chunk in chunks] == [
        {"role": "assistant", "content": "", "refusal": None},
        {"content": "ab"},
        {"content": "cd"},
        {"content": "ef"},
        {"content": "gh"},
        {"content": "ij"},
        {},
    ]
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks][-2:] == [None, "stop"]


async def test_reset_mid_stream_truncates_after_n_frames(
    fake: FakeOpenAI, session: aiohttp.ClientSession
) -> None:
    """`fault=reset&fault_after=2`: two events arrive, then the connection closes early."""
    headers = {BEHAVIOR_HEADER: "fault=reset&fault_after=2"}
    received: list[bytes] = []
    async with session.post(
        f"{fake.base_url}/chat/completions", json=chat_body(stream=True), headers=headers
    ) as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await read_lines(response, received)
    events = [line for line in received if line.startswith(b"data: ")]
    assert len(events) == 2
    assert json.loads(events[1][6:])["choices"][0]["delta"] == {"content": "tell "}


async def test_disconnect_before_response_is_sdk_connection_error(
    client: openai.AsyncOpenAI,
) -> None:
    """`fault=disconnect` closes without a response: the SDK raises APIConnectionError."""
    with pytest.raises(openai.APIConnectionError):
        await client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            extra_headers={BEHAVIOR_HEADER: "fault=disconnect"},
        )


async def test_error_fault_mid_stream_raises_sdk_api_error(client: openai.AsyncOpenAI) -> None:
    """`fault=error` sends OpenAI's in-stream `{"error": ...}` event after N frames."""
    stream = await client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        stream=True,
        extra_headers={BEHAVIOR_HEADER: "fault=error&fault_after=1&error_message=died"},
    )
    seen: list[ChatCompletionChunk] = []

    async def consume() -> None:
        async for chunk in stream:
            seen.append(chunk)

    with pytest.raises(openai.APIError, match="died"):
        await consume()
    assert len(seen) == 1


async def test_malformed_fault_breaks_json(
    fake: FakeOpenAI, session: aiohttp.ClientSession
) -> None:
    """`fault=malformed`: a stream gets an unparsable event; a plain body is cut short."""
    headers = {BEHAVIOR_HEADER: "fault=malformed&fault_after=1"}
    url = f"{fake.base_url}/chat/completions"
    async with session.post(url, json=chat_body(stream=True), headers=headers) as response:
        events = await read_sse(response)
    assert len(events) == 2
    json.loads(events[0])
    with pytest.raises(json.JSONDecodeError):
        json.loads(events[1])

    async with session.post(url, json=chat_body(), headers=headers) as response:
        assert response.status == 200
        body = await response.read()
    assert len(body) == int(response.headers["Content-Length"])
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)


async def test_stall_holds_until_client_gives_up(
    fake: FakeOpenAI, session: aiohttp.ClientSession
) -> None:
    """`fault=stall` keeps the request in flight until the client disconnects, then counts it."""
    headers = {BEHAVIOR_HEADER: "fault=stall&fault_after=1"}
    async with session.post(
        f"{fake.base_url}/chat/completions", json=chat_body(stream=True), headers=headers
    ) as response:
        first = await response.content.readline()
        assert first.startswith(b"data: ")
        assert fake.in_flight == 1
        response.close()  # the client gives up
    async with asyncio.timeout(5):
        await fake.wait_idle()
    assert fake.statistics().cancelled == 1


async def test_close_ends_stalled_and_held_requests() -> None:
    """Closing the fake cancels a stalled stream and a held request instead of hanging."""
    fake = FakeOpenAI()
    await fake.start()
    try:
        async with aiohttp.ClientSession() as session:
            url = f"{fake.base_url}/chat/completions"
            stalled = session.post(
                url, json=chat_body(stream=True), headers={BEHAVIOR_HEADER: "fault=stall"}
            )
            held = asyncio.ensure_future(
                session.post(url, json=chat_body(), headers={BEHAVIOR_HEADER: "hold=true"})
            )
            async with stalled as response:
                async with asyncio.timeout(5):
                    await fake.wait_in_flight(2)
                await fake.close()
                with pytest.raises(aiohttp.ClientPayloadError):
                    await response.read()
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await held
    finally:
        await fake.close()
    assert fake.statistics().cancelled == 2


async def test_latency_and_first_chunk_delay(
    fake: FakeOpenAI, session: aiohttp.ClientSession
) -> None:
    """`latency` delays the headers; `first_chunk_delay` delays the body after the headers."""
    headers = {BEHAVIOR_HEADER: "latency=0.05&first_chunk_delay=0.05"}
    started = time.perf_counter()
    async with session.post(
        f"{fake.base_url}/chat/completions", json=chat_body(stream=True), headers=headers
    ) as response:
        headers_at = time.perf_counter()
        await response.content.readline()
        first_at = time.perf_counter()
        await response.read()
    assert headers_at - started >= 0.05
    assert first_at - headers_at >= 0.04


# -- control and observation -----------------------------------------------------------------


async def test_hold_counts_in_flight_until_release(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """Held requests stay in flight; `wait_in_flight` wakes on the count; `release` ends them."""
    fake.behavior = FakeBehavior(hold=True)
    tasks = [
        asyncio.create_task(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"n{i}"}]
            )
        )
        for i in range(3)
    ]
    async with asyncio.timeout(5):
        await fake.wait_in_flight(3)
    assert (fake.in_flight, fake.max_in_flight, fake.completed) == (3, 3, 0)
    fake.release()
    replies = await asyncio.gather(*tasks)
    assert sorted(reply.choices[0].message.content or "" for reply in replies) == [
        "n0",
        "n1",
        "n2",
    ]
    assert fake.statistics() == fake.statistics().__class__(
        total_requests=3,
        in_flight=0,
        max_in_flight=3,
        completed=3,
        cancelled=0,
        max_open_connections=3,  # (the three held at once came on three connections)
    )


async def test_enqueued_and_runtime_behaviors(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    """Queued behaviours apply to the next requests in order; the default changes live."""
    fake.enqueue(FakeBehavior(status=503), FakeBehavior(reply="second"))
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="m", messages=MESSAGES)
    second = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert second.choices[0].message.content == "second"
    fake.behavior = FakeBehavior(reply="default now")
    third = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert third.choices[0].message.content == "default now"


async def test_recording_is_bounded_and_listing_is_not_counted() -> None:
    """Only the last `record_limit` requests are kept; model listings are not generation load."""
    async with (
        FakeOpenAI(record_limit=2) as fake,
        openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0) as sdk,
    ):
        for word in ("one", "two", "three"):
            await sdk.chat.completions.create(
                model="m", messages=[{"role": "user", "content": word}]
            )
        await sdk.models.list()
        assert [request.path for request in fake.requests] == [
            "/v1/chat/completions",
            "/v1/models",
        ]
        assert fake.requests[0].json["messages"][0]["content"] == "three"
        assert fake.total_requests == 3
        fake.clear()
        assert (len(fake.requests), fake.max_in_flight) == (0, 0)


# -- pure helpers ----------------------------------------------------------------------------


def test_behavior_query_round_trip_and_validation() -> None:
    """A behaviour encodes to a query string and back; bad values name the field."""
    behavior = FakeBehavior(reply="a&b=c d", chunks=3, fault="reset", fault_after=2, hold=True)
    assert FakeBehavior().with_overrides(behavior.to_query()) == behavior
    assert behavior.directive() == f"[[fake:{behavior.to_query()}]]"
    with pytest.raises(ValueError, match="fault: 'boom' is invalid"):
        FakeBehavior().with_overrides("fault=boom")
    with pytest.raises(ValueError, match="latency: -1"):
        FakeBehavior(latency=-1)


def test_split_and_shape_reply() -> None:
    """Splitting keeps every character; stop and max_tokens set the finish reason."""
    assert split_reply("a  b ", None) == ["a ", " ", "b "]
    assert split_reply("abc", 5) == ["", "a", "", "b", "c"]
    assert "".join(split_reply("hello world", 4)) == "hello world"
    assert shape_reply("x y z", None, max_tokens=2, stop=None) == (["x ", "y "], "length")
    assert shape_reply("x y\nz", None, max_tokens=None, stop="\n") == (["x ", "y"], "stop")

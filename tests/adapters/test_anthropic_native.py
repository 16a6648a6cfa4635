"""Issue 27 passthrough: Anthropic Messages relayed by ``openai_compat`` to an upstream that
serves them itself (``native_apis: [messages]``) — the body untouched but for ``model``, the
answer and the event stream as they came but for ``model``, usage from ``message_start`` and
``message_delta``, the upstream's errors as they came, an error event relayed and then failed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest

from iop_edge.adapters import AdapterSet, Executor, UpstreamCall, UpstreamReply
from iop_edge.adapters.base import UnsupportedRequestError
from iop_edge.errors import AdapterError
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers.adapters import (
    CannedUpstream,
    chat,
    collect,
    frames_until_error,
    run_call,
    serve,
)

SetFactory = Callable[..., AdapterSet]

BODY: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 1024,
    "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": "tell me three words"}],
    "metadata": {"user_id": "u-1"},
    "x_vendor": {"nested": [1, {"deep": None}]},
}


def messages(
    *,
    stream: bool = False,
    endpoint: str = "messages",
    target: str = "fake-model",
    headers: dict[str, str] | None = None,
    body: dict[str, Any] | None = None,
) -> UpstreamCall:
    """A Messages call; the client asked for ``claude-sonnet-4-5`` (the answers' model)."""
    return UpstreamCall(
        endpoint=endpoint,  # type: ignore[arg-type]  # (each test names a real one)
        body=dict(BODY if body is None else body),
        target=target,
        stream=stream,
        headers=headers or {},
        request_id="req-7",
        model="claude-sonnet-4-5",
    )


def provider_set(sets: SetFactory, base_url: str, **provider: Any) -> AdapterSet:
    return sets(
        [{"name": "api", "type": "openai_compat", "base_url": base_url}],
        [
            {
                "id": "p1",
                "type": "openai_compat",
                "adapter": "api",
                "native_apis": ["messages"],
                **provider,
            }
        ],
    )


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
def executor(sets: SetFactory, fake: FakeOpenAI) -> Executor:
    return provider_set(sets, fake.base_url).for_provider("p1")


async def run_upstream(
    sets: SetFactory, upstream: CannedUpstream, call: UpstreamCall, path: str = "/v1/messages"
) -> Any:
    """The executor's result for ``call`` against ``upstream`` (a stream's frames collected,
    with its error, or None, and its usage)."""
    async with serve(path, upstream.handle) as origin:
        got = await run_call(provider_set(sets, f"{origin}/v1").for_provider("p1"), call)
    if isinstance(got, UpstreamReply):
        return got
    return got.frames, got.error, got.stream.usage


def test_only_an_openai_compat_provider_that_declares_it_has_native_apis(sets):
    adapter_set = sets(
        [
            {"name": "api", "type": "openai_compat", "base_url": "http://127.0.0.1:9/v1"},
            {"name": "ol", "type": "ollama", "base_url": "http://127.0.0.1:9"},
            {"name": "sh", "type": "cli", "command": "cat"},
        ],
        [
            {
                "id": "native",
                "type": "openai_compat",
                "adapter": "api",
                "native_apis": ["messages"],
            },
            {"id": "chat", "type": "openai_compat", "adapter": "api"},
            {"id": "ollama", "type": "ollama", "adapter": "ol"},
            {"id": "agent", "type": "cli", "adapter": "sh"},
        ],
    )
    found = {
        p: adapter_set.for_provider(p).native_apis for p in ("native", "chat", "ollama", "agent")
    }
    assert found == {
        "native": frozenset({"messages"}),
        "chat": frozenset(),
        "ollama": frozenset(),
        "agent": frozenset(),
    }


async def test_the_body_goes_through_untouched_but_for_model_and_the_answer_names_the_clients_model(
    executor, fake
):
    reply = await executor.complete(messages())
    sent = fake.requests[-1]
    assert sent.path == "/v1/messages"
    assert sent.json == {**BODY, "model": "fake-model"}
    assert list(sent.json) == list(BODY)  # field order kept, model replaced in place
    assert reply.status == 200
    answer = orjson.loads(reply.body)
    assert answer["model"] == "claude-sonnet-4-5"
    assert answer["content"] == [{"type": "text", "text": "tell me three words"}]
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (6, 4)


async def test_a_message_is_relayed_byte_for_byte_but_for_model_and_usage_counts_cached_input(
    sets,
):
    raw = (
        b'{"id":"msg_1","type":"message","role":"assistant","model":"fake-model",'
        b'"content":[{"type":"text","text":"hi \\"model\\": no"}],"stop_reason":"end_turn",'
        b'"stop_sequence":null,"usage":{"input_tokens":5,"cache_read_input_tokens":100,'
        b'"cache_creation_input_tokens":20,"output_tokens":7},"x":  1}'
    )
    upstream = CannedUpstream([raw], content_type="application/json")
    reply = await run_upstream(sets, upstream, messages())
    assert reply.body == raw.replace(b'"model":"fake-model"', b'"model":"claude-sonnet-4-5"')
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (125, 7)


async def test_only_the_calls_headers_reach_the_upstream(executor, fake):
    await executor.complete(chat("plain"))
    baseline = {name.lower() for name in fake.requests[-1].headers}
    forwarded = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "interleaved-thinking-2025-05-14",
        "Authorization": "Bearer provider-key",
    }
    await executor.complete(messages(headers=forwarded))
    got = fake.requests[-1].headers
    assert {name.lower() for name in got} == baseline | {
        "anthropic-version",
        "anthropic-beta",
        "authorization",
    }
    assert {name: got[name] for name in forwarded} == forwarded
    assert "x-api-key" not in got
    assert got["x-request-id"] == "req-7"


async def test_the_endpoint_field_replaces_the_chat_path_only(sets, fake):
    executor = provider_set(sets, fake.base_url, endpoint="/custom/chat").for_provider("p1")
    await executor.complete(messages())
    assert fake.requests[-1].path == "/v1/messages"


async def test_count_tokens_goes_through_and_its_answer_comes_back_as_it_came(executor, fake):
    body = {"model": "claude-sonnet-4-5", "messages": BODY["messages"], "system": "Be brief."}
    reply = await executor.complete(messages(endpoint="messages/count_tokens", body=body))
    sent = fake.requests[-1]
    assert (sent.path, sent.json) == ("/v1/messages/count_tokens", {**body, "model": "fake-model"})
    assert reply.status == 200
    assert reply.body == b'{"input_tokens":6}'
    with pytest.raises(UnsupportedRequestError, match="is not streamed"):
        await executor.open_stream(
            messages(endpoint="messages/count_tokens", body=body, stream=True)
        )


async def test_a_provider_without_native_messages_refuses_them_before_any_io(sets, fake):
    executor = provider_set(sets, fake.base_url, native_apis=[]).for_provider("p1")
    with pytest.raises(UnsupportedRequestError, match="does not serve /v1/messages natively"):
        await executor.complete(messages())
    with pytest.raises(UnsupportedRequestError, match="/v1/messages/count_tokens natively"):
        await executor.complete(messages(endpoint="messages/count_tokens"))
    with pytest.raises(UnsupportedRequestError):
        await executor.open_stream(messages(stream=True))
    assert fake.total_requests == 0


@pytest.mark.parametrize("provider", ["ollama", "agent"])
async def test_ollama_and_cli_refuse_a_messages_call_before_any_io(sets, provider):
    adapter_set = sets(
        [
            {"name": "ol", "type": "ollama", "base_url": "http://127.0.0.1:9"},
            {"name": "sh", "type": "cli", "command": "false"},
        ],
        [
            {"id": "ollama", "type": "ollama", "adapter": "ol"},
            {"id": "agent", "type": "cli", "adapter": "sh"},
        ],
    )
    executor = adapter_set.for_provider(provider)
    with pytest.raises(UnsupportedRequestError) as info:
        await executor.complete(messages())
    assert str(info.value).endswith(
        "serves only /v1/chat/completions; /v1/messages needs translating to chat, or an "
        "openai_compat provider with native_apis"
    )


# --- streams ---------------------------------------------------------------------------------


def event(name: str, data: bytes) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


START = event(
    "message_start",
    b'{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",'
    b'"model":"fake-model","content":[],"stop_reason":null,"stop_sequence":null,'
    b'"usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":1}}}',
)
BLOCKS = (
    event("ping", b'{"type": "ping"}')
    + event(
        "content_block_start",
        b'{"type":"content_block_start","index":0,"content_block":{"type":"thinking",'
        b'"thinking":"","signature":""}}',
    )
    + event(
        "content_block_delta",
        b'{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta",'
        b'"thinking":"a \\"model\\":\\"fake-model\\" thought"}}',
    )
    + event(
        "content_block_delta",
        b'{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta",'
        b'"signature":"c2ln"}}',
    )
    + event("content_block_stop", b'{"type":"content_block_stop","index":0}')
    + event(
        "content_block_start",
        b'{"type":"content_block_start","index":1,"content_block":{"type":"tool_use",'
        b'"id":"toolu_1","name":"Read","input":{}}}',
    )
    + event(
        "content_block_delta",
        b'{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta",'
        b'"partial_json":"{\\"file_path\\": \\"a.py\\"}"}}',
    )
    + event("content_block_stop", b'{"type":"content_block_stop","index":1}')
)
DELTA = event(
    "message_delta",
    b'{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},'
    b'"usage":{"input_tokens":12,"output_tokens":42}}',
)
STOP = event("message_stop", b'{"type":"message_stop"}')
STREAM = START + BLOCKS + DELTA + STOP
RELAYED_START = START.replace(b'"model":"fake-model"', b'"model":"claude-sonnet-4-5"')
RELAYED = RELAYED_START + BLOCKS + DELTA + STOP


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda raw: [raw], id="in-one-read"),
        pytest.param(lambda raw: [raw[i : i + 7] for i in range(0, len(raw), 7)], id="7-bytes"),
        pytest.param(lambda raw: [raw[:1], raw[1:-1], raw[-1:]], id="edges"),
    ],
)
async def test_the_stream_is_relayed_byte_for_byte_but_for_model_in_message_start(sets, cut):
    upstream = CannedUpstream(cut(STREAM))
    relayed, error, usage = await run_upstream(sets, upstream, messages(stream=True))
    assert error is None
    assert relayed == RELAYED
    assert upstream.received == [("/v1/messages", {**BODY, "model": "fake-model", "stream": True})]
    # message_start: 10 + 5 cached; message_delta's later input figure replaces 10 with 12
    assert (usage.prompt_tokens, usage.completion_tokens) == (17, 42)


async def test_events_other_than_start_delta_and_error_are_not_decoded(sets):
    # (their bytes are relayed as they came: decoding every event was a chat stream's most CPU)
    odd = event("content_block_delta", b"{not json, and never read}")
    relayed, error, _ = await run_upstream(
        sets, CannedUpstream([START + odd + DELTA + STOP]), messages(stream=True)
    )
    assert error is None
    assert odd in relayed


async def test_events_framed_otherwise_are_framed_exactly(sets):
    upstream = CannedUpstream(
        [
            b": keep-alive\r\n\r\n",
            START.replace(b"\n", b"\r\n").replace(b"data: ", b"data:"),
            b'id: 3\nevent: content_block_start\ndata: {"type":"content_block_start",\n'
            b'data: "index":0,"content_block":{"type":"text","text":""}}\n\n',
            b'data: {"type":"content_block_stop","index":0}\n\n',  # (no event: field)
            b"event: ping\n\n",  # (no data: never dispatched)
            DELTA,
            STOP,
        ]
    )
    relayed, error, _ = await run_upstream(sets, upstream, messages(stream=True))
    assert error is None
    assert relayed == (
        RELAYED_START
        + event(
            "content_block_start",
            b'{"type":"content_block_start", "index":0,"content_block":{"type":"text","text":""}}',
        )
        + event("content_block_stop", b'{"type":"content_block_stop","index":0}')
        + DELTA
        + STOP
    )


async def test_an_upstream_error_event_is_relayed_as_it_came_then_the_stream_fails(sets):
    error_event = event(
        "error",
        b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}',
    )
    upstream = CannedUpstream([START + BLOCKS[:200], BLOCKS[200:] + error_event + b"event: ping\n"])
    relayed, error, _ = await run_upstream(sets, upstream, messages(stream=True))
    assert relayed == RELAYED_START + BLOCKS + error_event
    assert isinstance(error, AdapterError)
    assert (error.code, error.failure, error.failover, error.error_relayed) == (
        "upstream_error",
        "protocol",
        False,
        True,
    )
    assert "reported an error mid-stream (relayed to the client): overloaded_error: Overloaded" in (
        str(error)
    )


async def test_a_stream_that_ends_before_message_stop_fails_without_relaying_an_end(sets):
    relayed, error, _ = await run_upstream(
        sets, CannedUpstream([START, DELTA]), messages(stream=True)
    )
    assert relayed == RELAYED_START + DELTA
    assert isinstance(error, AdapterError)
    assert error.error_relayed is False
    assert str(error).endswith("failed: the stream ended before event: message_stop")


async def test_an_error_event_cut_by_the_end_of_the_body_is_not_relayed(sets):
    error_event = b'event: error\ndata: {"type":"error","error":{"type":"api_error"}}\n\r'
    relayed, error, _ = await run_upstream(
        sets, CannedUpstream([START, error_event]), messages(stream=True)
    )
    assert relayed == RELAYED_START
    assert isinstance(error, AdapterError)
    assert error.error_relayed is False
    assert "reported an error mid-stream: api_error" in str(error)


async def test_a_broken_message_start_fails_before_anything_is_relayed(sets):
    broken = event("message_start", b'{"type":"message_start","message":')
    relayed, error, _ = await run_upstream(sets, CannedUpstream([broken]), messages(stream=True))
    assert relayed == b""
    assert isinstance(error, AdapterError)
    assert "an event is not valid JSON" in str(error)


async def test_a_json_answer_to_a_streamed_call_is_an_upstream_error(sets):
    upstream = CannedUpstream([b'{"type":"message"}'], content_type="application/json")
    with pytest.raises(AdapterError, match="a JSON body instead of an event stream"):
        await run_upstream(sets, upstream, messages(stream=True))


async def test_the_fakes_stream_comes_through_the_adapter_with_the_clients_model(executor, fake):
    fake.behavior = FakeBehavior(thinking="hmm", tool_call='Read:{"file_path": "a.py"}')
    frames = await collect(await executor.open_stream(messages(stream=True)))
    names = [frame.split(b"\n", 1)[0] for frame in frames]
    assert names[0] == b"event: message_start"
    assert names[-1] == b"event: message_stop"
    start = orjson.loads(frames[0].split(b"data: ", 1)[1])
    assert start["message"]["model"] == "claude-sonnet-4-5"
    assert fake.requests[-1].json["stream"] is True


async def test_a_reset_mid_stream_is_an_upstream_error_not_relayed_as_an_event(executor, fake):
    fake.behavior = FakeBehavior(fault="reset", fault_after=3)
    frames, error = await frames_until_error(await executor.open_stream(messages(stream=True)))
    assert [frame.split(b"\n", 1)[0] for frame in frames] == [
        b"event: message_start",
        b"event: ping",
        b"event: content_block_start",
    ]
    assert (error.code, error.error_relayed) == ("upstream_error", False)


# --- error statuses --------------------------------------------------------------------------

ANTHROPIC_ERROR = (
    b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}'
)


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "open_stream"])
async def test_an_error_status_comes_back_with_its_body_as_it_came(sets, stream):
    upstream = CannedUpstream([ANTHROPIC_ERROR], status=529, content_type="application/json")
    reply = await run_upstream(sets, upstream, messages(stream=stream))
    assert isinstance(reply, UpstreamReply)
    assert (reply.status, reply.body) == (529, ANTHROPIC_ERROR)
    assert reply.detail == "the upstream answered 529: Overloaded"


async def test_a_429_carries_its_retry_after(sets):
    body = b'{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}'
    upstream = CannedUpstream(
        [body], status=429, content_type="application/json", headers={"Retry-After": "7"}
    )
    reply = await run_upstream(sets, upstream, messages())
    assert (reply.status, reply.body, reply.retry_after) == (429, body, 7.0)


async def test_an_error_body_that_is_not_json_stays_in_the_log(sets):
    upstream = CannedUpstream([b"<html>Bad Gateway</html>"], status=502, content_type="text/html")
    reply = await run_upstream(sets, upstream, messages(stream=True))
    assert reply.status == 502
    assert orjson.loads(reply.body) == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": "The upstream of openai_compat provider 'p1' (adapter 'api') answered "
            "HTTP 502 with a body that is not a JSON error; the edge's log has it under this "
            "request's x-request-id.",
        },
    }
    assert reply.detail == "the upstream answered 502 Bad Gateway: <html>Bad Gateway</html>"


async def test_the_fakes_error_status_comes_back_in_anthropics_shape(executor, fake):
    fake.behavior = FakeBehavior(status=400, error_message="max_tokens: too large")
    reply = await executor.complete(messages())
    assert reply.status == 400
    assert orjson.loads(reply.body) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: too large"},
    }

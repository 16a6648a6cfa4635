"""Issue 28 passthrough: OpenAI Responses relayed by ``openai_compat`` to an upstream that serves
them itself (``native_apis: [responses]``) — the body untouched but for ``model`` and
``stream``, the Response and its event stream as they came but for the Response's ``model``,
usage from the Response, the final Response kept, the upstream's errors as they came, a
failure event relayed and then failed, a stream without its last event failed."""

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
from tests.helpers.adapters import CannedUpstream, Relayed, chat, run_call, serve, split_frames

SetFactory = Callable[..., AdapterSet]

BODY: dict[str, Any] = {
    "model": "gpt-5-codex",
    "instructions": "You are Codex.",
    "input": [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "tell me three words"}],
        }
    ],
    "tools": [
        {
            "type": "function",
            "name": "shell",
            "description": "Runs a command.",
            "strict": False,
            "parameters": {"type": "object", "properties": {"command": {"type": "array"}}},
        }
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "session-1",
    "x_vendor": {"nested": [1, {"deep": None}]},
}
"""A request of Codex's shape; the fake counts 3 + 4 words + 1 tool = 8 input tokens."""


def responses(
    *,
    stream: bool = False,
    target: str = "fake-model",
    headers: dict[str, str] | None = None,
    body: dict[str, Any] | None = None,
) -> UpstreamCall:
    """A Responses call; the client asked for ``gpt-5-codex`` (the answers' model)."""
    return UpstreamCall(
        endpoint="responses",
        body=dict(BODY if body is None else body),
        target=target,
        stream=stream,
        headers=headers or {},
        request_id="req-9",
        model="gpt-5-codex",
    )


def provider_set(sets: SetFactory, base_url: str, **provider: Any) -> AdapterSet:
    return sets(
        [{"name": "api", "type": "openai_compat", "base_url": base_url}],
        [
            {
                "id": "p1",
                "type": "openai_compat",
                "adapter": "api",
                "native_apis": ["responses"],
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
    sets: SetFactory, upstream: CannedUpstream, call: UpstreamCall
) -> UpstreamReply | Relayed:
    """The executor's result for ``call`` against ``upstream``."""
    async with serve("/v1/responses", upstream.handle) as origin:
        return await run_call(provider_set(sets, f"{origin}/v1").for_provider("p1"), call)


async def relay(sets: SetFactory, upstream: CannedUpstream) -> Relayed:
    """What a streamed call relayed from ``upstream``."""
    got = await run_upstream(sets, upstream, responses(stream=True))
    assert isinstance(got, Relayed), got
    return got


def test_native_apis_may_list_responses_alone_or_with_messages(sets):
    adapter_set = sets(
        [{"name": "api", "type": "openai_compat", "base_url": "http://127.0.0.1:9/v1"}],
        [
            {"id": "r", "type": "openai_compat", "adapter": "api", "native_apis": ["responses"]},
            {
                "id": "both",
                "type": "openai_compat",
                "adapter": "api",
                "native_apis": ["messages", "responses"],
            },
        ],
    )
    assert adapter_set.for_provider("r").native_apis == frozenset({"responses"})
    assert adapter_set.for_provider("both").native_apis == frozenset({"messages", "responses"})


async def test_the_body_goes_through_untouched_but_for_model_and_stream(executor, fake):
    reply = await executor.complete(responses())
    sent = fake.requests[-1]
    assert sent.path == "/v1/responses"
    assert sent.json == {**BODY, "model": "fake-model", "stream": False}
    assert list(sent.json) == list(BODY)  # field order kept, model and stream replaced in place
    assert reply.status == 200
    answer = orjson.loads(reply.body)
    assert (answer["object"], answer["model"], answer["status"]) == (
        "response",
        "gpt-5-codex",
        "completed",
    )
    assert answer["output"][0]["content"][0]["text"] == "tell me three words"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (8, 4)


async def test_a_provider_without_native_responses_refuses_them_before_any_io(sets, fake):
    executor = provider_set(sets, fake.base_url, native_apis=["messages"]).for_provider("p1")
    with pytest.raises(UnsupportedRequestError) as info:
        await executor.complete(responses())
    assert str(info.value) == (
        "openai_compat provider 'p1' (adapter 'api') does not serve /v1/responses natively "
        "(its native_apis does not list responses); the request must be translated to chat "
        "for it"
    )
    with pytest.raises(UnsupportedRequestError):
        await executor.open_stream(responses(stream=True))
    assert fake.total_requests == 0


@pytest.mark.parametrize("provider", ["ollama", "agent"])
async def test_ollama_and_cli_refuse_a_responses_call_before_any_io(sets, provider):
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
    with pytest.raises(UnsupportedRequestError, match="/v1/responses needs translating to chat"):
        await adapter_set.for_provider(provider).complete(responses())


async def test_only_the_calls_headers_reach_the_upstream(executor, fake):
    await executor.complete(chat("plain"))
    baseline = {name.lower() for name in fake.requests[-1].headers}
    await executor.complete(responses(headers={"Authorization": "Bearer provider-key"}))
    got = fake.requests[-1].headers
    assert {name.lower() for name in got} == baseline | {"authorization"}
    assert (got["Authorization"], got["x-request-id"]) == ("Bearer provider-key", "req-9")


async def test_the_endpoint_field_replaces_the_chat_path_only(sets, fake):
    executor = provider_set(sets, fake.base_url, endpoint="/custom/chat").for_provider("p1")
    await executor.complete(responses())
    assert fake.requests[-1].path == "/v1/responses"


USAGE = (
    b'"usage":{"input_tokens":20,"input_tokens_details":{"cached_tokens":15},'
    b'"output_tokens":7,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":27}'
)


async def test_a_response_is_relayed_byte_for_byte_but_for_model_and_cached_input_is_counted_once(
    sets,
):
    raw = (
        b'{"id":"resp_1","object":"response","created_at":1,"status":"completed",'
        b'"model":"fake-model","output":[{"type":"message","id":"msg_1","role":"assistant",'
        b'"status":"completed","content":[{"type":"output_text","annotations":[],'
        b'"text":"hi \\"model\\":\\"fake-model\\""}]}],' + USAGE + b',"x":  1}'
    )
    upstream = CannedUpstream([raw], content_type="application/json")
    reply = await run_upstream(sets, upstream, responses())
    assert isinstance(reply, UpstreamReply)
    assert reply.body == raw.replace(b'"model":"fake-model"', b'"model":"gpt-5-codex"')
    # (cached_tokens is a part of input_tokens: total_tokens = input + output)
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (20, 7)


# --- streams ---------------------------------------------------------------------------------


def event(name: str, data: bytes) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


def lifecycle(
    name: str, number: int, status: str, rest: bytes = b'"output":[],"usage":null'
) -> bytes:
    """A lifecycle event as vLLM frames it (pydantic's field order, compact JSON)."""
    return event(
        name,
        b'{"response":{"id":"resp_1","created_at":1,"model":"fake-model","object":"response",'
        b'"status":"'
        + status.encode()
        + b'",'
        + rest
        + b'},"sequence_number":'
        + str(number).encode()
        + b',"type":"'
        + name.encode()
        + b'"}',
    )


ITEM = b'{"id":"msg_1","type":"message","role":"assistant","status":"%s","content":%s}'
PART = b'{"type":"output_text","text":"%s","annotations":[]}'
TEXT = 'a \\"model\\":\\"fake-model\\" word'
CREATED = lifecycle("response.created", 0, "in_progress")
IN_PROGRESS = lifecycle("response.in_progress", 1, "in_progress")
OUTPUT = (
    event(
        "response.output_item.added",
        b'{"item":' + ITEM % (b"in_progress", b"[]") + b',"output_index":0,"sequence_number":2,'
        b'"type":"response.output_item.added"}',
    )
    + event(
        "response.content_part.added",
        b'{"content_index":0,"item_id":"msg_1","output_index":0,"part":'
        + PART % b""
        + b',"sequence_number":3,"type":"response.content_part.added"}',
    )
    + event(
        "response.output_text.delta",
        b'{"content_index":0,"delta":"' + TEXT.encode() + b'","item_id":"msg_1","logprobs":[],'
        b'"output_index":0,"sequence_number":4,"type":"response.output_text.delta"}',
    )
    + event(
        "response.output_text.done",
        b'{"content_index":0,"item_id":"msg_1","logprobs":[],"output_index":0,'
        b'"sequence_number":5,"text":"' + TEXT.encode() + b'","type":"response.output_text.done"}',
    )
    + event(
        "response.content_part.done",
        b'{"content_index":0,"item_id":"msg_1","output_index":0,"part":'
        + PART % TEXT.encode()
        + b',"sequence_number":6,"type":"response.content_part.done"}',
    )
    + event(
        "response.output_item.done",
        b'{"item":'
        + ITEM % (b"completed", b"[" + PART % TEXT.encode() + b"]")
        + b',"output_index":0,"sequence_number":7,"type":"response.output_item.done"}',
    )
)
FINAL_REST = (
    b'"output":[' + ITEM % (b"completed", b"[" + PART % TEXT.encode() + b"]") + b"]," + USAGE
)
COMPLETED = lifecycle("response.completed", 8, "completed", FINAL_REST)
STREAM = CREATED + IN_PROGRESS + OUTPUT + COMPLETED


def relayed(frames: bytes) -> bytes:
    """``frames`` as the client gets them: the Response's model the client's."""
    return frames.replace(b'"model":"fake-model"', b'"model":"gpt-5-codex"')


def final_of(frame: bytes) -> Any:
    """The Response of a relayed lifecycle frame, parsed."""
    return orjson.loads(frame.split(b"data: ", 1)[1])["response"]


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda raw: [raw], id="in-one-read"),
        pytest.param(lambda raw: [raw[i : i + 7] for i in range(0, len(raw), 7)], id="7-bytes"),
        pytest.param(lambda raw: [raw[:1], raw[1:-1], raw[-1:]], id="edges"),
    ],
)
async def test_the_stream_is_relayed_byte_for_byte_but_for_the_responses_model(sets, cut):
    upstream = CannedUpstream(cut(STREAM))
    got = await relay(sets, upstream)
    assert got.error is None
    assert got.frames == relayed(CREATED + IN_PROGRESS) + OUTPUT + relayed(COMPLETED)
    assert upstream.received == [("/v1/responses", {**BODY, "model": "fake-model"})]
    usage = got.stream.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (20, 7)
    final = got.stream.final_response()
    assert final is not None
    assert orjson.loads(final) == final_of(relayed(COMPLETED))
    assert orjson.loads(final)["model"] == "gpt-5-codex"


@pytest.mark.parametrize(
    ("created", "expected"),
    [
        pytest.param(
            CREATED.replace(b'"model":"fake-model"', b'"model":"served-name"'),
            relayed(CREATED),
            id="an-upstream-that-renames-its-model",
        ),
        pytest.param(
            CREATED.replace(b'"model":"fake-model"', b'"model":"served-name"').replace(
                b'"status":', b'"metadata":{"model":"fake-model"},"status":'
            ),
            relayed(CREATED).replace(b'"status":', b'"metadata":{"model":"fake-model"},"status":'),
            id="the-asked-name-in-the-metadata",
        ),
        pytest.param(
            CREATED.replace(b'"status":', b'"metadata":{"model":"fake-model"},"status":'),
            relayed(CREATED).replace(b'"status":', b'"metadata":{"model":"fake-model"},"status":'),
            id="the-asked-name-twice",
        ),
    ],
)
async def test_the_responses_model_is_the_clients_however_the_upstream_names_it(
    sets, created, expected
):
    # An event before the last is rewritten in its bytes only when its one "model": key has
    # the name the upstream was asked for; else it is decoded, and only the Response's own
    # model changes (never a "model" in the metadata).
    got = await relay(sets, CannedUpstream([created + COMPLETED]))
    assert got.error is None
    assert got.frames == expected + relayed(COMPLETED)
    assert final_of(got.frames.split(b"\n\n")[0] + b"\n\n")["model"] == "gpt-5-codex"


async def test_a_non_streamed_body_asking_for_a_stream_gets_one_only_when_the_call_streams(
    sets,
):
    upstream = CannedUpstream([STREAM])
    await run_upstream(sets, upstream, responses(stream=True, body={**BODY, "stream": False}))
    assert upstream.received[-1][1]["stream"] is True


async def test_output_events_are_not_decoded(sets):
    # (their bytes are relayed as they came: decoding every event was a chat stream's most CPU)
    odd = event("response.output_text.delta", b"{not json, and never read}")
    got = await relay(sets, CannedUpstream([CREATED + odd + COMPLETED]))
    assert got.error is None
    assert got.frames == relayed(CREATED) + odd + relayed(COMPLETED)


async def test_events_framed_otherwise_are_framed_exactly(sets):
    delta = (
        b'{"content_index":0,"delta":"hi","item_id":"msg_1","output_index":0,'
        b'"sequence_number":2,"type":"response.output_text.delta"}'
    )
    upstream = CannedUpstream(
        [
            b": keep-alive\r\n\r\n",
            CREATED.replace(b"\n", b"\r\n").replace(b"data: ", b"data:"),
            b"id: 3\nevent: response.output_text.delta\ndata: " + delta[:40] + b"\n",
            b"data: " + delta[40:] + b"\n\n",
            b"data: " + delta + b"\n\n",  # (no event: field: named by its type)
            b"event: response.in_progress\n\n",  # (no data: never dispatched)
            COMPLETED,
        ]
    )
    got = await relay(sets, upstream)
    assert got.error is None
    split = delta[:40] + b" " + delta[40:]
    assert got.frames == (
        relayed(CREATED)
        + event("response.output_text.delta", split)
        + event("response.output_text.delta", delta)
        + relayed(COMPLETED)
    )


async def test_response_incomplete_ends_the_stream_cleanly(sets):
    incomplete = lifecycle(
        "response.incomplete",
        8,
        "incomplete",
        b'"incomplete_details":{"reason":"max_output_tokens"},"output":[],' + USAGE,
    )
    got = await relay(sets, CannedUpstream([CREATED + OUTPUT + incomplete + b"event: trailing\n"]))
    assert got.error is None
    assert got.frames == relayed(CREATED) + OUTPUT + relayed(incomplete)
    final = got.stream.final_response()
    assert final is not None
    assert orjson.loads(final)["status"] == "incomplete"
    assert (got.stream.usage.prompt_tokens, got.stream.usage.completion_tokens) == (20, 7)


async def test_an_upstream_error_event_is_relayed_as_it_came_then_the_stream_fails(sets):
    error_event = event(
        "error",
        b'{"type":"error","code":"server_error","message":"The model crashed.","param":null,'
        b'"sequence_number":3}',
    )
    got = await relay(
        sets, CannedUpstream([CREATED + OUTPUT[:150], OUTPUT[150:] + error_event + COMPLETED])
    )
    assert got.frames == relayed(CREATED) + OUTPUT + error_event
    error = got.error
    assert isinstance(error, AdapterError)
    assert (error.code, error.failure, error.failover, error.error_relayed) == (
        "upstream_error",
        "protocol",
        False,
        True,
    )
    assert str(error).endswith(
        "failed: the upstream reported an error mid-stream (relayed to the client): "
        "server_error: The model crashed."
    )
    assert got.stream.final_response() is None


async def test_response_failed_is_relayed_with_the_clients_model_then_the_stream_fails(sets):
    failed = lifecycle(
        "response.failed",
        4,
        "failed",
        b'"error":{"code":"server_error","message":"Out of memory."},"output":[],"usage":null',
    )
    got = await relay(sets, CannedUpstream([CREATED + IN_PROGRESS + failed]))
    assert got.frames == relayed(CREATED + IN_PROGRESS + failed)
    error = got.error
    assert isinstance(error, AdapterError)
    assert error.error_relayed is True
    assert "(relayed to the client): server_error: Out of memory." in str(error)
    final = got.stream.final_response()
    assert final is not None
    assert orjson.loads(final) == final_of(relayed(failed))


async def test_a_stream_that_ends_before_its_last_event_fails_without_relaying_an_end(sets):
    got = await relay(sets, CannedUpstream([CREATED + IN_PROGRESS + OUTPUT]))
    assert got.frames == relayed(CREATED + IN_PROGRESS) + OUTPUT
    error = got.error
    assert isinstance(error, AdapterError)
    assert (error.code, error.error_relayed) == ("upstream_error", False)
    assert str(error).endswith(
        "failed: the stream ended before event: response.completed (or response.incomplete, "
        "response.failed)"
    )
    assert got.stream.final_response() is None


async def test_a_failure_event_cut_by_the_end_of_the_body_is_not_relayed(sets):
    cut = b'event: error\ndata: {"type":"error","code":"server_error","message":"gone"}\n\r'
    got = await relay(sets, CannedUpstream([CREATED, cut]))
    assert got.frames == relayed(CREATED)
    assert isinstance(got.error, AdapterError)
    assert got.error.error_relayed is False
    assert "reported an error mid-stream: server_error: gone" in str(got.error)


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (event("response.created", b'{"type":"response.created","response":'), "not valid JSON"),
        (
            event("response.created", b'{"type":"response.created","sequence_number":0}'),
            "event: response.created has no response object",
        ),
    ],
)
async def test_a_broken_lifecycle_event_fails_before_anything_is_relayed(sets, frame, reason):
    got = await relay(sets, CannedUpstream([frame]))
    assert got.frames == b""
    assert isinstance(got.error, AdapterError)
    assert reason in str(got.error)


async def test_a_json_answer_to_a_streamed_call_is_an_upstream_error(sets):
    upstream = CannedUpstream([b'{"object":"response"}'], content_type="application/json")
    with pytest.raises(AdapterError, match="a JSON body instead of an event stream"):
        await run_upstream(sets, upstream, responses(stream=True))


async def test_the_fakes_stream_comes_through_with_the_clients_model(executor, fake):
    fake.behavior = FakeBehavior(thinking="hmm", tool_call='shell:{"command": ["ls"]}')
    got = await run_call(executor, responses(stream=True))
    assert isinstance(got, Relayed)
    assert got.error is None
    frames = split_frames(got.frames)
    events = [orjson.loads(frame.split(b"data: ", 1)[1]) for frame in frames]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"
    models = {e["response"]["model"] for e in events if "response" in e}
    assert models == {"gpt-5-codex"}
    assert [item["type"] for item in events[-1]["response"]["output"]] == [
        "reasoning",
        "message",
        "function_call",
    ]
    final = got.stream.final_response()
    assert final is not None
    assert orjson.loads(final) == events[-1]["response"]
    # 1 thinking word + 4 words + the 19 characters of the arguments in 3 pieces
    assert (got.stream.usage.prompt_tokens, got.stream.usage.completion_tokens) == (8, 8)


async def test_the_fakes_failure_mid_stream_is_relayed_then_failed(executor, fake):
    fake.behavior = FakeBehavior(fault="error", fault_after=3, error_message="Overloaded")
    got = await run_call(executor, responses(stream=True))
    assert isinstance(got, Relayed)
    names = [frame.split(b"\n", 1)[0] for frame in split_frames(got.frames)]
    assert names == [
        b"event: response.created",
        b"event: response.in_progress",
        b"event: response.output_item.added",
        b"event: response.failed",
    ]
    assert isinstance(got.error, AdapterError)
    assert got.error.error_relayed is True
    assert "server_error: Overloaded" in str(got.error)


# --- error statuses --------------------------------------------------------------------------

OPENAI_ERROR = (
    b'{"error": {"message": "Context too long.", "type": "invalid_request_error", '
    b'"param": "input", "code": "context_length_exceeded"}}'
)


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "open_stream"])
async def test_an_error_status_comes_back_with_its_body_as_it_came(sets, stream):
    upstream = CannedUpstream([OPENAI_ERROR], status=400, content_type="application/json")
    reply = await run_upstream(sets, upstream, responses(stream=stream))
    assert isinstance(reply, UpstreamReply)
    assert (reply.status, reply.body) == (400, OPENAI_ERROR)
    assert reply.detail == "the upstream answered 400 Bad Request: Context too long."


async def test_a_non_openai_json_error_comes_back_as_it_came_too(sets):
    vllm_style = b'{"object":"error","message":"model not found","type":"NotFoundError","code":404}'
    upstream = CannedUpstream([vllm_style], status=404, content_type="application/json")
    reply = await run_upstream(sets, upstream, responses())
    assert isinstance(reply, UpstreamReply)
    assert (reply.status, reply.body) == (404, vllm_style)


async def test_a_429_carries_its_retry_after(sets):
    body = b'{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":null}}'
    upstream = CannedUpstream(
        [body], status=429, content_type="application/json", headers={"Retry-After": "7"}
    )
    reply = await run_upstream(sets, upstream, responses(stream=True))
    assert isinstance(reply, UpstreamReply)
    assert (reply.status, reply.body, reply.retry_after) == (429, body, 7.0)


async def test_an_error_body_that_is_not_json_stays_in_the_log(sets):
    upstream = CannedUpstream([b"<html>Bad Gateway</html>"], status=502, content_type="text/html")
    reply = await run_upstream(sets, upstream, responses(stream=True))
    assert isinstance(reply, UpstreamReply)
    assert reply.status == 502
    assert orjson.loads(reply.body) == {
        "error": {
            "message": "The upstream of openai_compat provider 'p1' (adapter 'api') answered "
            "HTTP 502 with a body that is not a JSON error; the edge's log has it under this "
            "request's x-request-id.",
            "type": "server_error",
            "param": None,
            "code": "upstream_error",
        }
    }
    assert reply.detail == "the upstream answered 502 Bad Gateway: <html>Bad Gateway</html>"


async def test_the_fakes_error_status_comes_back_in_the_openai_envelope(executor, fake):
    fake.behavior = FakeBehavior(status=400, error_message="input: too long")
    reply = await executor.complete(responses())
    assert reply.status == 400
    assert orjson.loads(reply.body) == {
        "error": {
            "message": "input: too long",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }

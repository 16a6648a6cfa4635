"""The OpenAI surface end to end: the official SDK against a real edge and fake upstreams."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from iop_edge.adapters.base import UpstreamCall, UpstreamReply
from iop_edge.runtime.lifecycle import Phase
from iop_edge.testing.fake_behavior import FakeBehavior
from tests.helpers import pass_deadline, wait_for
from tests.helpers.api import OTHER_TOKEN, TOKEN, edge_client, edge_doc

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello through the edge"}]


# --- each adapter, streaming and not ---------------------------------------------------------


@pytest.mark.parametrize("model", ["chat-oa", "chat-ol", "chat-cli", "echo"])
async def test_chat_through_each_adapter(client, model):
    reply = await client.chat.completions.create(model=model, messages=HELLO)
    assert reply.choices[0].message.content.strip() == "hello through the edge"
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("model", ["chat-oa", "chat-ol", "chat-cli", "echo"])
async def test_streaming_chat_through_each_adapter(client, model):
    stream = await client.chat.completions.create(model=model, messages=HELLO, stream=True)
    text = ""
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text.strip() == "hello through the edge"


async def test_usage_is_reported_streaming_included(client):
    reply = await client.chat.completions.create(model="chat-oa", messages=HELLO)
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (4, 4)
    stream = await client.chat.completions.create(
        model="chat-ol", messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0


async def test_the_sync_sdk_client_works_too(edge):
    def call() -> str:
        with openai.OpenAI(base_url=edge.openai_url, api_key=TOKEN, max_retries=0) as sync:
            reply = sync.chat.completions.create(model="chat-oa", messages=HELLO)
            streamed = "".join(
                c.choices[0].delta.content or ""
                for c in sync.chat.completions.create(model="echo", messages=HELLO, stream=True)
                if c.choices
            )
            content = reply.choices[0].message.content
            assert content is not None
            return content + "|" + streamed.strip()

    assert await asyncio.to_thread(call) == "hello through the edge|hello through the edge"


async def test_legacy_completions_on_a_passthrough_provider(client, fake_oa):
    reply = await client.completions.create(model="chat-oa", prompt="say it back")
    assert reply.choices[0].text == "say it back"
    assert fake_oa.requests[-1].path == "/v1/completions"
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model="chat-ol", prompt="x")
    assert info.value.code == "unsupported_endpoint"
    assert info.value.param == "model"
    assert "does not serve /v1/completions" in info.value.message


async def test_a_model_route_uses_its_adapter_and_target(client, fake_oa):
    reply = await client.chat.completions.create(model="legacy", messages=HELLO)
    assert reply.choices[0].message.content == "hello through the edge"
    assert fake_oa.requests[-1].json["model"] == "fake-model"


async def test_models_are_listed_and_retrieved(client):
    models = [m.id async for m in client.models.list()]
    assert models == ["chat-oa", "chat-ol", "chat-cli", "echo", "legacy"]
    assert (await client.models.retrieve("legacy")).id == "legacy"
    with pytest.raises(openai.NotFoundError) as info:
        await client.models.retrieve("nope")
    assert info.value.code == "model_not_found"


async def test_health_and_readiness(edge):
    async with aiohttp.ClientSession() as session:
        base = edge.openai_url.removesuffix("/v1")
        async with session.get(base + "/healthz") as response:
            assert response.status == 200
        async with session.get(base + "/readyz") as response:
            assert (response.status, await response.json()) == (200, {"status": "ready"})
        edge.lifecycle.enter(Phase.STOPPING)  # (as stop() does first)
        async with session.get(base + "/readyz") as response:
            assert response.status == 503


# --- the request and what goes upstream ------------------------------------------------------


async def test_target_mapping_and_unknown_fields_untouched(client, fake_oa):
    await client.chat.completions.create(
        model="chat-oa", messages=HELLO, extra_body={"x_vendor": {"keep": [1, 2]}}
    )
    sent = fake_oa.requests[-1].json
    assert sent["model"] == "fake-model"
    assert sent["x_vendor"] == {"keep": [1, 2]}


async def test_generation_policy_is_applied_before_execution(client, fake_oa):
    await client.chat.completions.create(model="chat-oa", messages=HELLO)
    assert fake_oa.requests[-1].json["max_tokens"] == 64  # default_max_tokens
    await client.chat.completions.create(model="chat-oa", messages=HELLO, max_tokens=2)
    assert fake_oa.requests[-1].json["max_tokens"] == 8  # min_max_tokens floor
    await client.chat.completions.create(model="chat-oa", messages=HELLO, max_tokens=32)
    assert fake_oa.requests[-1].json["max_tokens"] == 32


async def test_the_client_token_never_goes_upstream(client, fake_oa):
    await client.chat.completions.create(model="chat-oa", messages=HELLO)
    headers = {k.lower(): v for k, v in fake_oa.requests[-1].headers.items()}
    assert "authorization" not in headers
    assert TOKEN not in json.dumps(dict(fake_oa.requests[-1].headers))


async def test_every_response_carries_request_id_and_provider(edge):
    async with aiohttp.ClientSession() as session:
        async with session.post(
            edge.openai_url + "/chat/completions",
            json={"model": "chat-oa", "messages": HELLO},
            headers={"Authorization": f"Bearer {TOKEN}", "x-request-id": "trace-42"},
        ) as response:
            assert response.status == 200
            assert response.headers["x-request-id"] == "trace-42"
            assert response.headers["x-iop-provider"] == "up"
        async with session.post(
            edge.openai_url + "/chat/completions",
            json={"model": "chat-oa", "messages": HELLO},
            headers={"Authorization": "Bearer wrong"},
        ) as response:
            assert response.status == 401
            assert len(response.headers["x-request-id"]) == 32


async def test_one_log_line_per_request_with_principal_and_never_a_raw_token(client, log_stream):
    await client.chat.completions.create(model="chat-oa", messages=HELLO)
    with pytest.raises(openai.AuthenticationError):
        await client.with_options(api_key="not-a-token").chat.completions.create(
            model="chat-oa", messages=HELLO
        )
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    requests = [line for line in lines if line["event"] == "request"]
    assert [(r["token_ref"], r["status"], r["code"]) for r in requests] == [
        ("app-chat", 200, "ok"),
        (None, 401, "invalid_api_key"),
    ]
    first = requests[0]
    assert (first["principal_ref"], first["model"], first["provider"], first["node"]) == (
        "team-a",
        "chat-oa",
        "up",
        "n1",
    )
    assert first["queue_wait_ms"] is not None
    assert first["duration_ms"] > 0
    assert TOKEN not in log_stream.getvalue()
    assert "not-a-token" not in log_stream.getvalue()


async def test_token_ref_tells_apps_of_one_principal_apart(edge, log_stream):
    async with openai.AsyncOpenAI(
        base_url=edge.openai_url, api_key=OTHER_TOKEN, max_retries=0
    ) as c:
        await c.chat.completions.create(model="echo", messages=HELLO)
    (line,) = [json.loads(x) for x in log_stream.getvalue().splitlines() if '"request"' in x]
    assert (line["principal_ref"], line["token_ref"]) == ("team-a", "app-batch")


async def test_provider_auth_is_forwarded_and_its_source_header_stripped(fake_oa, fake_ol):
    doc = edge_doc(fake_oa, fake_ol)
    doc["openai"]["provider_auth"] = {"enabled": True}
    async with edge_client(doc) as (_, c):
        await c.chat.completions.create(
            model="chat-oa",
            messages=HELLO,
            extra_headers={"X-IOP-Provider-Authorization": "sk-upstream"},
        )
        headers = {k.lower(): v for k, v in fake_oa.requests[-1].headers.items()}
        assert headers["authorization"] == "Bearer sk-upstream"
        assert "x-iop-provider-authorization" not in headers
        with pytest.raises(openai.AuthenticationError) as info:
            await c.chat.completions.create(model="chat-oa", messages=HELLO)
        assert info.value.code == "provider_auth_required"


async def test_the_provider_auth_source_header_is_stripped_even_when_forwarding_is_off(
    client, fake_oa
):
    await client.chat.completions.create(
        model="chat-oa", messages=HELLO, extra_headers={"X-IOP-Provider-Authorization": "sk"}
    )
    headers = {k.lower() for k in fake_oa.requests[-1].headers}
    assert "x-iop-provider-authorization" not in headers
    assert "authorization" not in headers


# --- the error table of SPEC §6 --------------------------------------------------------------


async def test_missing_and_unknown_bearer_tokens_are_401_invalid_api_key(edge):
    async with openai.AsyncOpenAI(base_url=edge.openai_url, api_key="wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError) as info:
            await c.chat.completions.create(model="chat-oa", messages=HELLO)
        assert info.value.code == "invalid_api_key"
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            edge.openai_url + "/chat/completions", json={"model": "chat-oa", "messages": HELLO}
        ) as response,
    ):
        body = await response.json()
    assert (response.status, body["error"]["code"]) == (401, "invalid_api_key")


async def test_unknown_model_is_404_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(model="gpt-nope", messages=HELLO)
    assert (info.value.code, info.value.param) == ("model_not_found", "model")


async def test_malformed_bodies_and_bad_fields_are_400_naming_the_field(edge, client):
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="chat-oa", messages=[])
    assert (info.value.code, info.value.param) == ("invalid_request_error", "messages")
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            edge.openai_url + "/chat/completions",
            data=b"{oops",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        ) as response,
    ):
        body = await response.json()
    assert response.status == 400
    assert body["error"]["code"] == "invalid_request_error"
    assert set(body["error"]) == {"message", "type", "param", "code"}


async def test_input_plus_max_tokens_over_the_window_is_context_length_exceeded(client):
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(
            model="chat-oa", messages=[{"role": "user", "content": "x" * 16000}], max_tokens=100
        )
    assert info.value.code == "context_length_exceeded"


async def test_an_oversized_body_is_413_request_too_large(fake_oa, fake_ol):
    doc = edge_doc(fake_oa, fake_ol)
    doc["openai"]["max_body_bytes"] = 2048
    async with edge_client(doc) as (_, c):
        with pytest.raises(openai.APIStatusError) as info:
            await c.chat.completions.create(
                model="chat-oa", messages=[{"role": "user", "content": "x" * 4096}]
            )
    assert (info.value.status_code, info.value.code) == (413, "request_too_large")


async def test_queue_full_is_429_with_retry_after(fake_oa, fake_ol):
    fake_oa.behavior = FakeBehavior(hold=True)
    async with edge_client(edge_doc(fake_oa, fake_ol, capacity=1)) as (edge, c):
        calls = [
            asyncio.create_task(c.chat.completions.create(model="chat-oa", messages=HELLO))
            for _ in range(3)
        ]  # one in flight, two queued (max_queue 2)
        await fake_oa.wait_in_flight(1)
        await wait_for(lambda: edge.scheduler.statistics().queue_depth == 2)
        with pytest.raises(openai.RateLimitError) as info:
            await c.chat.completions.create(model="chat-oa", messages=HELLO)
        assert info.value.code == "queue_full"
        assert info.value.response.headers["Retry-After"] == "1"
        fake_oa.release()
        fake_oa.behavior = FakeBehavior()
        replies = await asyncio.gather(*calls)
    assert all(r.choices[0].message.content for r in replies)
    assert fake_oa.max_in_flight == 1


async def test_no_enabled_provider_is_503_no_available_provider(fake_oa, fake_ol):
    doc = edge_doc(fake_oa, fake_ol)
    doc["nodes"][0]["providers"][0]["enabled"] = False
    async with edge_client(doc) as (_, c):
        with pytest.raises(openai.InternalServerError) as info:
            await c.chat.completions.create(model="chat-oa", messages=HELLO)
    assert (info.value.status_code, info.value.code) == (503, "no_available_provider")


async def test_waiting_past_queue_timeout_is_503_queue_timeout(fake_oa, fake_ol):
    from iop_edge.testing.clock import FakeClock

    clock = FakeClock(100.0)
    fake_oa.behavior = FakeBehavior(hold=True)
    async with edge_client(edge_doc(fake_oa, fake_ol, capacity=1), clock=clock) as (edge, c):
        first = asyncio.create_task(c.chat.completions.create(model="chat-oa", messages=HELLO))
        await fake_oa.wait_in_flight(1)
        second = asyncio.create_task(c.chat.completions.create(model="chat-oa", messages=HELLO))
        await wait_for(lambda: edge.scheduler.statistics().queue_depth == 1)
        clock.advance(29.999)
        assert edge.scheduler.statistics().queue_depth == 1
        clock.advance(0.001)  # exactly queue_timeout_ms after it queued
        with pytest.raises(openai.InternalServerError) as info:
            await second
        assert (info.value.status_code, info.value.code) == (503, "queue_timeout")
        fake_oa.release()
        await first


async def test_upstream_failure_is_502_upstream_error_and_names_no_internal_address(
    client, fake_oa
):
    fake_oa.enqueue(FakeBehavior(fault="disconnect"))
    with pytest.raises(openai.APIStatusError) as info:
        await client.chat.completions.create(model="chat-oa", messages=HELLO)
    assert (info.value.status_code, info.value.code) == (502, "upstream_error")
    assert "provider 'up'" in info.value.message
    assert "127.0.0.1" not in info.value.message


async def test_an_upstream_error_status_passes_through_as_an_openai_error(client, fake_oa):
    fake_oa.enqueue(FakeBehavior(status=500, error_message="model crashed"))
    with pytest.raises(openai.InternalServerError) as info:
        await client.chat.completions.create(model="chat-oa", messages=HELLO)
    assert info.value.status_code == 500
    assert "model crashed" in info.value.message


async def test_upstream_timeout_is_504_upstream_timeout(fake_oa, fake_ol):
    from iop_edge.testing.clock import FakeClock

    clock = FakeClock(100.0)  # request_timeout_ms passes on it (once the upstream has the call)
    doc = edge_doc(fake_oa, fake_ol)
    doc["nodes"][0]["providers"][0]["request_timeout_ms"] = 200
    fake_oa.behavior = FakeBehavior(fault="stall")
    async with edge_client(doc, clock=clock) as (edge, c):
        arrived = lambda: fake_oa.total_requests == 1  # noqa: E731
        deadline = asyncio.create_task(pass_deadline(clock, 100.2, arrived))
        with pytest.raises(openai.APIStatusError) as info:
            await c.chat.completions.create(model="chat-oa", messages=HELLO)
        await deadline
        assert (info.value.status_code, info.value.code) == (504, "upstream_timeout")
        assert edge.scheduler.statistics().in_flight == 0


async def test_a_cli_non_zero_exit_is_502_and_releases_its_slot(client, edge, log_stream):
    prompt = [{"role": "user", "content": "[[fake-cli: --exit-code 3 --stderr boom-detail]] hi"}]
    with pytest.raises(openai.APIStatusError) as info:
        await client.chat.completions.create(model="chat-cli", messages=prompt)
    assert (info.value.status_code, info.value.code) == (502, "upstream_error")
    assert "boom-detail" not in info.value.message  # the stderr tail goes to the log
    assert "boom-detail" in log_stream.getvalue()
    assert edge.scheduler.statistics().in_flight == 0


# --- leases: released exactly once, whatever happens -----------------------------------------


async def test_client_disconnect_mid_stream_releases_the_lease_and_cancels_upstream(edge, fake_oa):
    fake_oa.behavior = FakeBehavior(chunks=50, fault="stall", fault_after=2)
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            edge.openai_url + "/chat/completions",
            json={"model": "chat-oa", "messages": HELLO, "stream": True},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        await response.content.readline()  # the stream has started
        assert edge.scheduler.statistics().in_flight == 1
        response.close()  # the client goes away
    await fake_oa.wait_until(lambda: fake_oa.cancelled == 1)
    await wait_for(lambda: edge.scheduler.statistics().in_flight == 0)
    stats = edge.scheduler.statistics()
    assert (stats.released, stats.double_releases) == (1, 0)


async def test_upstream_reset_mid_stream_ends_the_stream_with_an_error_and_releases(
    client, edge, fake_oa
):
    fake_oa.enqueue(FakeBehavior(chunks=10, fault="reset", fault_after=3))
    stream = await client.chat.completions.create(model="chat-oa", messages=HELLO, stream=True)
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass
    await wait_for(lambda: edge.scheduler.statistics().in_flight == 0)
    assert edge.scheduler.statistics().released == 1


async def test_a_hanging_cli_is_killed_on_timeout_with_its_process_group(
    fake_oa, fake_ol, tmp_path
):
    import os

    from iop_edge.testing.clock import FakeClock

    clock = FakeClock(100.0)  # request_timeout_ms passes on it, once the agent forked its child
    pid_file = tmp_path / "child.pid"
    doc = edge_doc(fake_oa, fake_ol)
    agent = doc["nodes"][0]["providers"][2]
    agent["request_timeout_ms"] = 300
    agent["args"] = [*agent["args"], "--hang", "--spawn-child", "--pid-file", str(pid_file)]
    async with edge_client(doc, clock=clock) as (edge, c):
        spawned = lambda: pid_file.exists() and pid_file.read_text().endswith("\n")  # noqa: E731
        deadline = asyncio.create_task(pass_deadline(clock, 100.3, spawned))
        with pytest.raises(openai.APIStatusError) as info:
            await c.chat.completions.create(model="chat-cli", messages=HELLO)
        await deadline
        assert info.value.code == "upstream_timeout"
        assert edge.scheduler.statistics().in_flight == 0
    child = int(pid_file.read_text())

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        return False

    await wait_for(gone)


# --- concurrency -----------------------------------------------------------------------------


async def test_parallel_requests_never_exceed_capacity_upstream(fake_oa, fake_ol):
    fake_oa.behavior = FakeBehavior(hold=True)
    doc = edge_doc(fake_oa, fake_ol, capacity=2)
    doc["provider_pool"]["max_queue"] = 10
    async with edge_client(doc) as (edge, c):
        calls = [
            asyncio.create_task(c.chat.completions.create(model="chat-oa", messages=HELLO))
            for _ in range(12)
        ]
        await fake_oa.wait_in_flight(2)
        await wait_for(lambda: edge.scheduler.statistics().queue_depth == 10)
        # the 13th finds the queue full (SPEC §5), the 12 accepted keep their place
        with pytest.raises(openai.RateLimitError):
            await c.chat.completions.create(model="chat-oa", messages=HELLO)
        assert fake_oa.in_flight == 2
        fake_oa.behavior = FakeBehavior()
        fake_oa.release()
        replies = await asyncio.gather(*calls)
        stats = edge.scheduler.statistics()
    assert len(replies) == 12
    assert fake_oa.max_in_flight == 2
    assert (stats.admitted, stats.released, stats.in_flight, stats.queue_depth) == (12, 12, 0, 0)
    assert stats.rejected["queue_full"] == 1


async def test_an_unexpected_failure_is_a_500_envelope_and_releases_the_slot(
    edge, client, log_stream, monkeypatch
):
    executor = edge.adapters.provider("n1", "up")

    async def broken(call: UpstreamCall) -> UpstreamReply:
        raise RuntimeError("a bug in the edge")

    monkeypatch.setattr(executor, "complete", broken)
    with pytest.raises(openai.InternalServerError) as info:
        await client.chat.completions.create(model="chat-oa", messages=HELLO)
    assert (info.value.status_code, info.value.code) == (500, "internal_error")
    assert "a bug in the edge" not in info.value.message  # the details go to the log only
    # The log says what failed and where, never the exception's message: it may quote request
    # data (a UnicodeError holds a whole header, a token included).
    events = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    failed = next(e for e in events if e["event"] == "request_failed")
    assert failed["error_type"] == "RuntimeError"
    assert failed["traceback"][-1].endswith("in broken")
    request = next(e for e in events if e["event"] == "request")
    assert request["error"].startswith("internal error: RuntimeError at ")
    assert "a bug in the edge" not in log_stream.getvalue()
    stats = edge.scheduler.statistics()
    assert (stats.in_flight, stats.released) == (0, 1)

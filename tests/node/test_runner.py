"""LinkRunner (design §1, §2): each REQ runs with the node's own adapter code on the real fake
upstream, and its result crosses the link as the edge reads it — through the edge's own
StreamTable in the stub, so a frame out of turn or beyond credit fails the test. A plain call,
a stream, an upstream's error status, a failure before and after the head, a cancel that
reaches the upstream, count_tokens, probes, messages larger than a frame, the credit window,
and the drain."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from iop_edge.adapters import AdapterSet
from iop_edge.errors import AdapterError
from iop_edge.link.calls import error_from, probe_result_from, reply_from, tokens_from
from iop_edge.link.handshake import LinkLimits
from iop_edge.link.protocol import Kind
from iop_edge.node.runner import CANCELLED_MESSAGE
from iop_edge.runtime.clock import MonotonicClock
from iop_edge.testing.fake_openai import FakeBehavior, FakeOpenAI
from tests.helpers.adapters import chat, collect, read_pid_fifo, reply_json, running
from tests.helpers.edge_stub import EdgeStub, ServedRunner, edge_stub, fake_payload, served_runner

TOKEN = "iopn_runner-test-token"


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@contextlib.asynccontextmanager
async def serve(fake: FakeOpenAI, limits: LinkLimits | None = None) -> AsyncIterator[ServedRunner]:
    """A runner serving a link to the stub edge, whose table must have seen no violation."""
    stub = EdgeStub(TOKEN, fake_payload(fake.base_url), limits=limits or LinkLimits())
    async with edge_stub(stub), served_runner(stub, TOKEN) as served:
        yield served
        assert served.edge.violations == []


@pytest.fixture
async def node(fake: FakeOpenAI) -> AsyncIterator[ServedRunner]:
    async with serve(fake) as served:
        yield served


@pytest.fixture
async def local(fake: FakeOpenAI) -> AsyncIterator[AdapterSet]:
    """The same payload's adapters in this process: what the edge runs for a local node."""
    adapters = AdapterSet.from_payload(fake_payload(fake.base_url))
    yield adapters
    await adapters.aclose()


async def test_a_plain_call_answers_what_the_local_adapter_answers(node, local):
    stream = await node.edge.request(chat("hello over the link"), provider="p")
    [message] = await node.edge.answer(stream)
    assert message.kind is Kind.RESP_REPLY
    remote = reply_from(message.meta, message.data)
    here = await local.for_provider("p").complete(chat("hello over the link"))
    assert (remote.status, remote.usage) == (here.status, here.usage) == (200, remote.usage)
    assert remote.usage.prompt_tokens == 4
    assert reply_json(remote)["choices"] == reply_json(here)["choices"]
    assert reply_json(remote)["choices"][0]["message"]["content"] == "hello over the link"
    assert node.runner.in_flight == 0


async def test_a_stream_crosses_as_head_chunks_and_end(node, local):
    call = chat("one two three four", stream=True, stream_options={"include_usage": True})
    stream = await node.edge.request(call, provider="p")
    messages = await node.edge.answer(stream)
    kinds = [m.kind for m in messages]
    assert kinds[0] is Kind.RESP_STREAM
    assert messages[0].meta == {"status": 200}
    assert set(kinds[1:-1]) <= {Kind.RESP_CHUNK}
    assert kinds[-1] is Kind.RESP_END
    relayed = b"".join(m.data for m in messages[:-1])
    here = b"".join(await collect(await local.for_provider("p").open_stream(call)))
    assert content(relayed) == content(here) == "one two three four"
    assert relayed.endswith(b"data: [DONE]\n\n")
    assert messages[-1].meta["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 4,
        "estimated": False,
    }


def adapter_error(meta: dict[str, Any]) -> AdapterError:
    """The AdapterError a RESP_ERROR carries (failing the test on another kind)."""
    error = error_from(meta)
    assert isinstance(error, AdapterError), error
    return error


def content(relayed: bytes) -> str:
    """The text of an OpenAI chat stream's frames."""
    text = ""
    for line in relayed.split(b"\n\n"):
        if line.startswith(b"data: {"):
            for choice in orjson.loads(line[6:])["choices"]:
                text += choice["delta"].get("content") or ""
    return text


async def test_an_upstream_error_status_is_a_reply_with_that_status(node, fake):
    fake.enqueue(FakeBehavior(status=429, error_message="overloaded", retry_after="7"))
    stream = await node.edge.request(chat(), provider="p")
    [message] = await node.edge.answer(stream)
    reply = reply_from(message.meta, message.data)
    assert (reply.status, reply.retry_after) == (429, 7.0)
    assert reply_json(reply)["error"]["message"] == "overloaded"


async def test_a_failure_before_the_head_is_an_error_that_fails_over(node):
    stream = await node.edge.request(chat(stream=True), provider="dead")
    [message] = await node.edge.answer(stream)
    assert message.kind is Kind.RESP_ERROR
    assert message.meta["type"] == "adapter"
    error = adapter_error(message.meta)
    assert (error.code, error.failover, error.failure) == ("upstream_error", True, "connect")


async def test_a_failure_mid_stream_ends_with_an_error_that_does_not_fail_over(node, fake):
    fake.enqueue(FakeBehavior(fault="reset", fault_after=2))
    stream = await node.edge.request(chat("a b c d", stream=True), provider="p")
    messages = await node.edge.answer(stream)
    assert messages[0].kind is Kind.RESP_STREAM
    assert messages[-1].kind is Kind.RESP_ERROR
    error = adapter_error(messages[-1].meta)
    assert (error.code, error.failover) == ("upstream_error", False)
    assert b"[DONE]" not in b"".join(m.data for m in messages)


async def test_a_provider_the_node_does_not_have_fails_over_naming_those_it_has(node):
    stream = await node.edge.request(chat(), provider="elsewhere")
    [message] = await node.edge.answer(stream)
    error = adapter_error(message.meta)
    assert (error.failover, error.failure) == (True, "connect")
    assert "no provider 'elsewhere'" in str(error)
    assert "providers with one: dead, p" in str(error)


async def test_a_model_route_runs_on_its_adapter(node):
    stream = await node.edge.request(chat("routed"), adapter="api")
    [message] = await node.edge.answer(stream)
    assert reply_json(reply_from(message.meta, message.data))["choices"][0]["message"][
        "content"
    ] == ("routed")


async def test_a_cancel_reaches_the_upstream_before_the_terminal_frame(node, fake):
    """The edge's CANCEL cancels the request's task: the fake upstream sees its client go away
    (its handler is cancelled), and only then the node answers ``cancelled``."""
    fake.enqueue(FakeBehavior(fault="stall", fault_after=2))
    stream = await node.edge.request(chat("a b c d e f", stream=True), provider="p")
    head = await node.edge.message(stream)
    assert head.kind is Kind.RESP_STREAM
    await fake.wait_in_flight(1)
    await node.edge.cancel(stream)
    terminal = await node.edge.message(stream)
    assert terminal.kind is Kind.RESP_ERROR
    assert terminal.meta["type"] == "cancelled"
    assert terminal.meta["message"] == CANCELLED_MESSAGE
    async with asyncio.timeout(20):
        await fake.wait_until(lambda: fake.cancelled == 1)
    assert fake.statistics().in_flight == 0
    assert node.runner.in_flight == 0


async def test_a_cancel_kills_a_cli_agents_group_before_the_node_answers(fake, tmp_path):
    """A cli provider: the CANCEL kills the agent's whole process group, and the node's
    ``cancelled`` answer comes only once the group is gone (the edge releases the slot then)."""
    fifo = tmp_path / "child.pid"
    os.mkfifo(fifo)
    payload = fake_payload(
        fake.base_url, cli_args=["--spawn-child", "--pid-file", str(fifo), "--hang"]
    )
    stub = EdgeStub(TOKEN, payload)
    async with edge_stub(stub), served_runner(stub, TOKEN) as node:
        stream = await node.edge.request(chat("think hard", stream=True), provider="agent")
        child = await read_pid_fifo(fifo)
        assert running(child)
        await node.edge.cancel(stream)
        [terminal] = await node.edge.answer(stream)
        assert terminal.meta["type"] == "cancelled"
        assert not running(child)  # (already: the answer waited for the group's end)
        assert node.edge.violations == []


async def test_a_cancel_of_a_held_plain_call(node, fake):
    fake.enqueue(FakeBehavior(hold=True))
    stream = await node.edge.request(chat(), provider="p")
    await fake.wait_in_flight(1)
    await node.edge.cancel(stream)
    [terminal] = await node.edge.answer(stream)
    assert terminal.meta["type"] == "cancelled"
    async with asyncio.timeout(20):
        await fake.wait_until(lambda: fake.cancelled == 1)


async def test_count_tokens_answers_none_where_the_upstream_cannot_count(node):
    stream = await node.edge.count_tokens(
        {"messages": [{"role": "user", "content": "hi"}]}, "fake-model", provider="p"
    )
    [message] = await node.edge.answer(stream)
    assert message.kind is Kind.RESP_REPLY
    assert tokens_from(message.meta) is None


async def test_probes_run_the_providers_health_check(node, fake):
    healthy = await node.edge.probe("p")
    [result] = await node.edge.answer(healthy)
    assert probe_result_from(result.meta) == (True, None)
    fake.listing = FakeBehavior(status=500)
    sick = await node.edge.probe("p")
    ok, reason = probe_result_from((await node.edge.answer(sick))[0].meta)
    assert not ok
    assert "500" in str(reason)
    unchecked = await node.edge.probe("dead")
    assert probe_result_from((await node.edge.answer(unchecked))[0].meta)[0] is False


async def test_messages_larger_than_a_frame_span_frames_both_ways(fake):
    """A 4 KiB frame cap: the REQ's body and the reply's body each take several frames (MORE),
    and arrive whole."""
    limits = LinkLimits(max_frame_bytes=4096)
    text = " ".join(f"word{i}" for i in range(3000))  # about 26 KB each way
    async with serve(fake, limits) as node:
        stream = await node.edge.request(chat(text), provider="p")
        [message] = await node.edge.answer(stream)
        assert reply_json(reply_from(message.meta, message.data))["choices"][0]["message"][
            "content"
        ] == (text)
        assert fake.requests[-1].json["messages"][0]["content"] == text


async def test_a_consumer_that_takes_nothing_holds_the_node_to_its_window(fake):
    """A 64-byte window: the node starts no chunk while its credit is spent (the stub's
    StreamTable would find a chunk begun without credit a violation), so what the edge holds
    for the stream stays within the window and one chunk until the consumer takes it; then the
    rest comes, whole."""
    limits = LinkLimits(window_bytes=64)
    words = [f"w{i}" for i in range(40)]
    async with serve(fake, limits) as node:
        edge = node.edge
        fake.enqueue(FakeBehavior(chunk_delay=0.001))  # (a frame per read, not all in one)
        stream = await edge.request(chat(" ".join(words), stream=True), provider="p")
        head = await edge.message(stream)
        assert head.kind is Kind.RESP_STREAM
        # Everything the upstream sent is read by now; a probe's answer on the same link
        # comes after whatever chunks the node could send without credit.
        await fake.wait_idle()
        probe = await edge.probe("p")
        await edge.answer(probe)
        held = edge.table.buffered_bytes
        pieces = [head]
        while pieces[-1].kind is not Kind.RESP_END:
            pieces.append(await edge.message(stream))  # (reading consumes: credit is granted)
        chunks = [len(m.data) for m in pieces if m.kind is Kind.RESP_CHUNK]
        assert 0 < held <= 64 + max(chunks)
        assert held < sum(chunks)  # the rest waited on the node (and upstream) for credit
        assert content(b"".join(m.data for m in pieces)) == " ".join(words)


async def test_drain_lets_requests_finish_then_cuts_the_rest(node, fake):
    runner = node.runner
    clock = MonotonicClock()
    assert await runner.drain(clock.now())  # (nothing in flight)
    fake.enqueue(FakeBehavior(hold=True), FakeBehavior(hold=True))
    first = await node.edge.request(chat("first"), provider="p")
    await fake.wait_in_flight(1)
    draining = asyncio.create_task(runner.drain(clock.now() + 60))
    fake.release()
    assert await draining
    [reply] = await node.edge.answer(first)
    assert reply.kind is Kind.RESP_REPLY
    second = await node.edge.request(chat("second"), provider="p")
    await fake.wait_in_flight(1)
    assert not await runner.drain(clock.now())  # the drain's time is up: cancelled
    [cut] = await node.edge.answer(second)
    assert cut.meta["type"] == "cancelled"
    assert runner.in_flight == 0

"""The edge's RemoteExecutor against a node scripted frame by frame (design §1, §2, §5): every
answer of the node comes back as a local executor's would — replies, streams, errors with
every flag, usage and final_response —, credit is granted as the consumer takes data, a
closed stream is cancelled and waited for, and a lost link follows rule K."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
import pytest

from iop_edge.adapters.base import (
    UnsupportedRequestError,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
)
from iop_edge.errors import AdapterError
from iop_edge.link import calls
from iop_edge.link.protocol import Flag, Frame, Kind, window_increment
from iop_edge.link.remote import RemoteNode
from iop_edge.testing.hostile_node import ScriptedNode
from iop_edge.testing.leaks import wait_for
from tests.helpers.links import (
    TOKENS,
    EdgeLinks,
    edge_links,
    remote_config,
    small_limits,
)

CONFIG = remote_config(
    {
        "n1": (
            [
                {
                    "name": "oa",
                    "type": "openai_compat",
                    "base_url": "http://127.0.0.1:9/v1",
                    "native_apis": ["responses"],
                },
                {"name": "sh", "type": "cli", "command": "cat"},
            ],
            [
                {"id": "p1", "type": "openai_compat", "adapter": "oa"},
                {"id": "c1", "type": "cli", "adapter": "sh"},
            ],
        )
    }
)


def chat(*, stream: bool = False) -> UpstreamCall:
    return UpstreamCall(
        endpoint="chat/completions",
        body={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        target="fake-model",
        stream=stream,
        headers={"Authorization": "Bearer upstream-key"},
        request_id="req-1",
        model="m",
    )


@asynccontextmanager
async def linked(**limits: int) -> AsyncIterator[tuple[EdgeLinks, ScriptedNode, RemoteNode]]:
    async with edge_links(CONFIG, limits=small_limits(**limits) if limits else None) as links:
        node = await ScriptedNode.dial(links.url, TOKENS["n1"])
        try:
            await node.handshake()
            await wait_for(lambda: links.nodes["n1"].connected)
            yield links, node, links.nodes["n1"]
        finally:
            await node.close()


def test_native_apis_come_from_the_payload() -> None:
    async def run() -> None:
        async with edge_links(CONFIG) as links:
            remote = links.nodes["n1"]
            assert remote.for_provider("p1").native_apis == frozenset({"responses"})
            assert remote.for_provider("c1").native_apis == frozenset()
            with pytest.raises(KeyError, match="providers with one: c1, p1"):
                remote.for_provider("nope")

    asyncio.run(run())


async def test_a_reply_comes_back_with_every_field() -> None:
    async with linked() as (_, node, remote):
        task = asyncio.create_task(remote.for_provider("p1").complete(chat()))
        req = await node.expect(Kind.REQ)
        asked = calls.call_from(req.meta, req.data)
        assert (asked.op, asked.provider) == ("call", "p1")
        assert asked.call == chat()
        answer = UpstreamReply(429, b'{"error":{}}', calls.usage_from(None), "busy", 2.5)
        await node.send(
            Frame(
                Kind.RESP_REPLY, stream=req.stream, meta=calls.reply_meta(answer), data=answer.body
            )
        )
        assert await task == answer


@pytest.mark.parametrize(
    "error",
    [
        AdapterError("upstream_timeout", "slow", status=504, failure="timeout", failover=True),
        AdapterError("upstream_error", "broke", failure=None, error_relayed=True),
        UnsupportedRequestError("no n > 1", param="n", code="unsupported_parameter"),
    ],
)
async def test_an_error_before_the_head_is_raised_with_every_flag(
    error: AdapterError | UnsupportedRequestError,
) -> None:
    async with linked() as (_, node, remote):
        task = asyncio.create_task(remote.for_provider("p1").open_stream(chat(stream=True)))
        req = await node.expect(Kind.REQ)
        await node.send(Frame(Kind.RESP_ERROR, stream=req.stream, meta=calls.error_meta(error)))
        with pytest.raises(type(error)) as raised:
            await task
    assert str(raised.value) == str(error)
    assert vars(raised.value) == vars(error)


async def test_a_stream_relays_chunks_usage_and_final_response_and_grants_credit() -> None:
    window = 64 * 1024
    async with linked(window_bytes=window) as (_, node, remote):
        task = asyncio.create_task(remote.for_provider("p1").open_stream(chat(stream=True)))
        req = await node.expect(Kind.REQ)
        await node.send(
            Frame(Kind.RESP_STREAM, stream=req.stream, meta={"status": 200}, data=b"first")
        )
        stream = await task
        assert isinstance(stream, UpstreamStream)
        assert await stream.first() == b"first"
        chunk = b"x" * (window // 2)
        await node.send(Frame(Kind.RESP_CHUNK, stream=req.stream, data=chunk[:100]))
        # A message in two frames (MORE) is one chunk.
        await node.send(Frame(Kind.RESP_CHUNK, Flag.MORE, req.stream, data=chunk[100:]))
        await node.send(Frame(Kind.RESP_CHUNK, stream=req.stream, data=b""))
        got = b""
        while len(got) < len(chunk):  # (joined as far as they arrived together)
            got += await anext(stream.frames)
        assert got == chunk
        # The consumer took half the window: a WINDOW grants it back once it asks for more.
        pending = asyncio.ensure_future(anext(stream.frames, b"END"))
        window_frame = await node.expect(Kind.WINDOW)
        assert window_frame.stream == req.stream
        assert window_increment(window_frame) == window // 2
        usage = {"prompt_tokens": 3, "completion_tokens": 5, "estimated": False}
        await node.send(
            Frame(Kind.RESP_END, stream=req.stream, meta={"usage": usage}, data=b'{"id":"r"}')
        )
        assert await pending == b"END"
        assert (stream.usage.prompt_tokens, stream.usage.completion_tokens) == (3, 5)
        assert stream.final_response() == b'{"id":"r"}'
        await stream.aclose()  # (ended: nothing is cancelled)


async def test_an_error_mid_stream_raises_out_of_the_frames() -> None:
    async with linked() as (_, node, remote):
        task = asyncio.create_task(remote.for_provider("p1").open_stream(chat(stream=True)))
        req = await node.expect(Kind.REQ)
        await node.send(Frame(Kind.RESP_STREAM, stream=req.stream, meta={"status": 200}, data=b"a"))
        stream = await task
        assert isinstance(stream, UpstreamStream)
        assert await stream.first() == b"a"
        error = AdapterError("upstream_error", "reset", failure="dropped")
        await node.send(Frame(Kind.RESP_ERROR, stream=req.stream, meta=calls.error_meta(error)))
        with pytest.raises(AdapterError, match="reset") as raised:
            await anext(stream.frames)
        assert (raised.value.failure, raised.value.failover) == ("dropped", False)
        await stream.aclose()


async def test_closing_a_stream_cancels_it_and_waits_for_the_node() -> None:
    async with linked() as (_, node, remote):
        task = asyncio.create_task(remote.for_provider("c1").open_stream(chat(stream=True)))
        req = await node.expect(Kind.REQ)
        await node.send(Frame(Kind.RESP_STREAM, stream=req.stream, meta={"status": 200}, data=b"a"))
        stream = await task
        assert isinstance(stream, UpstreamStream)
        closing = asyncio.create_task(stream.aclose())
        cancel = await node.expect(Kind.CANCEL)
        assert cancel.stream == req.stream
        await asyncio.sleep(0)
        assert not closing.done()  # waits for the node's terminal frame
        await node.send(Frame(Kind.RESP_CHUNK, stream=req.stream, data=b"late"))  # dropped
        error = AdapterError("upstream_error", "cancelled", failure=None)
        await node.send(
            Frame(
                Kind.RESP_ERROR, stream=req.stream, meta=calls.error_meta(error, kind="cancelled")
            )
        )
        await closing


@pytest.mark.parametrize(("provider", "failure"), [("p1", "dropped"), ("c1", "dropped")])
async def test_a_link_lost_before_the_head_fails_over_as_dropped(
    provider: str, failure: str
) -> None:
    async with linked() as (links, node, remote):
        task = asyncio.create_task(remote.for_provider(provider).complete(chat()))
        await node.expect(Kind.REQ)
        await node.ws.close()
        with pytest.raises(AdapterError, match=r"was lost .* before the answer began") as raised:
            await task
        await wait_for(lambda: links.states == [("n1", True), ("n1", False)])
    assert (raised.value.failure, raised.value.failover) == (failure, True)


async def test_a_call_while_disconnected_fails_over_as_connect() -> None:
    async with edge_links(CONFIG) as links:
        with pytest.raises(AdapterError) as raised:
            await links.nodes["n1"].for_provider("p1").complete(chat())
        assert (raised.value.failure, raised.value.failover) == ("connect", True)
        assert await links.nodes["n1"].probe("p1") == (False, "node link down")
        assert await links.nodes["n1"].for_provider("p1").count_tokens({}, "t", {}, "r") is None


async def test_a_link_lost_mid_stream_raises_out_of_the_frames() -> None:
    async with linked() as (_, node, remote):
        task = asyncio.create_task(remote.for_provider("p1").open_stream(chat(stream=True)))
        req = await node.expect(Kind.REQ)
        await node.send(Frame(Kind.RESP_STREAM, stream=req.stream, meta={"status": 200}, data=b"a"))
        stream = await task
        assert isinstance(stream, UpstreamStream)
        assert await stream.first() == b"a"
        await node.ws.close()
        with pytest.raises(AdapterError, match="in the middle of the answer") as raised:
            await anext(stream.frames)
        assert (raised.value.failure, raised.value.failover) == ("dropped", False)
        await stream.aclose()


async def test_probes_and_token_counts_travel_the_link() -> None:
    async with linked() as (_, node, remote):
        probe = asyncio.create_task(remote.probe("p1"))
        frame = await node.expect(Kind.PROBE)
        assert calls.probe_from(frame.meta) == "p1"
        await node.send(
            Frame(
                Kind.PROBE_RESULT, stream=frame.stream, meta=calls.probe_result_meta((False, "503"))
            )
        )
        assert await probe == (False, "503")
        count = asyncio.create_task(
            remote.for_provider("p1").count_tokens({"messages": []}, "t", {}, "r")
        )
        req = await node.expect(Kind.REQ)
        assert req.meta["op"] == "count_tokens"
        assert orjson.loads(req.data) == {"messages": []}
        await node.send(Frame(Kind.RESP_REPLY, stream=req.stream, meta=calls.tokens_meta(17)))
        assert await count == 17

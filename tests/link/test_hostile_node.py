"""A hostile node (design §2, "Violations close the link"): garbage, huge frames, forged ids,
data beyond credit, floods and kinds from the wrong side each close that node's link with its
reason and count a violation, while a second node keeps streaming byte-exact."""

from __future__ import annotations

import asyncio
import struct

import pytest

from iop_edge.adapters.base import UpstreamCall, UpstreamStream
from iop_edge.errors import AdapterError
from iop_edge.link.protocol import CLOSE_TOO_BIG, CLOSE_VIOLATION, Frame, Kind, encode, ping_data
from iop_edge.testing.hostile_node import ScriptedNode
from iop_edge.testing.leaks import wait_for
from tests.helpers.links import (
    TOKENS,
    EdgeLinks,
    edge_links,
    openai_node,
    remote_config,
    small_limits,
)

CONFIG = remote_config(
    {
        "n1": openai_node("http://127.0.0.1:9/v1", "p1"),
        "n2": openai_node("http://127.0.0.1:9/v1", "p2"),
    }
)
WINDOW = 64 * 1024


def call() -> UpstreamCall:
    return UpstreamCall(
        endpoint="chat/completions",
        body={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        target="t",
        stream=True,
        headers={},
        request_id="r",
    )


async def streaming(
    links: EdgeLinks, node: ScriptedNode, provider: str
) -> tuple[UpstreamStream, int]:
    """A stream under way on ``node`` (its REQ answered with RESP_STREAM)."""
    task = asyncio.create_task(
        links.nodes[{"p1": "n1", "p2": "n2"}[provider]].for_provider(provider).open_stream(call())
    )
    req = await node.expect(Kind.REQ)
    await node.send(Frame(Kind.RESP_STREAM, stream=req.stream, meta={"status": 200}, data=b"go"))
    stream = await task
    assert isinstance(stream, UpstreamStream)
    assert await stream.first() == b"go"
    return stream, req.stream


async def drain(stream: UpstreamStream) -> None:
    """Take every frame (chunks admitted before a violation still come first)."""
    async for _ in stream.frames:
        pass


async def hostile_acts(node: ScriptedNode, act: str, stream: int) -> None:
    if act == "garbage":
        await node.send_raw(b"\xff" * 3)
    elif act == "unknown_kind":
        await node.send_raw(struct.pack("!BBII", 0x7F, 0, 0, 0))
    elif act == "text":
        await node.send_text("hello")
    elif act == "forged_id":
        await node.send(Frame(Kind.RESP_CHUNK, stream=stream + 40, data=b"x"))
    elif act == "wrong_direction":
        await node.send(Frame(Kind.REQ, stream=stream + 1, meta={"op": "call"}))
    elif act == "over_credit":
        for _ in range(3):  # the window, then one more chunk begun with no credit left
            await node.send(Frame(Kind.RESP_CHUNK, stream=stream, data=b"y" * (WINDOW // 2)))
    elif act == "ping_flood":
        for i in range(30):
            await node.send(Frame(Kind.PING, data=ping_data(i)))
    elif act == "huge_frame":
        await node.send_raw(encode(Frame(Kind.RESP_CHUNK, stream=stream, data=b"z" * (2 * WINDOW))))


@pytest.mark.parametrize(
    ("act", "code", "reason"),
    [
        ("garbage", CLOSE_VIOLATION, "short_header"),
        ("unknown_kind", CLOSE_VIOLATION, "unknown_kind"),
        ("text", CLOSE_VIOLATION, "text_message"),
        ("forged_id", CLOSE_VIOLATION, "unknown_stream"),
        ("wrong_direction", CLOSE_VIOLATION, "wrong_direction"),
        ("over_credit", CLOSE_VIOLATION, "over_credit"),
        ("ping_flood", CLOSE_VIOLATION, "ping_flood"),
        ("huge_frame", CLOSE_TOO_BIG, None),
    ],
)
async def test_a_violation_closes_only_the_hostile_link(
    act: str, code: int, reason: str | None
) -> None:
    limits = small_limits(window_bytes=WINDOW, max_frame_bytes=WINDOW + 1024)
    async with edge_links(CONFIG, limits=limits) as links:
        bad = await ScriptedNode.dial(links.url, TOKENS["n1"], max_msg_size=4 * WINDOW)
        good = await ScriptedNode.dial(links.url, TOKENS["n2"])
        try:
            await bad.handshake()
            await good.handshake()
            await wait_for(lambda: links.nodes["n1"].connected and links.nodes["n2"].connected)
            bad_stream, bad_id = await streaming(links, bad, "p1")
            good_stream, good_id = await streaming(links, good, "p2")
            await hostile_acts(bad, act, bad_id)
            closed_code, closed_reason = await bad.closed()
            # The hostile node's stream ends with the lost-link error; the other streams on.
            with pytest.raises(AdapterError, match="in the middle of the answer"):
                await drain(bad_stream)
            await good.send(Frame(Kind.RESP_CHUNK, stream=good_id, data=b"still here"))
            assert await anext(good_stream.frames) == b"still here"
            await good.send(Frame(Kind.RESP_END, stream=good_id, meta={}))
            assert await anext(good_stream.frames, b"END") == b"END"
            await bad_stream.aclose()
            await good_stream.aclose()
            stats = {s.node_id: s for s in links.server.statistics()}
        finally:
            await bad.close()
            await good.close()
    assert closed_code == code
    if reason is not None:
        assert closed_reason == reason
        assert stats["n1"].violations == 1
    assert stats["n2"].connected
    assert stats["n2"].violations == 0

"""The edge's node listener (design §2): auth before the upgrade, the handshake, versions,
the HELLO deadline, superseding, what a node receives, and what never reaches a log."""

from __future__ import annotations

import io

import orjson
import pytest

from iop_edge.config.payload import node_payload, payload_generation, payload_json
from iop_edge.link.protocol import CLOSE_PROTOCOL, CLOSE_SUPERSEDED, CLOSE_VIOLATION, Kind
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.hostile_node import DialRefused, ScriptedNode
from iop_edge.testing.leaks import wait_for
from tests.helpers.links import TOKENS, edge_links, openai_node, remote_config

CONFIG = remote_config(
    {
        "n1": openai_node("http://127.0.0.1:9/v1", "p1"),
        "n2": (
            [
                {
                    "name": "oa2",
                    "type": "openai_compat",
                    "base_url": "http://10.9.8.7:8000/v1",
                    "headers": {"Authorization": "Bearer sk-secret-of-node-two"},
                }
            ],
            [{"id": "p2", "type": "openai_compat", "adapter": "oa2"}],
        ),
    }
)


@pytest.mark.parametrize("token", [None, "iopn_not-a-node-token", TOKENS["n1"] + "x"])
async def test_an_unknown_token_is_401_with_nothing_upgraded(token: str | None) -> None:
    async with edge_links(CONFIG) as links:
        with pytest.raises(DialRefused) as refused:
            await ScriptedNode.dial(links.url, token)
        assert refused.value.status == 401
        assert links.server.refused["invalid_node_token"] == 1
        assert links.listener.statistics().open_connections <= 1  # (the refused GET's own)
        assert links.states == []
        assert all(not s.connected for s in links.server.statistics())


async def test_a_node_is_attached_once_it_acknowledges_its_payload() -> None:
    async with edge_links(CONFIG) as links:
        node = await ScriptedNode.dial(links.url, TOKENS["n1"])
        try:
            welcome, payload = await node.handshake()
            assert welcome.meta["node_id"] == "n1"
            assert welcome.meta["protocol"] == 1
            assert welcome.meta["heartbeat_ms"] == 2000
            assert welcome.meta["limits"]["max_frame_bytes"] == 1024 * 1024
            await wait_for(lambda: links.states == [("n1", True)])
            stats = {s.node_id: s for s in links.server.statistics()}
            assert stats["n1"].connected
            assert not stats["n2"].connected
            assert stats["n1"].generation_acked == payload.meta["generation"]
            assert stats["n1"].agent_version == "test"
        finally:
            await node.close()
        await wait_for(lambda: links.states == [("n1", True), ("n1", False)])
        assert links.server.statistics()[0].last_down_reason == "node_closed"


async def test_a_node_receives_its_own_payload_and_nothing_else() -> None:
    expected = node_payload(CONFIG, "n1")
    async with edge_links(CONFIG) as links:
        node = await ScriptedNode.dial(links.url, TOKENS["n1"])
        try:
            await node.hello()
            raw: list[bytes] = []
            for _ in range(2):
                msg = await node.ws.receive()
                raw.append(msg.data)
        finally:
            await node.close()
    received = b"".join(raw)
    payload = orjson.loads(received[received.index(b'{"generation"') :])
    assert payload["generation"] == payload_generation(expected)
    assert payload["payload"] == orjson.loads(payload_json(expected))
    # Nothing of the other node: its credentials, its upstream, its provider.
    for secret in (b"sk-secret-of-node-two", b"10.9.8.7", b'"p2"', b"oa2"):
        assert secret not in received


async def test_a_generation_the_node_holds_is_not_sent_again() -> None:
    generation = payload_generation(node_payload(CONFIG, "n1"))
    async with edge_links(CONFIG) as links:
        node = await ScriptedNode.dial(links.url, TOKENS["n1"])
        try:
            _, payload = await node.handshake(have=["0123456789abcdef", generation])
        finally:
            await node.close()
    assert payload.meta == {"generation": generation}


async def test_another_protocol_version_is_refused_naming_both() -> None:
    async with edge_links(CONFIG) as links:
        node = await ScriptedNode.dial(links.url, TOKENS["n1"])
        try:
            await node.hello(protocol=2)
            refused = await node.expect(Kind.REFUSED)
            code, _ = await node.closed()
        finally:
            await node.close()
        assert links.states == []
    assert refused.meta["reason"] == "protocol"
    assert refused.meta["edge_protocol"] == 1
    assert refused.meta["node_protocol"] == 2
    assert "link protocol 2" in refused.meta["message"]
    assert "speaks 1" in refused.meta["message"]
    assert code == CLOSE_PROTOCOL


async def test_no_hello_within_the_deadline_closes_the_link() -> None:
    clock = FakeClock()
    async with edge_links(CONFIG, clock=clock) as links:
        node = await ScriptedNode.dial(links.url, TOKENS["n1"])
        try:
            await wait_for(lambda: 10.0 in clock.armed)
            clock.advance_to(9.999)
            assert 10.0 in clock.armed
            clock.advance_to(10.0)
            code, reason = await node.closed()
        finally:
            await node.close()
        assert (code, reason) == (CLOSE_VIOLATION, "hello_timeout")
        assert links.server.statistics()[0].violations == 1


async def test_a_first_frame_other_than_hello_is_a_violation() -> None:
    async with edge_links(CONFIG) as links:
        node = await ScriptedNode.dial(links.url, TOKENS["n1"])
        try:
            await node.send_raw(b"\x05\x00\x00\x00\x00\x00\x00\x00\x00\x00")  # an ACK
            code, reason = await node.closed()
        finally:
            await node.close()
    assert (code, reason) == (CLOSE_VIOLATION, "phase")


async def test_the_newest_link_of_a_node_supersedes_the_older() -> None:
    async with edge_links(CONFIG) as links:
        old = await ScriptedNode.dial(links.url, TOKENS["n1"])
        new = await ScriptedNode.dial(links.url, TOKENS["n1"])
        try:
            await old.handshake()
            await wait_for(lambda: links.nodes["n1"].connected)
            await new.handshake()
            refused = await old.expect(Kind.REFUSED)
            code, _ = await old.closed()
            await wait_for(lambda: links.server.statistics()[0].last_down_reason is not None)
            stats = links.server.statistics()[0]
            states = list(links.states)
        finally:
            await old.close()
            await new.close()
    assert refused.meta["reason"] == "superseded"
    assert code == CLOSE_SUPERSEDED
    # The node stayed connected throughout: no down-and-up for the pool.
    assert states == [("n1", True)]
    assert stats.connected
    assert stats.reconnects == 1
    assert stats.last_down_reason == "superseded"


async def test_a_dial_flood_is_429() -> None:
    clock = FakeClock()
    async with edge_links(CONFIG, clock=clock) as links:
        for _ in range(5):
            node = await ScriptedNode.dial(links.url, TOKENS["n1"])
            await node.close()
        with pytest.raises(DialRefused) as refused:
            await ScriptedNode.dial(links.url, TOKENS["n1"])
        assert refused.value.status == 429
        clock.advance(10.0)
        node = await ScriptedNode.dial(links.url, TOKENS["n1"])  # the window moved on
        await node.close()


async def test_the_token_never_reaches_the_log(log_stream: io.StringIO) -> None:
    async with edge_links(CONFIG) as links:
        with pytest.raises(DialRefused):
            await ScriptedNode.dial(links.url, "iopn_a-wrong-token-that-must-stay-out")
        node = await ScriptedNode.dial(links.url, TOKENS["n1"])
        try:
            await node.handshake()
            await node.send_text("garbage")
            await node.closed()
        finally:
            await node.close()
    log = log_stream.getvalue()
    assert "node_link_up" in log
    assert "node_link_violation" in log
    for token in (*TOKENS.values(), "iopn_a-wrong-token-that-must-stay-out"):
        assert token not in log


async def test_a_dial_with_an_unknown_token_is_logged_at_most_every_10_s(
    log_stream: io.StringIO,
) -> None:
    """Issue 29 item 9: a dial with a token that matches no node is logged
    ``node_link_refused`` with its reason and the peer, never the token; a flood of them writes
    one line every 10 s (of the injected clock) whose ``count`` says how many it stands for."""
    clock = FakeClock()
    async with edge_links(CONFIG, clock=clock) as links:
        for _ in range(3):
            with pytest.raises(DialRefused):
                await ScriptedNode.dial(links.url, "iopn_flooding-token-0001")
        clock.advance(10)
        with pytest.raises(DialRefused):
            await ScriptedNode.dial(links.url, "iopn_flooding-token-0001")
        assert links.server.refused["invalid_node_token"] == 4
    lines = [orjson.loads(line) for line in log_stream.getvalue().splitlines()]
    refused = [line for line in lines if line["event"] == "node_link_refused"]
    assert [(r["reason"], r["count"]) for r in refused] == [
        ("invalid_node_token", 1),
        ("invalid_node_token", 3),
    ]
    assert refused[0]["peer"].startswith("127.0.0.1")
    assert "iopn_flooding-token-0001" not in log_stream.getvalue()

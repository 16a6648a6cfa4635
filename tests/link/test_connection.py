"""One end of a node link over a real WebSocket (issue 29, design §2 "Transport",
"Heartbeats", "Violations"): an aiohttp server and client on 127.0.0.1, each side's
``LinkConnection`` on its own ``FakeClock``. Frames round-trip; the ``PING`` round trip is
measured; a silent link is dead after exactly 3 heartbeats; an oversize frame, a text message,
a ``PING`` flood or a kind in the wrong direction closes the link with its reason."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from iop_edge.link.connection import (
    LinkClosed,
    LinkConnection,
    client_options,
    server_websocket,
)
from iop_edge.link.handshake import LinkLimits
from iop_edge.link.protocol import (
    CLOSE_DEAD,
    CLOSE_TOO_BIG,
    CLOSE_VIOLATION,
    Flag,
    Frame,
    Kind,
    LinkViolation,
    encode,
    ping_data,
)
from iop_edge.testing.clock import FakeClock

BOUND = 10.0
"""Seconds any one wait may take before the test fails (a hang guard, not a timing)."""


@dataclass
class Link:
    """Both ends of one link, their clocks, and the node's raw WebSocket."""

    edge: LinkConnection
    node: LinkConnection
    edge_clock: FakeClock
    node_clock: FakeClock
    node_ws: aiohttp.ClientWebSocketResponse


@asynccontextmanager
async def connected(limits: LinkLimits | None = None) -> AsyncIterator[Link]:
    """A link between an aiohttp server (the edge's end) and client (the node's)."""
    limits = limits or LinkLimits()
    accepted: asyncio.Queue[web.WebSocketResponse] = asyncio.Queue()
    finished = asyncio.Event()

    async def handle(request: web.Request) -> web.WebSocketResponse:
        ws = server_websocket(limits)
        await ws.prepare(request)
        accepted.put_nowait(ws)
        await finished.wait()
        return ws

    app = web.Application()
    app.router.add_get("/link", handle)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/link"
    edge_clock, node_clock = FakeClock(), FakeClock()
    try:
        async with aiohttp.ClientSession() as session:
            node_ws = await session.ws_connect(url, **client_options(limits))
            async with asyncio.timeout(BOUND):
                server_ws = await accepted.get()
            link = Link(
                LinkConnection(server_ws, local="edge", limits=limits, clock=edge_clock),
                LinkConnection(node_ws, local="node", limits=limits, clock=node_clock),
                edge_clock,
                node_clock,
                node_ws,
            )
            yield link
            # The node closes while the edge reads, so that the handshake completes at once.
            async with asyncio.timeout(BOUND):
                await asyncio.gather(link.node.close(1000, "test over"), drain(link.edge))
                await link.edge.wait_closed()
                await link.node.wait_closed()
    finally:
        finished.set()
        await runner.cleanup()


async def drain(end: LinkConnection) -> None:
    """Receive on ``end`` until its link is closed."""
    with contextlib.suppress(LinkClosed, LinkViolation):
        while True:
            await end.receive()


async def receive(end: LinkConnection) -> Frame:
    async with asyncio.timeout(BOUND):
        return await end.receive()


async def closed(end: LinkConnection) -> LinkClosed:
    """The :class:`LinkClosed` that ``end``'s next receive raises."""
    with pytest.raises(LinkClosed) as caught:
        await receive(end)
    return caught.value


async def until(condition: Callable[[], bool]) -> None:
    """Let the loop run until ``condition`` holds (a frame that a timer's task sent, or that
    arrived): synchronised on the state, bounded by :data:`BOUND`."""
    async with asyncio.timeout(BOUND):
        while not condition():
            await asyncio.sleep(0)


async def sent_by(end: LinkConnection, before: int) -> None:
    """Wait until ``end`` has sent more than ``before`` bytes."""
    await until(lambda: end.bytes_sent > before)


async def test_frames_travel_both_ways_as_they_were_sent():
    async with connected() as link:
        request = Frame(Kind.REQ, Flag.MORE, 1, {"op": "call"}, b'{"model": "m"}')
        await link.edge.send(request)
        assert await receive(link.node) == request
        chunk = Frame(Kind.RESP_CHUNK, stream=1, data=b"data: {}\n\n")
        await link.node.send(chunk)
        assert await receive(link.edge) == chunk


async def test_the_byte_counters_count_every_frame_each_way():
    async with connected() as link:
        frames = [
            Frame(Kind.REQ, stream=1, meta={"op": "call"}, data=b"x" * 1000),
            Frame(Kind.CANCEL, stream=1),
            Frame(Kind.GOAWAY, meta={"reason": "handover"}),
        ]
        for frame in frames:
            await link.edge.send(frame)
            await receive(link.node)
        answer = Frame(Kind.RESP_CHUNK, stream=1, data=b"y" * 300)
        await link.node.send(answer)
        await receive(link.edge)
        expected = sum(len(encode(f)) for f in frames)
        assert (link.edge.bytes_sent, link.node.bytes_received) == (expected, expected)
        back = len(encode(answer))
        assert (link.node.bytes_sent, link.edge.bytes_received) == (back, back)


async def ping_round_trip(link: Link, ping_at: float, pong_at: float) -> None:
    """The edge pings at ``ping_at`` on its clock; the node echoes it; the edge reads the
    ``PONG`` when its clock reads ``pong_at``."""
    before = link.edge.bytes_sent
    link.edge_clock.advance_to(ping_at)
    await sent_by(link.edge, before)
    link.edge_clock.advance_to(pong_at)
    # A frame after the PING: once the node has it, its PONG went out before anything it sends.
    await link.edge.send(Frame(Kind.WINDOW, stream=1, data=b"\0\0\0\1"))
    assert (await receive(link.node)).kind is Kind.WINDOW
    await link.node.send(Frame(Kind.STATS, meta={"in_flight": 0}))
    assert (await receive(link.edge)).kind is Kind.STATS


async def test_the_round_trip_is_measured_from_ping_to_pong():
    async with connected() as link:
        link.edge.start_heartbeats(2000)
        assert link.edge.rtt is None
        await ping_round_trip(link, ping_at=2.0, pong_at=2.5)
        assert link.edge.rtt == 0.5
        await ping_round_trip(link, ping_at=4.0, pong_at=4.125)
        # a moving average: 0.5 + 0.2 * (0.125 - 0.5)
        assert link.edge.rtt == pytest.approx(0.425)
        assert link.node.rtt is None  # (the node did not ping)


async def test_a_silent_link_is_dead_after_exactly_three_heartbeats():
    async with connected() as link:
        link.edge.start_heartbeats(1000)
        link.edge_clock.advance_to(2.999)
        assert not link.edge.closed
        assert link.edge.close_code is None
        link.edge_clock.advance_to(3.0)
        assert link.edge.closed
        assert link.edge.close_code == CLOSE_DEAD
        node_side = await closed(link.node)
        assert (node_side.code, node_side.reason, node_side.local) == (
            CLOSE_DEAD,
            "heartbeat",
            False,
        )
        edge_side = await closed(link.edge)
        assert (edge_side.code, edge_side.reason, edge_side.local) == (
            CLOSE_DEAD,
            "heartbeat",
            True,
        )


async def test_any_frame_counts_as_life():
    async with connected() as link:
        link.edge.start_heartbeats(1000)
        link.edge_clock.advance_to(2.5)
        await link.node.send(Frame(Kind.STATS, meta={"in_flight": 0}))
        await receive(link.edge)
        assert link.edge.last_received == 2.5
        link.edge_clock.advance_to(5.499)
        assert not link.edge.closed
        link.edge_clock.advance_to(5.5)
        assert link.edge.close_code == CLOSE_DEAD


async def test_an_answered_link_stays_alive():
    """The node answers every PING: the edge hears a PONG each heartbeat and never dies."""
    async with connected() as link:
        link.edge.start_heartbeats(1000)
        node_loop = asyncio.create_task(link.node.receive())
        edge_loop = asyncio.create_task(link.edge.receive())
        for second in range(1, 10):
            heard = link.edge.bytes_received
            link.edge_clock.advance_to(float(second))
            await until(lambda: link.edge.bytes_received > heard)  # noqa: B023 (awaited here)
        assert not link.edge.closed
        assert link.edge.last_received == 9.0
        assert link.edge.rtt == 0.0  # (the clock stood still between PING and PONG)
        for loop in (node_loop, edge_loop):
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop


async def test_an_oversize_frame_closes_the_link_with_1009():
    async with connected(LinkLimits(max_frame_bytes=1024)) as link:
        await link.node.send(Frame(Kind.RESP_CHUNK, stream=1, data=b"x" * 1014))
        assert (await receive(link.edge)).data == b"x" * 1014  # (1024 bytes with the header)
        await link.node.send(Frame(Kind.RESP_CHUNK, stream=1, data=b"x" * 1015))
        with pytest.raises(LinkViolation, match=r"over max_frame_bytes \(1024\)") as caught:
            await receive(link.edge)
        assert caught.value.reason == "frame_too_large"
        assert link.edge.close_code == CLOSE_TOO_BIG
        assert (await closed(link.node)).code == CLOSE_TOO_BIG


@pytest.mark.parametrize(
    ("send", "reason"),
    [
        ("text", "text_message"),
        ("garbage", "short_header"),
        ("req from a node", "wrong_direction"),
        ("bad ping", "bad_field"),
    ],
)
async def test_a_violation_closes_the_link_with_its_reason(send, reason):
    async with connected() as link:
        if send == "text":
            await link.node_ws.send_str("hello")
        elif send == "garbage":
            await link.node_ws.send_bytes(b"\x01\x02")
        elif send == "req from a node":
            await link.node.send(Frame(Kind.REQ, stream=1))
        else:
            await link.node.send(Frame(Kind.PING, data=b"short"))
        with pytest.raises(LinkViolation) as caught:
            await receive(link.edge)
        assert caught.value.reason == reason
        assert link.edge.close_code == CLOSE_VIOLATION
        node_side = await closed(link.node)
        assert (node_side.code, node_side.reason) == (CLOSE_VIOLATION, reason)


async def test_a_ping_flood_closes_the_link():
    async with connected(LinkLimits(max_pings_per_second=5)) as link:
        for _ in range(6):
            await link.node.send(Frame(Kind.PING, data=ping_data(1)))
        with pytest.raises(LinkViolation, match="6 PINGs within a second; at most 5") as caught:
            await receive(link.edge)
        assert caught.value.reason == "ping_flood"
        assert link.edge.bytes_sent == 5 * len(encode(Frame(Kind.PONG, data=ping_data(1))))


async def test_pings_spread_over_seconds_are_no_flood():
    async with connected(LinkLimits(max_pings_per_second=5)) as link:
        for second in range(3):
            link.edge_clock.advance_to(float(second))
            for _ in range(5):
                await link.node.send(Frame(Kind.PING, data=ping_data(1)))
            await link.node.send(Frame(Kind.STATS, meta={}))
            assert (await receive(link.edge)).kind is Kind.STATS
        assert not link.edge.closed


async def test_the_peers_close_code_and_reason_are_reported():
    async with connected() as link:
        receiving = asyncio.create_task(closed(link.edge))
        await link.node.close(4003, "superseded")
        by_node = await receiving
        assert (by_node.code, by_node.reason, by_node.local) == (4003, "superseded", False)


async def test_sending_on_a_closed_link_raises_link_closed():
    async with connected() as link:
        receiving = asyncio.create_task(closed(link.node))
        await link.edge.close(1001, "stopping")
        assert (await receiving).code == 1001
        with pytest.raises(
            LinkClosed, match=r"closed by this side \(code 1001, reason 'stopping'\)"
        ):
            await link.edge.send(Frame(Kind.GOAWAY, meta={"reason": "stopping"}))

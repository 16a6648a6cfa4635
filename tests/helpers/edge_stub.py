"""A scripted edge for the node tests: an aiohttp server on ``127.0.0.1`` (port 0) whose
``GET /link`` checks the node's bearer token (401 otherwise), goes through the handshake on a
real :class:`~iop_edge.link.connection.LinkConnection` (``HELLO`` → ``WELCOME`` → ``PAYLOAD`` →
``ACK``) and then hands the test a :class:`StubLink` to send ``REQ``, ``PROBE``, ``CANCEL`` and
``GOAWAY`` on and read the node's answers through the edge's own
:class:`~iop_edge.link.flow.StreamTable` — so a node that breaks the flow-control or stream rules
fails the test as it would break a real edge's link.

What it does not do is the edge's admission or request path: the test plays the edge.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from iop_edge.adapters.base import UpstreamCall
from iop_edge.config import load_config
from iop_edge.config.payload import NodeConfigPayload, node_payload
from iop_edge.link.calls import call_body, call_meta, count_tokens_meta, probe_meta
from iop_edge.link.connection import LinkClosed, LinkConnection, server_websocket
from iop_edge.link.flow import StreamTable
from iop_edge.link.handshake import Hello, LinkLimits, Refused, Welcome, parse_hello
from iop_edge.link.protocol import (
    CLOSE_NORMAL,
    CLOSE_PROTOCOL,
    PROTOCOL_VERSION,
    TERMINAL,
    Frame,
    Kind,
    LinkViolation,
    split,
    window_data,
)
from iop_edge.node.dial import dial
from iop_edge.node.generations import PayloadCache
from iop_edge.node.options import NodeOptions
from iop_edge.node.runner import LinkRunner
from iop_edge.runtime.clock import MonotonicClock
from iop_edge.runtime.logs import get_logger
from tests.helpers import FAKE_CLI
from tests.helpers.adapters import config_text

__all__ = ["EdgeStub", "ServedRunner", "StubLink", "edge_stub", "fake_payload", "served_runner"]


@dataclass
class StubLink:
    """One acknowledged link, as the edge holds it."""

    link: LinkConnection
    table: StreamTable
    hello: Hello
    ack: dict[str, Any]
    control: asyncio.Queue[Frame] = field(default_factory=asyncio.Queue)
    """Frames of stream 0 the node sent after the ``ACK`` (``STATS``, ``GOAWAY``)."""
    violations: list[LinkViolation] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    close_reason: LinkClosed | None = None
    _messages: dict[int, asyncio.Queue[Frame]] = field(default_factory=dict)

    async def request(
        self, call: UpstreamCall, *, provider: str | None = None, adapter: str | None = None
    ) -> int:
        """Send ``call`` as a ``REQ`` (its body in frames of ``max_frame_bytes``); its id."""
        stream = self.table.open("stream" if call.stream else "reply")
        self._messages[stream] = asyncio.Queue()
        meta = call_meta(call, provider=provider, adapter=adapter)
        for frame in split(
            Kind.REQ, stream, meta, call_body(call), self.link.limits.max_frame_bytes
        ):
            await self.link.send(frame)
        return stream

    async def count_tokens(self, body: dict[str, Any], target: str, *, provider: str) -> int:
        """Send a ``count_tokens`` ``REQ``; its id."""
        stream = self.table.open("reply")
        self._messages[stream] = asyncio.Queue()
        meta = count_tokens_meta(target, {}, "req-count", provider=provider)
        await self.link.send(Frame(Kind.REQ, stream=stream, meta=meta, data=orjson.dumps(body)))
        return stream

    async def probe(self, provider: str) -> int:
        """Send a ``PROBE``; its id."""
        stream = self.table.open("probe")
        self._messages[stream] = asyncio.Queue()
        await self.link.send(Frame(Kind.PROBE, stream=stream, meta=probe_meta(provider)))
        return stream

    async def cancel(self, stream: int) -> None:
        """The client left: drop what the stream holds and send ``CANCEL``."""
        if self.table.cancel(stream):
            await self.link.send(Frame(Kind.CANCEL, stream=stream))

    async def message(self, stream: int, *, consume: bool = True) -> Frame:
        """The stream's next complete message. A chunk read is consumed (``consume``), and the
        credit the edge's table then grants goes back in a ``WINDOW``."""
        async with asyncio.timeout(20):
            message = await self._messages[stream].get()
        if consume and message.kind is Kind.RESP_CHUNK:
            await self.consume(stream, len(message.data))
        return message

    async def consume(self, stream: int, nbytes: int) -> None:
        """The consumer took ``nbytes`` of the stream's chunks."""
        grant = self.table.consumed(stream, nbytes)
        if grant:
            await self.link.send(Frame(Kind.WINDOW, stream=stream, data=window_data(grant)))

    async def answer(self, stream: int) -> list[Frame]:
        """Every message of the stream up to its terminal one."""
        messages = [await self.message(stream)]
        while messages[-1].kind not in TERMINAL:
            messages.append(await self.message(stream))
        return messages

    async def go_away(self, reason: str) -> None:
        await self.link.send(Frame(Kind.GOAWAY, meta={"reason": reason}))

    async def read(self) -> None:
        """The edge's receive loop for this link (run by the stub's handler)."""
        try:
            while True:
                frame = await self.link.receive()
                if frame.stream == 0:
                    self.control.put_nowait(frame)
                    continue
                message = self.table.admit(frame)
                if message is not None:
                    self._messages[message.stream].put_nowait(message)
        except LinkViolation as exc:
            self.violations.append(exc)
        except LinkClosed as exc:
            self.close_reason = exc
        finally:
            self.closed.set()


@dataclass
class EdgeStub:
    """The scripted edge (see the module docstring). ``welcome_protocol`` is the version its
    ``WELCOME`` claims; ``refuse_protocol`` makes it answer ``HELLO`` with
    ``REFUSED{protocol}`` as an edge of that version would."""

    token: str
    payload: NodeConfigPayload
    generation: str = "g1"
    heartbeat_ms: int = 2000
    limits: LinkLimits = field(default_factory=LinkLimits)
    welcome_protocol: int = PROTOCOL_VERSION
    refuse_protocol: int | None = None
    payload_json: dict[str, Any] | None = None
    """Sent in ``PAYLOAD`` instead of :attr:`payload` (a payload the node cannot build)."""
    url: str = ""
    links: asyncio.Queue[StubLink] = field(default_factory=asyncio.Queue)
    hellos: list[Hello] = field(default_factory=list)
    acks: list[dict[str, Any]] = field(default_factory=list)
    unauthorized: int = 0
    """Dials refused with 401."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            self.unauthorized += 1
            return web.json_response(
                {"error": {"code": "invalid_node_token", "message": "unknown node token"}},
                status=401,
            )
        ws = server_websocket(self.limits)
        await ws.prepare(request)
        link = LinkConnection(
            ws, local="edge", limits=self.limits, clock=MonotonicClock(), peer="node"
        )
        with contextlib.suppress(LinkClosed, LinkViolation):
            stub = await self._handshake(link)
            if stub is not None:
                link.start_heartbeats(self.heartbeat_ms)
                self.links.put_nowait(stub)
                await stub.read()
        return ws

    async def _handshake(self, link: LinkConnection) -> StubLink | None:
        frame = await link.receive()
        assert frame.kind is Kind.HELLO, frame
        if self.refuse_protocol is not None:
            refused = Refused(
                "protocol",
                f"iop-node speaks link protocol {frame.meta['protocol']}; this edge speaks "
                f"{self.refuse_protocol}: upgrade the older of iop-edge and iop-node",
                edge_protocol=self.refuse_protocol,
                node_protocol=frame.meta["protocol"],
            )
            await link.send(Frame(Kind.REFUSED, meta=refused.to_meta()))
            await link.close(CLOSE_PROTOCOL, "protocol")
            return None
        hello = parse_hello(frame.meta)
        self.hellos.append(hello)
        welcome = Welcome(
            protocol=PROTOCOL_VERSION,
            edge_id="stub-edge",
            edge_version="0.0-stub",
            node_id=self.payload.node_id,
            heartbeat_ms=self.heartbeat_ms,
            limits=self.limits,
        )
        meta = welcome.to_meta()
        meta["protocol"] = self.welcome_protocol
        await link.send(Frame(Kind.WELCOME, meta=meta))
        payload: dict[str, Any] = {"generation": self.generation}
        if self.generation not in hello.have:
            payload["payload"] = self.payload_json or self.payload.model_dump(mode="json")
        await link.send(Frame(Kind.PAYLOAD, meta=payload))
        ack = await link.receive()
        assert ack.kind is Kind.ACK, ack
        self.acks.append(ack.meta)
        if "error" in ack.meta:
            return None
        return StubLink(link, StreamTable(self.limits), hello, ack.meta)

    async def next_link(self) -> StubLink:
        """The next link the node opens and acknowledges."""
        async with asyncio.timeout(20):
            return await self.links.get()


@contextlib.asynccontextmanager
async def edge_stub(stub: EdgeStub, tls: ssl.SSLContext | None = None) -> AsyncIterator[EdgeStub]:
    """Serve ``stub`` on ``127.0.0.1`` (port 0), over TLS with ``tls``; its
    :attr:`EdgeStub.url` is set (``https://`` with TLS)."""
    app = web.Application()
    app.router.add_get("/link", stub.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    host, port = runner.addresses[0][:2]
    stub.url = f"{'https' if tls else 'http'}://{host}:{port}"
    try:
        yield stub
    finally:
        await runner.cleanup()


def fake_payload(
    base_url: str, *, dead_url: str = "http://127.0.0.1:9", cli_args: list[str] | None = None
) -> NodeConfigPayload:
    """Node ``n1``'s payload: provider ``p`` on the fake upstream at ``base_url`` (health
    checked on ``/models``), provider ``dead`` on an address nobody listens on, the adapter
    ``api`` on the fake for model routes; with ``cli_args``, provider ``agent`` running the
    fake agent CLI with them."""
    adapters: list[dict[str, Any]] = [
        {"name": "api", "type": "openai_compat", "base_url": base_url}
    ]
    providers: list[dict[str, Any]] = [
        {"id": "p", "type": "openai_compat", "adapter": "api", "health_check": {"path": "/models"}},
        {"id": "dead", "type": "openai_compat", "adapter": "api", "base_url": dead_url},
    ]
    if cli_args is not None:
        adapters.append(
            {
                "name": "shell",
                "type": "cli",
                "command": FAKE_CLI[0],
                "args": [*FAKE_CLI[1:], *cli_args],
            }
        )
        providers.append({"id": "agent", "type": "cli", "adapter": "shell"})
    return node_payload(load_config(config_text(adapters, providers)), "n1")


@dataclass
class ServedRunner:
    """A node's side of one link to the stub, served by a :class:`LinkRunner` in the test's
    own loop (no agent), and the stub's side of it."""

    runner: LinkRunner
    edge: StubLink
    served: asyncio.Task[None]


@contextlib.asynccontextmanager
async def served_runner(stub: EdgeStub, token: str) -> AsyncIterator[ServedRunner]:
    """Dial ``stub`` as ``iop-node`` does (:func:`iop_edge.node.dial.dial`) and serve the link
    with a :class:`LinkRunner`; on exit the link is closed and the adapters released."""
    options = NodeOptions(edge=stub.url, token=token)
    cache = PayloadCache()
    clock = MonotonicClock()
    hello = Hello(protocol=PROTOCOL_VERSION, agent="test", hostname="test", pid=1)
    async with aiohttp.ClientSession() as http:
        dialled = await dial(http, options, hello, cache, clock=clock)
        dialled.link.start_heartbeats(stub.heartbeat_ms)
        runner = LinkRunner(dialled.link, dialled.adapters, clock=clock, log=get_logger("test"))
        served = asyncio.create_task(runner.serve())
        edge = await stub.next_link()
        try:
            yield ServedRunner(runner, edge, served)
        finally:
            await dialled.link.close(CLOSE_NORMAL, "test over")
            with contextlib.suppress(LinkClosed, LinkViolation):
                await served
            await runner.aclose()
            await cache.aclose()

"""The edge's node listener (``listen.address``): remote ``iop-node`` agents dial
``GET /link`` and keep one WebSocket each (:class:`NodeLinkServer`).

A link's life, on the edge:

1. **Auth before the upgrade.** ``Authorization: Bearer <token>``; ``sha256(token)`` is looked
   up among the config's node hashes. Unknown → ``401`` ``invalid_node_token`` with no
   WebSocket allocated; more than :data:`MAX_CONNECTS` dials of one node within
   :data:`CONNECT_WINDOW_SECONDS` → ``429`` ``reconnecting_too_fast``. The token is never
   logged or echoed (the listener keeps no access log); an unknown one is logged
   ``node_link_refused`` with the peer (rate-limited: a flood of bad dials writes a line every
   10 s, with its ``count``).
2. **Handshake.** ``HELLO`` within ``hello_timeout_ms`` (else closed, ``hello_timeout``);
   another protocol version → ``REFUSED{protocol}`` naming both, close 4002; then ``WELCOME``
   (node id, heartbeat, limits) and ``PAYLOAD`` (the node's own payload and its generation;
   the payload is left out when the node already holds that generation), then the node's
   ``ACK``. An ``ACK`` with an ``error`` (the payload does not build there) closes 4004.
3. **Attached.** The newest acknowledged link of a node wins: an older one gets
   ``REFUSED{superseded}`` and close 4003. The node's
   :class:`~iop_edge.link.remote.RemoteNode` takes the frames until the link ends; then it is
   detached (its calls follow the lost-link rules).

Any violation of the protocol closes the link (4400, the reason as the close reason), is
counted and logged ``node_link_violation`` with the node, the reason and the peer; the edge
serves on. :meth:`NodeLinkServer.go_away` tells every node to dial again (a handover: the
new process listens now); :meth:`NodeLinkServer.close` closes every link (1001).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

import orjson
from aiohttp import web

from iop_edge.config.payload import payload_json
from iop_edge.link.connection import LinkClosed, LinkConnection, server_websocket
from iop_edge.link.handshake import (
    MAX_STREAMS_CEILING,
    REQUEST_OVERHEAD_BYTES,
    STREAMS_HEADROOM,
    LinkLimits,
    ProtocolMismatch,
    Refused,
    Welcome,
    parse_hello,
)
from iop_edge.link.protocol import (
    CLOSE_DEAD,
    CLOSE_GOING_AWAY,
    CLOSE_PAYLOAD,
    CLOSE_PROTOCOL,
    CLOSE_SUPERSEDED,
    CLOSE_VIOLATION,
    PROTOCOL_VERSION,
    Frame,
    Kind,
    LinkViolation,
    optional_field,
    require_field,
)
from iop_edge.link.remote import LinkInfo, RemoteNode
from iop_edge.link.statistics import NodeLinkStatistics
from iop_edge.runtime.logs import Logger, RateLimiter, get_logger
from iop_edge.tokens import token_hash

if TYPE_CHECKING:
    from iop_edge.config.schema import EdgeConfig, ListenTls
    from iop_edge.seams import Clock

__all__ = [
    "CONNECT_WINDOW_SECONDS",
    "MAX_CONNECTS",
    "NodeLinkServer",
    "link_limits",
    "ssl_context",
]

MAX_CONNECTS: Final = 5
"""More dials of one node than this within :data:`CONNECT_WINDOW_SECONDS` answer 429."""
CONNECT_WINDOW_SECONDS: Final = 10.0

_BEARER: Final = "bearer "
_UNBOUNDED_ROUTE: Final = 256  # a model route without a capacity counts this many streams


def link_limits(config: EdgeConfig) -> LinkLimits:
    """The limits of every link of ``config``'s edge: requests up to ``openai.max_body_bytes``
    (+ the ``REQ``'s framing), and as many streams as the busiest remote node's providers and
    model routes may run at once (+ probes and token counts), at most
    :data:`MAX_STREAMS_CEILING`."""
    busiest = 0
    for node in config.nodes:
        if node.token_hash_sha256 is None:
            continue
        streams = sum(p.capacity for p in node.providers)
        adapters = {a.name for a in node.adapters}
        for route in config.openai.model_routes:
            if route.adapter in adapters and route.node in (None, node.id):
                streams += route.capacity or _UNBOUNDED_ROUTE
        busiest = max(busiest, streams)
    return LinkLimits(
        max_request_bytes=config.openai.max_body_bytes + REQUEST_OVERHEAD_BYTES,
        max_streams=min(MAX_STREAMS_CEILING, busiest + STREAMS_HEADROOM),
    )


def ssl_context(tls: ListenTls) -> ssl.SSLContext:
    """The server TLS context of ``listen.tls`` (its PEM certificate chain and key files);
    :class:`OSError` or :class:`ssl.SSLError` naming the files when they do not load."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise type(exc)(
            f"listen.tls: the certificate {tls.cert_file!r} and key {tls.key_file!r} do not "
            f"load ({exc}); give PEM files readable by the edge"
        ) from exc
    return context


def _error(status: int, code: str, message: str, **headers: str) -> web.Response:
    body = orjson.dumps({"error": {"message": message, "type": "link_error", "code": code}})
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


class NodeLinkServer:
    """The node listener's application and the links of every remote node (see the module
    docstring). ``nodes`` are the remote nodes by id (their tokens' hashes in
    ``token_hashes``, hash → node id); ``edge_id`` and ``edge_version`` go in ``WELCOME``."""

    def __init__(
        self,
        nodes: Mapping[str, RemoteNode],
        token_hashes: Mapping[str, str],
        *,
        edge_id: str,
        edge_version: str,
        heartbeat_ms: int,
        clock: Clock,
        limits: LinkLimits | None = None,
        log: Logger | None = None,
    ) -> None:
        self.nodes = dict(nodes)
        self._by_hash = dict(token_hashes)
        self.edge_id = edge_id
        self.edge_version = edge_version
        self.heartbeat_ms = heartbeat_ms
        self.clock = clock
        self.limits = limits if limits is not None else LinkLimits()
        self.log = log if log is not None else get_logger()
        self._payloads = {
            node_id: orjson.loads(payload_json(node.payload)) for node_id, node in nodes.items()
        }
        self._current: dict[str, LinkConnection] = {}
        self._links: dict[LinkConnection, str] = {}
        self._dials: dict[str, deque[float]] = {}
        self._violations: Counter[str] = Counter()
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._limiter = RateLimiter(clock=clock.now)
        #: links refused before a node was known, by reason (401, 429, stopping)
        self.refused: Counter[str] = Counter()

    @classmethod
    def from_config(
        cls,
        config: EdgeConfig,
        nodes: Mapping[str, RemoteNode],
        *,
        edge_version: str,
        clock: Clock,
        log: Logger | None = None,
    ) -> NodeLinkServer:
        """The server of ``config``'s remote ``nodes`` (their tokens' hashes, the heartbeat,
        :func:`link_limits`)."""
        hashes = {
            n.token_hash_sha256: n.id for n in config.nodes if n.token_hash_sha256 is not None
        }
        return cls(
            nodes,
            hashes,
            edge_id=config.edge.id,
            edge_version=edge_version,
            heartbeat_ms=config.bootstrap.heartbeat_ms,
            clock=clock,
            limits=link_limits(config),
            log=log,
        )

    def build_app(self) -> web.Application:
        """The listener's application: ``GET /link`` (the upgrade), ``GET /healthz``."""
        app = web.Application()
        app.router.add_get("/link", self._link)
        app.router.add_get("/healthz", self._healthz)
        return app

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "protocol": PROTOCOL_VERSION})

    # -- control -------------------------------------------------------------------------------

    def go_away(self, reason: str) -> None:
        """Tell every node to dial again now (``GOAWAY{reason}``: ``handover`` when the new
        process listens); their links serve on until :meth:`close`."""
        for link in list(self._links):
            self._spawn(self._send_quietly(link, Frame(Kind.GOAWAY, meta={"reason": reason})))

    async def close(self) -> None:
        """Refuse new links and close every link (1001, ``stopping``); their calls follow the
        lost-link rules. Idempotent."""
        self._closing = True
        links = list(self._links)
        await asyncio.gather(*(link.close(CLOSE_GOING_AWAY, "stopping") for link in links))
        for task in list(self._tasks):
            task.cancel()

    def statistics(self) -> tuple[NodeLinkStatistics, ...]:
        """Every remote node's link as of now, in configuration order."""
        return tuple(
            replace(node.link_statistics(), violations=self._violations[node_id])
            for node_id, node in self.nodes.items()
        )

    # -- one link --------------------------------------------------------------------------------

    async def _link(self, request: web.Request) -> web.StreamResponse:
        node_id = self._by_hash.get(_token_hash(request.headers.get("Authorization")))
        if node_id is None:
            self.refused["invalid_node_token"] += 1
            count = self._limiter.allow("invalid_node_token")
            if count:
                self.log.warning(
                    "node_link_refused",
                    reason="invalid_node_token",
                    peer=_peer(request),
                    count=count,
                    message="a dial with a token that matches no nodes[].token_hash_sha256 of "
                    "this edge was refused (401): a removed node, a rotated token whose file "
                    "the node still holds, or a config not applied yet (iop-edge restart)",
                )
            return _error(
                401,
                "invalid_node_token",
                "This token is not a node token of this edge: give the token iop-edge token "
                "node printed for this node (its hash is nodes[ID].token_hash_sha256).",
            )
        if self._closing:
            self.refused["stopping"] += 1
            return _error(
                503, "stopping", "This edge is stopping; dial again.", **{"Retry-After": "1"}
            )
        if not self._may_dial(node_id):
            self.refused["reconnecting_too_fast"] += 1
            return _error(
                429,
                "reconnecting_too_fast",
                f"node {node_id!r} dialled more than {MAX_CONNECTS} times within "
                f"{CONNECT_WINDOW_SECONDS:g} s; back off",
                **{"Retry-After": str(int(CONNECT_WINDOW_SECONDS))},
            )
        ws = server_websocket(self.limits)
        await ws.prepare(request)
        link = LinkConnection(
            ws, local="edge", limits=self.limits, clock=self.clock, peer=_peer(request)
        )
        self._links[link] = node_id
        node = self.nodes[node_id]
        attached = False
        reason = "node_closed"
        try:
            info = await self._handshake(link, node)
            if info is None:
                return ws
            old = self._current.get(node_id)
            self._current[node_id] = link
            # Attached before the old link goes: the node stays connected throughout.
            node.attach(link, self.limits, info)
            attached = True
            if old is not None:
                self._supersede(node_id, old, link)
            self.log.info(
                "node_link_up",
                node=node_id,
                peer=link.peer,
                agent_version=info.agent_version,
                generation=info.generation,
            )
            while True:
                node.receive(link, await link.receive())
        except LinkViolation as exc:
            reason = "violation"
            await self._violation(node_id, link, exc.reason, str(exc))
        except LinkClosed as exc:
            reason = _closed_reason(exc)
        finally:
            self._links.pop(link, None)
            if self._current.get(node_id) is link:
                del self._current[node_id]
            if attached:
                node.detach(link, reason)
                self.log.info("node_link_down", node=node_id, peer=link.peer, reason=reason)
            if not link.closed:
                await link.close(CLOSE_GOING_AWAY, "stopping")
            # A violation's close handshake runs in a task of the link's (bounded): the
            # handler must not return before it, or aiohttp closes the socket with 1000.
            await link.wait_closed()
        return ws

    async def _handshake(self, link: LinkConnection, node: RemoteNode) -> LinkInfo | None:
        """``HELLO`` → ``WELCOME`` + ``PAYLOAD`` → ``ACK``: the link's info once the node
        acknowledged its payload; ``None`` when it was refused (and closed)."""
        hello_frame = await self._first_frame(link)
        if hello_frame.kind is not Kind.HELLO:
            raise LinkViolation(
                "phase", f"the first frame of a link is HELLO, not {hello_frame.kind.name}"
            )
        try:
            hello = parse_hello(hello_frame.meta)
        except ProtocolMismatch as exc:
            refused = Refused(
                "protocol",
                str(exc),
                edge_protocol=exc.edge_protocol,
                node_protocol=exc.node_protocol,
            )
            self.log.warning(
                "node_link_refused",
                node=node.node_id,
                peer=link.peer,
                reason="protocol",
                message=str(exc),
            )
            await self._send_quietly(link, Frame(Kind.REFUSED, meta=refused.to_meta()))
            await link.close(CLOSE_PROTOCOL, "protocol")
            return None
        welcome = Welcome(
            protocol=PROTOCOL_VERSION,
            edge_id=self.edge_id,
            edge_version=self.edge_version,
            node_id=node.node_id,
            heartbeat_ms=self.heartbeat_ms,
            limits=self.limits,
        )
        await link.send(Frame(Kind.WELCOME, meta=welcome.to_meta()))
        link.start_heartbeats(self.heartbeat_ms)
        generation = node.generation
        payload: dict[str, Any] = {"generation": generation}
        if generation not in hello.have:
            payload["payload"] = self._payloads[node.node_id]
        await link.send(Frame(Kind.PAYLOAD, meta=payload))
        while True:
            frame = await link.receive()
            if frame.kind is Kind.ACK:
                break
            if frame.kind not in (Kind.STATS, Kind.GOAWAY):
                raise LinkViolation(
                    "phase", f"a node sent {frame.kind.name} before it acknowledged its payload"
                )
        acked = require_field(frame.meta, "generation", str, "ACK")
        error = optional_field(frame.meta, "error", str, "ACK")
        if error is not None:
            self.log.error(
                "node_payload_rejected",
                node=node.node_id,
                peer=link.peer,
                generation=acked,
                error=error,
                message="the node could not build the payload it was sent; fix the node's "
                "section of the config (or the node's environment), then iop-edge restart",
            )
            await link.close(CLOSE_PAYLOAD, "payload")
            return None
        if acked != generation:
            raise LinkViolation(
                "bad_field", f"ACK generation {acked!r} is not the one sent ({generation!r})"
            )
        return LinkInfo(link.peer, hello.agent, hello.protocol, acked)

    async def _first_frame(self, link: LinkConnection) -> Frame:
        """The node's first frame, due within ``hello_timeout_ms`` of the upgrade (on the
        injected clock): else the link is closed, ``hello_timeout``."""
        due = self.clock.now() + self.limits.hello_timeout_ms / 1000

        def expire() -> None:
            self._spawn(link.close(CLOSE_VIOLATION, "hello_timeout"))

        cancel = self.clock.call_at(due, expire)
        try:
            return await link.receive()
        except LinkClosed as exc:
            if exc.local and exc.reason == "hello_timeout":
                raise LinkViolation(
                    "phase",
                    f"no HELLO within hello_timeout_ms ({self.limits.hello_timeout_ms})",
                ) from None
            raise
        finally:
            cancel()

    def _supersede(self, node_id: str, old: LinkConnection, link: LinkConnection) -> None:
        """``link`` is the node's newest acknowledged link: ``old``, the one before it, is
        refused ``superseded`` and closed (its calls follow the lost-link rules)."""
        self.log.warning(
            "node_link_superseded",
            node=node_id,
            old_peer=old.peer,
            new_peer=link.peer,
            message="a newer link of this node replaced the older one; if this repeats, two "
            "agents run with the same token",
        )
        self.nodes[node_id].detach(old, "superseded")
        refused = Refused("superseded", f"a newer link of node {node_id!r} replaced this one")

        async def close_old() -> None:
            await self._send_quietly(old, Frame(Kind.REFUSED, meta=refused.to_meta()))
            await old.close(CLOSE_SUPERSEDED, "superseded")

        self._spawn(close_old())

    async def _violation(
        self, node_id: str, link: LinkConnection, reason: str, message: str
    ) -> None:
        self._violations[node_id] += 1
        self.log.warning(
            "node_link_violation", node=node_id, reason=reason, peer=link.peer, message=message
        )
        await link.close(CLOSE_VIOLATION, reason)

    def _may_dial(self, node_id: str) -> bool:
        """Count a dial of ``node_id``; False past :data:`MAX_CONNECTS` in the window."""
        now = self.clock.now()
        dials = self._dials.setdefault(node_id, deque())
        while dials and dials[0] <= now - CONNECT_WINDOW_SECONDS:
            dials.popleft()
        if len(dials) >= MAX_CONNECTS:
            return False
        dials.append(now)
        return True

    async def _send_quietly(self, link: LinkConnection, frame: Frame) -> None:
        with contextlib.suppress(LinkClosed):
            await link.send(frame)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _token_hash(authorization: str | None) -> str:
    """The SHA-256 of a bearer token (``""`` without one: no node has that hash)."""
    if not authorization or authorization[: len(_BEARER)].lower() != _BEARER:
        return ""
    token = authorization[len(_BEARER) :].strip()
    return token_hash(token) if token else ""


def _peer(request: web.Request) -> str:
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = f"[{peer[0]}]" if ":" in str(peer[0]) else str(peer[0])
        return f"{host}:{peer[1]}"
    return request.remote or ""


_LOCAL_REASONS: Final[dict[int, str]] = {
    CLOSE_DEAD: "heartbeat",
    CLOSE_SUPERSEDED: "superseded",
    CLOSE_VIOLATION: "violation",
}


def _closed_reason(exc: LinkClosed) -> str:
    """Why a link ended, for the statistics and the log."""
    if exc.local:
        code = exc.code if exc.code is not None else 0
        return _LOCAL_REASONS.get(code, exc.reason or "stopping")
    return "node_closed"

"""The edge's side of a remote node: :class:`RemoteNode` (an
:class:`~iop_edge.adapters.base.ExecutorSet`) and its :class:`RemoteExecutor`\\ s, which run
calls over the node's link and give back what a local executor would.

A :class:`RemoteExecutor` is built from the node's payload alone (its ``native_apis`` and its
``request_timeout_ms`` are known without asking the node). Each call is one request stream
(:class:`_RemoteCall`): ``REQ`` → ``RESP_REPLY`` (an :class:`UpstreamReply`) | ``RESP_ERROR``
(the node's :class:`AdapterError` or :class:`UnsupportedRequestError`, raised again with every
flag) | ``RESP_STREAM`` (an :class:`UpstreamStream` whose first frame is its data), then
``RESP_CHUNK``\\ s and ``RESP_END`` | ``RESP_ERROR``. The frames yield every chunk buffered so
far, joined into one write; credit goes back to the node (``WINDOW``) as the consumer takes
them. Closing a stream before its end sends ``CANCEL`` and waits for the node's terminal
frame (the upstream really ended), bounded by the CLI kill grace and three heartbeats.

**A lost link** (:meth:`RemoteNode.detach`, design §5): a call with no head yet fails with an
``upstream_error`` that fails over, ``failure`` ``connect`` when its ``REQ`` never reached the
transport and ``dropped`` otherwise (a ``cli`` provider, ``retry_on: [connect]``, then does not
fail over: its agent may have started); a stream under way raises out of its frames
(``dropped``, no failover), so the surface writes its error event; a probe answers
``(False, reason)`` and a token count ``None``.

The edge keeps its own deadline on every call (``request_timeout_ms`` + 2 heartbeats): the
node's identical one fires first on a stalled upstream, the edge's on a silent node or a client
that takes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from iop_edge.adapters.base import (
    NO_NATIVE_APIS,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    Usage,
)
from iop_edge.adapters.cli_process import KILL_GRACE_SECONDS
from iop_edge.adapters.deadlines import Deadlines, Exchange
from iop_edge.adapters.registry import AdapterStatistics, executable, request_timeout_ms
from iop_edge.errors import AdapterError
from iop_edge.link import calls
from iop_edge.link.connection import LinkClosed
from iop_edge.link.flow import StreamPurpose, StreamTable
from iop_edge.link.protocol import Frame, Kind, split
from iop_edge.link.remote_call import RemoteCall
from iop_edge.link.statistics import NodeLinkStatistics
from iop_edge.runtime.logs import Logger, get_logger

if TYPE_CHECKING:
    from iop_edge.config.payload import NodeConfigPayload
    from iop_edge.config.schema import AdapterType, ExecutionFields
    from iop_edge.link.connection import LinkConnection
    from iop_edge.link.handshake import LinkLimits
    from iop_edge.seams import Clock, ProbeResult

__all__ = ["LINK_DOWN", "LinkInfo", "RemoteExecutor", "RemoteNode", "StateCallback"]

LINK_DOWN: Final = "node link down"
"""The reason a probe of a disconnected node gives."""

StateCallback = Callable[[str, bool], None]
"""Told ``(node_id, connected)`` when a node's link comes up or goes down
(:meth:`iop_edge.admission.AdmissionScheduler.set_connected`)."""


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """What the handshake of an attached link said (for :meth:`RemoteNode.link_statistics`)."""

    peer: str
    agent_version: str
    protocol: int
    generation: str


class Session:
    """One acknowledged link of a node: its streams and whether it takes new calls."""

    __slots__ = ("calls", "draining", "info", "limits", "link", "node", "since", "table")

    def __init__(
        self, node: RemoteNode, link: LinkConnection, limits: LinkLimits, info: LinkInfo
    ) -> None:
        self.node = node
        self.link = link
        self.info = info
        self.limits = limits
        self.since = node.clock.now()
        self.table = StreamTable(limits)
        self.calls: dict[int, RemoteCall] = {}
        #: the node said ``GOAWAY{draining}``: calls in flight finish, no new ones start here
        self.draining = False

    @property
    def takes_calls(self) -> bool:
        """Whether a new call may start on this link."""
        return not self.draining and not self.link.closed and not self.table.full

    def open(self, purpose: StreamPurpose) -> RemoteCall:
        """A new request stream on this link."""
        stream = self.table.open(purpose)
        remote = self.calls[stream] = RemoteCall(self, stream)
        return remote

    async def send(self, frame: Frame) -> None:
        """Send a frame on the link (:class:`LinkClosed` when it is closed)."""
        await self.link.send(frame)

    async def send_quietly(self, frame: Frame) -> None:
        """Send a frame whose loss the link's own end reports anyway (``WINDOW``,
        ``CANCEL``)."""
        with contextlib.suppress(LinkClosed):
            await self.link.send(frame)


class RemoteExecutor:
    """Runs calls of one provider (or one adapter instance, for a model route) of a remote
    node over its link; built from the node's payload, so :attr:`native_apis` needs no
    round trip."""

    def __init__(
        self,
        node: RemoteNode,
        label: str,
        execution: ExecutionFields,
        native_apis: frozenset[str],
        *,
        provider: str | None = None,
        adapter: str | None = None,
    ) -> None:
        self._node = node
        self._provider = provider
        self._adapter = adapter
        self._native_apis = native_apis
        self._where = f"{label} on node {node.node_id!r}"
        self._deadlines = Deadlines(
            request_timeout_ms(execution) + 2 * node.heartbeat_ms, node.clock
        )

    @property
    def native_apis(self) -> frozenset[str]:
        """The provider's ``native_apis`` (from the payload)."""
        return self._native_apis

    async def complete(self, call: UpstreamCall) -> UpstreamReply:
        """Run a non-streaming call on the node."""
        head, _ = await self._head(call, "reply", self._deadlines.start())
        return calls.reply_from(head.meta, head.data)

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream | UpstreamReply:
        """Start a streaming call on the node: its stream, or the upstream's error status."""
        exchange = self._deadlines.start()
        head, remote = await self._head(call, "stream", exchange)
        if head.kind is not Kind.RESP_STREAM:
            return calls.reply_from(head.meta, head.data)
        usage = Usage()
        final: list[bytes | None] = [None]
        frames = self._frames(remote, exchange, head.data, usage, final)

        async def close() -> None:
            exchange.end()
            with contextlib.suppress(RuntimeError):
                await frames.aclose()
            await remote.cancel()

        return UpstreamStream(
            status=200,
            frames=frames,
            usage=usage,
            closer=close,
            timed_out=exchange.timed_out,
            final_response=lambda: final[0],
        )

    async def count_tokens(
        self,
        chat_body: dict[str, Any],
        target: str,
        headers: Mapping[str, str],
        request_id: str,
    ) -> int | None:
        """The node's count of a chat body's tokens; ``None`` when it cannot count or the
        link is down."""
        meta = calls.count_tokens_meta(
            target, headers, request_id, provider=self._provider, adapter=self._adapter
        )
        return await self._node.count_tokens(meta, chat_body)

    async def _head(
        self, call: UpstreamCall, purpose: StreamPurpose, exchange: Exchange
    ) -> tuple[Frame, RemoteCall]:
        """Send the ``REQ`` of ``call`` and wait for the head of its answer (an error there is
        raised); the exchange ends here unless the answer is a stream."""
        ended = True
        try:
            meta = calls.call_meta(call, provider=self._provider, adapter=self._adapter)
            remote = await self._node.request(purpose, meta, calls.call_body(call))
            try:
                head = await remote.head()
            except asyncio.CancelledError:
                await remote.cancel()
                if exchange.timed_out():
                    raise exchange.timeout_error(self._where, answered=False) from None
                raise
            if head.kind is Kind.RESP_ERROR:
                raise calls.error_from(head.meta)
            ended = head.kind is not Kind.RESP_STREAM
            return head, remote
        finally:
            if ended:
                exchange.end()

    async def _frames(
        self,
        remote: RemoteCall,
        exchange: Exchange,
        first: bytes,
        usage: Usage,
        final: list[bytes | None],
    ) -> AsyncGenerator[bytes, None]:
        """The frames of a streamed answer: ``first``, then every chunk buffered so far as
        one write, until the node's terminal message."""
        try:
            if first:
                exchange.yielding()
                yield first
                exchange.waiting()
            while True:
                if remote.chunks:
                    data = remote.take()
                    exchange.yielding()
                    yield data
                    exchange.waiting()
                    await remote.consumed(len(data))
                    continue
                terminal = remote.terminal
                if terminal is not None:
                    calls.update_usage(usage, terminal.meta.get("usage"))
                    final[0] = terminal.data or None
                    if terminal.kind is Kind.RESP_ERROR:
                        raise calls.error_from(terminal.meta)
                    return
                if remote.lost is not None:
                    raise self._node.lost_mid_stream(remote.lost)
                try:
                    await remote.wait()
                except asyncio.CancelledError:
                    if exchange.timed_out():
                        raise exchange.timeout_error(self._where, answered=True) from None
                    raise
        finally:
            exchange.end()


class RemoteNode:
    """A node whose adapters run in its ``iop-node`` agent, reached over its link: an
    :class:`~iop_edge.adapters.base.ExecutorSet` for the request path.

    :meth:`attach` (the edge server, once the node acknowledged its payload) and
    :meth:`detach` move it between connected and disconnected, telling ``on_state``;
    :meth:`receive` takes the frames of an attached link.
    """

    def __init__(
        self,
        payload: NodeConfigPayload,
        *,
        clock: Clock,
        heartbeat_ms: int,
        generation: str = "",
        on_state: StateCallback | None = None,
        log: Logger | None = None,
    ) -> None:
        self.node_id = payload.node_id
        self.payload = payload
        #: the payload generation the edge sends this node (``payload_generation``)
        self.generation = generation
        self.clock = clock
        self.heartbeat_ms = heartbeat_ms
        self.on_state = on_state
        self.log = log if log is not None else get_logger()
        providers, adapters = executable(payload)
        self._by_provider = {
            p.id: RemoteExecutor(
                self,
                f"provider {p.id!r}",
                p.execution,
                _native(p.type, p.execution),
                provider=p.id,
            )
            for p in providers.values()
        }
        self._by_adapter = {
            a.name: RemoteExecutor(
                self,
                f"adapter {a.name!r}",
                a.execution,
                _native(a.type, a.execution),
                adapter=a.name,
            )
            for a in adapters.values()
        }
        self._adapter_names = tuple(adapters)
        self._sessions: dict[LinkConnection, Session] = {}
        self._current: Session | None = None
        self._stats: tuple[AdapterStatistics, ...] = ()
        # what links gone before counted (the link statistics add the live ones)
        self._attached = 0
        self._bytes_sent = self._bytes_received = 0
        self._last_down: tuple[float, str] | None = None
        self._violations = 0

    # -- ExecutorSet -----------------------------------------------------------------------------

    def for_provider(self, provider_id: str) -> RemoteExecutor:
        """The executor of an enabled provider of this node; :class:`KeyError` otherwise."""
        try:
            return self._by_provider[provider_id]
        except KeyError:
            known = ", ".join(sorted(self._by_provider)) or "none"
            raise KeyError(
                f"node {self.node_id!r} has no provider {provider_id!r} with an enabled "
                f"adapter; providers with one: {known}"
            ) from None

    def for_adapter(self, adapter_name: str) -> RemoteExecutor:
        """The executor of an enabled adapter instance of this node (for model routes)."""
        try:
            return self._by_adapter[adapter_name]
        except KeyError:
            known = ", ".join(sorted(self._by_adapter)) or "none"
            raise KeyError(
                f"node {self.node_id!r} has no enabled adapter {adapter_name!r}; "
                f"enabled adapters: {known}"
            ) from None

    async def probe(self, provider_id: str) -> ProbeResult:
        """The node's health check of a provider; ``(False, "node link down")`` while
        disconnected or when the link is lost before the verdict."""
        try:
            remote = await self.request(
                "probe", calls.probe_meta(provider_id), b"", kind=Kind.PROBE
            )
            head = await remote.head()
        except AdapterError:
            return False, LINK_DOWN
        return calls.probe_result_from(head.meta)

    def statistics(self) -> tuple[AdapterStatistics, ...]:
        """One snapshot per enabled adapter instance, as the node's last ``STATS`` said
        (zeros before any)."""
        if self._stats:
            return self._stats
        return tuple(
            AdapterStatistics(self.node_id, name, "remote", 0, 0) for name in self._adapter_names
        )

    async def aclose(self) -> None:
        """Nothing of its own to release: the edge server closes the links."""

    # -- the link ----------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether a link is attached and takes new calls."""
        return self._current is not None and not self._current.draining

    def attach(self, link: LinkConnection, limits: LinkLimits, info: LinkInfo) -> None:
        """``link`` acknowledged its payload: new calls go to it (the edge server detaches a
        link it replaces first)."""
        was = self.connected
        self._current = self._sessions[link] = Session(self, link, limits, info)
        self._attached += 1
        if not was:
            self._tell(True)

    def detach(self, link: LinkConnection, reason: str) -> None:
        """``link`` is gone (closed, dead, superseded, a violation; ``reason`` says which):
        every call on it follows the lost-link rules, and the node is disconnected unless
        another link serves. Idempotent."""
        session = self._sessions.pop(link, None)
        if session is None:
            return
        self._bytes_sent += link.bytes_sent
        self._bytes_received += link.bytes_received
        self._last_down = (self.clock.now(), reason)
        if reason == "violation":
            self._violations += 1
        for remote in list(session.calls.values()):
            remote.lose(reason)
        if session is self._current:
            was = self.connected
            self._current = None
            if was:
                self._tell(False)

    def receive(self, link: LinkConnection, frame: Frame) -> None:
        """A frame of an attached link (``PING`` and ``PONG`` are the connection's); raises
        :class:`~iop_edge.link.protocol.LinkViolation` for one out of turn."""
        session = self._sessions[link]
        kind = frame.kind
        if kind is Kind.STATS:
            self._stats = _adapter_statistics(self.node_id, frame.meta)
        elif kind is Kind.GOAWAY:
            # The node drains: what runs finishes, nothing new goes to it.
            if not session.draining:
                was = self.connected
                session.draining = True
                if session is self._current and was:
                    self._tell(False)
        elif frame.stream:
            message = session.table.admit(frame)
            if message is not None:
                remote = session.calls.get(frame.stream)
                if remote is not None:
                    remote.deliver(message)

    def link_statistics(self) -> NodeLinkStatistics:
        """This node's link as of now."""
        session = self._current
        live = list(self._sessions)
        last = self._last_down
        return NodeLinkStatistics(
            node_id=self.node_id,
            remote=True,
            connected=self.connected,
            connected_since=None if session is None else session.since,
            peer=None if session is None else session.info.peer,
            agent_version=None if session is None else session.info.agent_version,
            protocol=None if session is None else session.info.protocol,
            generation=self.generation or None,
            generation_acked=None if session is None else session.info.generation,
            in_flight=sum(len(s.calls) for s in self._sessions.values()),
            reconnects=max(0, self._attached - 1),
            rtt=None if session is None else session.link.rtt,
            bytes_sent=self._bytes_sent + sum(link.bytes_sent for link in live),
            bytes_received=self._bytes_received + sum(link.bytes_received for link in live),
            last_down_at=None if last is None else last[0],
            last_down_reason=None if last is None else last[1],
            violations=self._violations,
        )

    # -- used by the executors ---------------------------------------------------------------------

    async def request(
        self,
        purpose: StreamPurpose,
        meta: dict[str, Any],
        body: bytes,
        *,
        kind: Kind = Kind.REQ,
    ) -> RemoteCall:
        """Open a stream on the current link and send its ``REQ`` (or ``PROBE``); a link down
        (or full, or lost while the request is written) is a ``connect`` failure that fails
        over (rule K)."""
        session = self._current
        if session is None or not session.takes_calls:
            raise self.lost_before_head(
                "not connected" if session is None else "not taking calls", sent=False
            )
        remote = session.open(purpose)
        try:
            for frame in split(kind, remote.stream, meta, body, session.limits.max_frame_bytes):
                await session.send(frame)
        except LinkClosed as exc:
            remote.lose(exc.reason or "closed")
            raise self.lost_before_head(exc.reason or "closed", sent=False) from None
        remote.sent = True
        return remote

    async def count_tokens(self, meta: dict[str, Any], chat_body: dict[str, Any]) -> int | None:
        """``REQ{op: count_tokens}`` → ``RESP_REPLY{tokens}``; ``None`` on any failure."""
        try:
            remote = await self.request("reply", meta, orjson.dumps(chat_body))
            try:
                head = await remote.head()
            except asyncio.CancelledError:
                await remote.cancel()
                raise
        except AdapterError:
            return None
        if head.kind is not Kind.RESP_REPLY:
            return None
        return calls.tokens_from(head.meta)

    def lost_before_head(self, reason: str, *, sent: bool) -> AdapterError:
        """The failure of a call whose answer had not begun when the link was lost (rule K)."""
        return AdapterError(
            "upstream_error",
            f"the link to node {self.node_id!r} was lost ({reason}) before the answer began",
            failure="dropped" if sent else "connect",
            failover=True,
        )

    def lost_mid_stream(self, reason: str) -> AdapterError:
        """The failure of a stream under way when the link was lost."""
        return AdapterError(
            "upstream_error",
            f"the link to node {self.node_id!r} was lost ({reason}) in the middle of the answer",
            failure="dropped",
            failover=False,
        )

    async def within_cancel_grace(self, ended: asyncio.Future[None]) -> bool:
        """Wait for ``ended`` at most the CLI kill grace and three heartbeats (on the
        injected clock); whether it came."""
        if ended.done():
            return True
        timer: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def expire() -> None:
            if not timer.done():
                timer.set_result(None)

        grace = KILL_GRACE_SECONDS + 3 * self.heartbeat_ms / 1000
        cancel = self.clock.call_at(self.clock.now() + grace, expire)
        try:
            await asyncio.wait((ended, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel()
        return ended.done()

    def _tell(self, connected: bool) -> None:
        if self.on_state is not None:
            self.on_state(self.node_id, connected)


def _native(kind: AdapterType, execution: ExecutionFields) -> frozenset[str]:
    """The ``native_apis`` an executor of runtime type ``kind`` relays (``openai_compat``
    alone relays any: :func:`iop_edge.adapters.registry.build_executor`)."""
    if kind != "openai_compat":
        return NO_NATIVE_APIS
    return frozenset(execution.native_apis or ())


def _adapter_statistics(node_id: str, meta: Mapping[str, Any]) -> tuple[AdapterStatistics, ...]:
    """The adapters of a ``STATS`` message; entries of the wrong shape are skipped (a
    statistic is never worth a link)."""
    adapters = meta.get("adapters")
    if not isinstance(adapters, list):
        return ()
    found: list[AdapterStatistics] = []
    for entry in adapters:
        if not isinstance(entry, dict):
            continue
        name = entry.get("name")
        live = entry.get("live_process_groups", 0)
        kills = entry.get("kills_pending", 0)
        if isinstance(name, str) and type(live) is int and type(kills) is int:
            found.append(AdapterStatistics(node_id, name, "remote", live, kills))
    return tuple(found)

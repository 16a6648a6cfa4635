"""The requests of one node link (:class:`LinkRunner`): each ``REQ`` run with the same adapter
code the edge runs for a local node, its results turned into frames (design §1, §2).

A ``REQ`` becomes a task: ``for_provider(id)`` (or ``for_adapter(name)`` for a model route),
then ``complete`` → ``RESP_REPLY``, or ``open_stream`` → ``first()`` → ``RESP_STREAM``, each
yield of ``frames`` → ``RESP_CHUNK``, ``aclose`` → ``RESP_END``; an
:class:`~iop_edge.errors.AdapterError` or :class:`UnsupportedRequestError` → ``RESP_ERROR``
with every field and flag (:mod:`iop_edge.link.calls`). ``count_tokens`` answers
``RESP_REPLY{tokens}``, ``PROBE`` runs the provider's health check. Every request ends with
exactly one terminal message, sent once the upstream call has really ended (its connection
closed, its CLI process group reaped): the edge releases the slot when that message arrives.

**Credit.** A chunk message begins only while the stream's credit is positive
(:class:`~iop_edge.link.flow.SendCredit`). While it waits, the task stops iterating the
upstream's frames, so the upstream's TCP window (or the CLI's stdout pipe) pushes back: the
node holds at most one read beyond the window.

**Cancel.** ``CANCEL`` (the client left, or the edge timed out) cancels the request's task:
the adapter aborts the HTTP request or kills the CLI group, and the terminal message is a
``RESP_ERROR{type: "cancelled"}``. A request whose terminal message is already on its way is
left to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

from iop_edge.adapters.base import (
    Executor,
    ExecutorSet,
    UnsupportedRequestError,
    UpstreamReply,
    Usage,
)
from iop_edge.errors import AdapterError
from iop_edge.link.calls import (
    CallRequest,
    ErrorType,
    call_from,
    error_meta,
    probe_from,
    probe_result_meta,
    reply_meta,
    tokens_meta,
    usage_meta,
)
from iop_edge.link.connection import LinkClosed, LinkConnection
from iop_edge.link.flow import SendCredit
from iop_edge.link.protocol import (
    CLOSE_VIOLATION,
    Frame,
    Kind,
    LinkViolation,
    split,
    window_increment,
)
from iop_edge.runtime.logs import Logger
from iop_edge.seams import Clock

__all__ = ["CANCELLED_MESSAGE", "LinkRunner"]

CANCELLED_MESSAGE: Final = "the request was cancelled by the edge (the client left or timed out)"
"""The message of a cancelled request's ``RESP_ERROR{type: "cancelled"}``."""

ControlHandler = Callable[[Frame], Awaitable[None]]
"""What the runner hands a frame of stream 0 that is not its own (``GOAWAY``, ``REFUSED``…)."""


@dataclass(eq=False)
class _Request:
    """One request stream the node runs: its task, and whether it may still be cancelled."""

    stream: int
    task: asyncio.Task[None] | None = None
    cancelled: bool = False
    """A cancel was delivered (once is enough: the task ends with the terminal message)."""
    ending: bool = False
    """Its terminal message is on its way: a cancel would only interrupt the upstream's close."""
    credit: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a ``WINDOW`` makes the stream's credit positive again."""


class LinkRunner:
    """Runs the requests the edge sends on ``link`` with ``adapters`` (a node's
    :class:`~iop_edge.adapters.registry.AdapterSet`, or any
    :class:`~iop_edge.adapters.base.ExecutorSet`).

    :meth:`serve` reads the link until it closes; frames of stream 0 other than the ones the
    connection answers itself go to ``on_control`` (the agent's: ``GOAWAY``, ``REFUSED``). The
    link's limits are read as they are when a frame is handled (the agent sets them from
    ``WELCOME`` before serving).
    """

    def __init__(
        self,
        link: LinkConnection,
        adapters: ExecutorSet,
        *,
        clock: Clock,
        log: Logger,
        on_control: ControlHandler | None = None,
    ) -> None:
        self.link = link
        self.adapters = adapters
        self._clock = clock
        self._log = log
        self._on_control = on_control
        self._credit = SendCredit(link.limits)
        self._requests: dict[int, _Request] = {}
        self._cancelled_early: set[int] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        """Requests (probes included) started and not yet ended."""
        return len(self._requests)

    def stats_frame(self) -> Frame:
        """The ``STATS`` the node sends every few heartbeats: its adapters' backends and the
        requests in flight on this link."""
        adapters = [
            {
                "name": s.adapter,
                "backend": s.backend,
                "live_process_groups": s.live_process_groups,
                "kills_pending": s.kills_pending,
            }
            for s in self.adapters.statistics()
        ]
        return Frame(Kind.STATS, meta={"adapters": adapters, "in_flight": self.in_flight})

    async def serve(self) -> None:
        """Read and handle frames until the link ends. Never returns: raises
        :class:`~iop_edge.link.connection.LinkClosed` once the link is closed (by either side
        or for silence), or :class:`~iop_edge.link.protocol.LinkViolation` when the edge broke
        the protocol (the link is then closed with the reason). Requests still running are
        left to :meth:`drain` or :meth:`aclose`."""
        link = self.link
        while True:
            frame = await link.receive()
            try:
                await self._handle(frame)
            except LinkViolation as exc:
                await link.close(CLOSE_VIOLATION, exc.reason)
                raise

    async def _handle(self, frame: Frame) -> None:
        kind = frame.kind
        if kind is Kind.REQ or kind is Kind.PROBE:
            message = self._credit.admit_request(frame)
            if message is not None:
                self._start(message)
        elif kind is Kind.WINDOW:
            increment = window_increment(frame)
            if self._credit.grant(frame.stream, increment):
                request = self._requests.get(frame.stream)
                if request is not None:
                    request.credit.set()
        elif kind is Kind.CANCEL:
            stream = frame.stream
            opened = self._credit.is_open(stream)
            if opened and not self.cancel(stream) and stream not in self._requests:
                self._cancelled_early.add(stream)
        elif kind is Kind.WELCOME or kind is Kind.PAYLOAD:
            raise LinkViolation(
                "phase", f"the edge sent {kind.name} on a link that is serving requests"
            )
        elif self._on_control is not None:
            await self._on_control(frame)

    def _start(self, message: Frame) -> None:
        stream = message.stream
        request = _Request(stream)
        work: Coroutine[Any, Any, None]
        if stream in self._cancelled_early:  # (a CANCEL came while its REQ was still arriving)
            self._cancelled_early.discard(stream)
            request.cancelled = True
            work = self._answer(request, self._cancelled(message.kind))
        elif message.kind is Kind.PROBE:
            work = self._probe(request, probe_from(message.meta))
        else:
            work = self._call(request, call_from(message.meta, message.data))
        self._requests[stream] = request
        self._idle.clear()
        request.task = asyncio.create_task(work, name=f"iop-node stream {stream}")
        request.task.add_done_callback(lambda _: self._forget(stream))

    def _forget(self, stream: int) -> None:
        self._requests.pop(stream, None)
        self._cancelled_early.discard(stream)
        self._credit.close(stream)
        if not self._requests:
            self._idle.set()

    def cancel(self, stream: int) -> bool:
        """Cancel the request on ``stream`` (the edge's ``CANCEL``, or the drain's cut): True
        when its task was told to stop; False when it is gone, already told, or already
        sending its terminal message."""
        request = self._requests.get(stream)
        if request is None or request.cancelled or request.ending or request.task is None:
            return False
        request.cancelled = True
        request.task.cancel()
        return True

    # -- one request ---------------------------------------------------------------------------

    async def _call(self, request: _Request, call_request: CallRequest) -> None:
        """Run one ``REQ`` to its terminal message."""
        try:
            executor = self._executor(call_request)
            if call_request.op == "count_tokens":
                await self._count_tokens(request, executor, call_request)
            elif call_request.call.stream:
                await self._stream(request, executor, call_request)
            else:
                reply = await executor.complete(call_request.call)
                await self._reply(request, reply)
        except asyncio.CancelledError:
            if not request.cancelled:
                raise
            # Ours (a CANCEL or the drain's cut): the upstream call has ended (every adapter
            # aborts it when cancelled, and a stream was closed on the way out).
            self._uncancel()
            await self._answer(request, self._cancelled(Kind.REQ))
        except (AdapterError, UnsupportedRequestError) as exc:
            await self._end(request, self._error(exc))
        except LinkClosed:
            pass  # (nobody to answer: the edge has failed the request already)
        except Exception as exc:
            self._log.exception(
                "node_request_failed",
                stream=request.stream,
                request_id=call_request.call.request_id,
            )
            failure = AdapterError(
                "upstream_error",
                f"node {self.adapters.node_id!r} failed running the request: "
                f"{type(exc).__name__}: {exc}",
            )
            await self._answer(request, self._error(failure, "internal"))

    def _executor(self, call_request: CallRequest) -> Executor:
        """The executor the ``REQ`` names; a name this node does not have is an
        ``upstream_error`` that fails over (nothing reached an upstream)."""
        try:
            if call_request.provider is not None:
                return self.adapters.for_provider(call_request.provider)
            assert call_request.adapter is not None  # (call_from checked: exactly one)
            return self.adapters.for_adapter(call_request.adapter)
        except KeyError as exc:
            raise AdapterError(
                "upstream_error", str(exc.args[0]), failure="connect", failover=True
            ) from None

    async def _count_tokens(
        self, request: _Request, executor: Executor, call_request: CallRequest
    ) -> None:
        call = call_request.call
        tokens = await executor.count_tokens(call.body, call.target, call.headers, call.request_id)
        await self._end(request, Frame(Kind.RESP_REPLY, meta=tokens_meta(tokens)))

    async def _reply(self, request: _Request, reply: UpstreamReply) -> None:
        cap = self.link.limits.max_reply_bytes
        if len(reply.body) > cap:
            raise AdapterError(
                "upstream_error",
                f"the upstream's reply of {len(reply.body)} bytes is over the link's "
                f"max_reply_bytes ({cap})",
            )
        await self._end(request, Frame(Kind.RESP_REPLY, meta=reply_meta(reply), data=reply.body))

    async def _stream(
        self, request: _Request, executor: Executor, call_request: CallRequest
    ) -> None:
        opened = await executor.open_stream(call_request.call)
        if isinstance(opened, UpstreamReply):
            await self._reply(request, opened)
            return
        stream = opened
        terminal: Frame
        try:
            first = await stream.first()  # (closes the stream itself when it fails)
            self._check_chunk(first)
            await self._send(Kind.RESP_STREAM, request.stream, {"status": stream.status}, first)
            async for piece in stream.frames:
                await self._chunk(request, piece)
            terminal = Frame(Kind.RESP_END, meta={"usage": usage_meta(stream.usage)})
        except (AdapterError, UnsupportedRequestError) as exc:
            terminal = self._error(exc, usage=stream.usage)
        finally:
            # The terminal message goes once the upstream call has ended; a CANCEL from now on
            # would only interrupt that close.
            request.ending = True
            await stream.aclose()
        final = stream.final_response() or b""
        if len(final) > self.link.limits.max_chunk_bytes:
            final = b""  # (too large for one message: the stream's end is still told)
        await self._end(request, Frame(terminal.kind, meta=terminal.meta, data=final))

    async def _chunk(self, request: _Request, piece: bytes) -> None:
        """Send one yield of the stream's frames once the stream has credit."""
        credit = self._credit
        stream = request.stream
        while not credit.may_start(stream):
            request.credit.clear()
            await request.credit.wait()
        self._check_chunk(piece)
        credit.take(stream, len(piece))
        await self._send(Kind.RESP_CHUNK, stream, {}, piece)

    def _check_chunk(self, piece: bytes) -> None:
        cap = self.link.limits.max_chunk_bytes
        if len(piece) > cap:
            raise AdapterError(
                "upstream_error",
                f"the upstream sent {len(piece)} bytes at once, over the link's "
                f"max_chunk_bytes ({cap})",
            )

    async def _probe(self, request: _Request, provider: str) -> None:
        try:
            result = await self.adapters.probe(provider)
        except asyncio.CancelledError:
            if not request.cancelled:
                raise
            self._uncancel()
            result = (False, "the probe was cancelled by the edge")
        except Exception as exc:  # (a health check reports; it never takes the node down)
            result = (False, f"the health check failed on the node: {type(exc).__name__}: {exc}")
        await self._answer(request, Frame(Kind.PROBE_RESULT, meta=probe_result_meta(result)))

    # -- sending -------------------------------------------------------------------------------

    @staticmethod
    def _error(
        exc: AdapterError | UnsupportedRequestError,
        kind: ErrorType | None = None,
        *,
        usage: Usage | None = None,
    ) -> Frame:
        """A ``RESP_ERROR`` (its stream set when sent) carrying ``exc``."""
        return Frame(Kind.RESP_ERROR, meta=error_meta(exc, usage=usage, kind=kind))

    @classmethod
    def _cancelled(cls, kind: Kind) -> Frame:
        """The terminal message of a cancelled ``REQ`` or ``PROBE``."""
        if kind is Kind.PROBE:
            return Frame(Kind.PROBE_RESULT, meta=probe_result_meta((False, CANCELLED_MESSAGE)))
        return cls._error(
            AdapterError("upstream_error", CANCELLED_MESSAGE, failure=None), "cancelled"
        )

    async def _answer(self, request: _Request, terminal: Frame) -> None:
        """Send a terminal message, if the link is still up."""
        with contextlib.suppress(LinkClosed):
            await self._end(request, terminal)

    async def _end(self, request: _Request, terminal: Frame) -> None:
        """Send the request's terminal message (``terminal``'s stream is set here)."""
        request.ending = True
        await self._send(terminal.kind, request.stream, terminal.meta, terminal.data)

    async def _send(self, kind: Kind, stream: int, meta: dict[str, Any], data: bytes) -> None:
        """One message, in as many frames as ``max_frame_bytes`` needs. A cancel while it
        is being sent (the wait for the socket to drain, after a frame was written) lets the
        message finish first: a terminal message in the middle of another would break the
        protocol."""
        interrupted: asyncio.CancelledError | None = None
        for frame in split(kind, stream, meta, data, self.link.limits.max_frame_bytes):
            try:
                await self.link.send(frame)
            except asyncio.CancelledError as exc:
                interrupted = exc
        if interrupted is not None:
            raise interrupted

    @staticmethod
    def _uncancel() -> None:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()

    # -- the end of the link -------------------------------------------------------------------

    async def drain(self, until: float) -> bool:
        """Let the requests in flight finish until the clock reaches ``until``; then cancel
        the rest (each still sends its terminal message while the link is up) and wait for
        them. True when every request finished by itself."""
        finished = await self._wait_idle(until)
        if not finished:
            for stream in list(self._requests):
                self.cancel(stream)
            await self._idle.wait()
        return finished

    async def _wait_idle(self, until: float) -> bool:
        if self._idle.is_set():
            return True
        timed_out = asyncio.Event()
        cancel_timer = self._clock.call_at(until, timed_out.set)
        idle = asyncio.ensure_future(self._idle.wait())
        out = asyncio.ensure_future(timed_out.wait())
        try:
            await asyncio.wait((idle, out), return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel_timer()
            idle.cancel()
            out.cancel()
        return self._idle.is_set()

    async def aclose(self) -> None:
        """The link is gone: cancel every request (their upstream calls end; nothing can be
        answered) and wait for them."""
        for stream in list(self._requests):
            self.cancel(stream)
        await self._idle.wait()

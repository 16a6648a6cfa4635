"""One attempt of a request on a provider: its call executed, and the answer written to the client
in the request's surface — a reply, or the stream relayed frame by frame.

An attempt that fails before the client got a byte (a connect error, a timeout before the
response head or, streamed, before the first frame; HTTP 429/500/502/503/504; a CLI that could
not start or exited before any output) comes back as :class:`Failed`, for the request path to
fail over (:mod:`iop_edge.api.request_path`). One that fails after the stream started is sent
as the stream's last write (:meth:`~iop_edge.api.surface.Renderer.render_stream_error`). With a
lease, the provider's health hears of every outcome.
"""

from __future__ import annotations

import asyncio
import math
from typing import Final

from aiohttp import web

from iop_edge.adapters.base import Executor, UpstreamCall, UpstreamReply, UpstreamStream
from iop_edge.admission import Lease
from iop_edge.api.errors import client_message
from iop_edge.api.keepalive import Keepalive
from iop_edge.api.record import RequestRecord
from iop_edge.api.surface import Renderer
from iop_edge.errors import AdapterError, LeaseLost
from iop_edge.pool import Failure
from iop_edge.runtime.listeners import ConnectionGuard
from iop_edge.seams import Clock

__all__ = ["Failed", "execute", "failure_code", "final_reply", "reply"]

_JSON: Final = "application/json"
#: Upstream statuses that fail over to another provider (and count toward its ejection, but
#: for 429, which holds the provider out for its Retry-After instead).
_FAILOVER_STATUSES: Final = frozenset({429, 500, 502, 503, 504})


class Failed:
    """An attempt that failed before the client got a byte: its failure for the provider's
    health, and its error to return when no other provider is left to try."""

    __slots__ = ("error", "failure")

    def __init__(self, failure: Failure, error: AdapterError | UpstreamReply) -> None:
        self.failure = failure
        self.error = error


async def execute(
    request: web.Request,
    record: RequestRecord,
    renderer: Renderer,
    executor: Executor,
    call: UpstreamCall,
    clock: Clock,
    lease: Lease | None = None,
    keepalive: Keepalive | None = None,
) -> web.StreamResponse | Failed:
    """One attempt, its answers written by ``renderer``. With a ``lease`` (a ``models[]``
    group), a failure before the client's first byte comes back as :class:`Failed` and every
    outcome is told to the lease; without (a model route), failures are answered as they are.
    With a ``keepalive`` (a streamed request that may have sent its head while it waited),
    the answer goes to the keep-alive's response once it has one."""
    record.attempts += 1
    record.attempt_started = clock.now()
    try:
        try:
            if not call.stream:
                return _answer(record, renderer, await executor.complete(call), lease, clock)
            opened = await executor.open_stream(call)
            # The first frame comes before the response head: a stream that fails before it
            # (first_token_timeout_ms) has sent the client nothing, and may fail over.
            first = b"" if isinstance(opened, UpstreamReply) else await opened.first()
        except asyncio.CancelledError:
            raise _lost(lease) from None
    except AdapterError as exc:
        if lease is not None and exc.failure is not None:
            failure = Failure(exc.failure, str(exc))
            if exc.failover:
                return Failed(failure, exc)
            lease.failed(failure)
        raise
    if isinstance(opened, UpstreamReply):
        answered = _answer(record, renderer, opened, lease, clock)
        if keepalive is None or isinstance(answered, Failed):
            return answered
        return await final_reply(record, renderer, opened, clock, keepalive)
    return await _relay(request, record, renderer, opened, first, lease, clock, keepalive)


def _lost(lease: Lease | None) -> AdapterError:
    """The attempt's task was cancelled: when its lease was lost in the shared store, that
    cancellation is withdrawn and the attempt fails with that reason (a 503 before the
    client's first byte, the stream's error event after it; the provider is not blamed). Any
    other cancellation goes on."""
    task = asyncio.current_task()
    if lease is None or lease.lost is None or task is None:
        raise asyncio.CancelledError
    task.uncancel()
    return LeaseLost(lease.lost)


def _answer(
    record: RequestRecord,
    renderer: Renderer,
    upstream: UpstreamReply,
    lease: Lease | None,
    clock: Clock,
) -> web.Response | Failed:
    if lease is not None:
        if upstream.status in _FAILOVER_STATUSES:
            reason = upstream.detail or f"the upstream answered HTTP {upstream.status}"
            failure = (
                Failure("status_429", reason, upstream.retry_after)
                if upstream.status == 429
                else Failure("status_5xx", reason)
            )
            return Failed(failure, upstream)
        lease.succeeded()
    return reply(record, renderer, upstream, clock)


async def final_reply(
    record: RequestRecord,
    renderer: Renderer,
    upstream: UpstreamReply,
    clock: Clock,
    keepalive: Keepalive | None,
) -> web.StreamResponse:
    """The client's answer to an upstream's reply that ends the request (:func:`reply`); when
    a keep-alive has sent the stream's head, the reply's error as the stream's last event."""
    answer = reply(record, renderer, upstream, clock)
    response = await keepalive.settle() if keepalive is not None else None
    if response is None:
        return answer
    record.status = 200  # (the head that went out said so; the code says what happened)
    await response.write(renderer.render_stream_reply(upstream))
    await response.write_eof()
    return response


def reply(
    record: RequestRecord, renderer: Renderer, upstream: UpstreamReply, clock: Clock
) -> web.Response:
    """The client's answer to a non-streamed reply (or an upstream's error status)."""
    record.status, record.usage = upstream.status, upstream.usage
    if upstream.status >= 400:
        # An upstream's 4xx (but 429) refused the request, it did not fail: client_error,
        # as the per-provider metrics name it.
        refused = upstream.status < 500 and upstream.status != 429
        record.code = "client_error" if refused else "upstream_error"
        record.upstream_failure = f"http_{upstream.status}"
        record.error = upstream.detail  # what the upstream said: the log's, not the client's
    else:
        record.time_to_first_token = clock.now() - record.started
    headers = _ids(record)
    if upstream.retry_after is not None:
        # The upstream's 429 reaches the client with its Retry-After (whole seconds).
        headers["Retry-After"] = str(math.ceil(upstream.retry_after))
    return web.Response(
        body=renderer.render_reply(upstream),
        status=upstream.status,
        content_type=_JSON,
        headers=headers,
    )


async def _relay(
    request: web.Request,
    record: RequestRecord,
    renderer: Renderer,
    stream: UpstreamStream,
    first: bytes,
    lease: Lease | None,
    clock: Clock,
    keepalive: Keepalive | None,
) -> web.StreamResponse:
    # A client that stops reading would hold the slot forever, the handler waiting in
    # write(). The connection's guard cancels this task when the client has taken no data
    # for openai.write_timeout_ms (a timer armed only once a write has to wait), and the
    # exchange's request_timeout_ms cancels it too when it runs out first.
    guard = ConnectionGuard.of(request)
    stalled: str | None = None
    async with stream:
        committed = await keepalive.settle() if keepalive is not None else None
        response = committed or web.StreamResponse(
            status=200,
            headers={
                **_ids(record),
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
            },
        )
        if guard is not None:
            guard.watch(asyncio.current_task())
        try:
            if committed is None:
                await response.prepare(request)
            record.status = 200
            try:
                record.time_to_first_token = clock.now() - record.started
                first, frames = renderer.render_stream(first, stream.frames)
                if first:
                    await response.write(first)
                async for frame in frames:
                    await response.write(frame)
                renderer.stream_finished(stream.final_response)
                if lease is not None:
                    lease.succeeded()
            except (AdapterError, asyncio.CancelledError) as caught:
                # Headers are gone: the failure travels in the stream, as OpenAI sends it
                exc = caught if isinstance(caught, AdapterError) else _lost(lease)
                # (no failover now; the provider's health still hears of it).
                if lease is not None and exc.failure is not None:
                    lease.failed(Failure(exc.failure, str(exc)))
                record.code, record.error = exc.code, str(exc)
                record.upstream_failure = exc.code
                if not exc.error_relayed:  # (else the upstream's own error event was the last)
                    message = client_message(exc, record.provider)
                    await response.write(
                        renderer.render_stream_error(message, exc.code, exc.status)
                    )
            await response.write_eof()
        except ConnectionResetError:
            # The client left (before or during the stream): nothing more can be sent.
            record.status, record.code = 499, "client_gone"
        except asyncio.CancelledError:
            if stream.timed_out():
                stalled = (
                    "the client took no data until the provider's request_timeout_ms ran "
                    "out while the answer waited for it; the upstream call was aborted"
                )
            elif guard is not None and guard.stall_cancelled():
                stalled = (
                    f"the client took no data for {guard.write_timeout:g} s "
                    "(openai.write_timeout_ms) while the answer waited for it; the "
                    "upstream call was aborted"
                )
            else:
                raise
            record.status, record.code, record.error = 499, "client_stalled", stalled
        finally:
            if guard is not None:
                guard.unwatch()
            record.usage = stream.usage
    if stalled is not None:
        # Only now, with the upstream closed: the connection's loss cancels this handler.
        if guard is not None:
            guard.reset()
        elif request.transport is not None:
            request.transport.abort()
    return response


def failure_code(error: AdapterError | UpstreamReply) -> str:
    """How an attempt failed, as the upstream-errors metric names it."""
    return error.code if isinstance(error, AdapterError) else f"http_{error.status}"


def _ids(record: RequestRecord) -> dict[str, str]:
    headers = {"x-request-id": record.request_id}
    if record.provider:
        headers["x-iop-provider"] = record.provider
    return headers

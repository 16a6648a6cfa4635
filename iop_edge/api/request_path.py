"""The request path, one for every API surface (:mod:`iop_edge.api.surface`).

A request of a surface is authenticated, its body read and parsed by the surface into the
internal form (an OpenAI request), its model resolved (a ``models[]`` group through the
scheduler, or a fixed ``model_routes[]`` entry) and checked against the principal's allow-list,
the generation policy applied, admitted into the providers of the group that serve the endpoint
and honour the request's fields, executed on the provider's adapter, answered or relayed in the
surface's format (:mod:`iop_edge.api.attempt`), its lease released exactly once, and recorded in
one log line. An attempt that fails before the client got a byte fails over to a provider the
request has not tried (:meth:`AdmissionScheduler.failover`), up to
``provider_pool.failover.max_attempts``, when the failed provider's ``retry_on`` lists the
failure's class (the scheduler decides); every attempt's outcome feeds its provider's health.

The :class:`~iop_edge.adapters.base.UpstreamCall` is built once per request, for the first
provider admission gives it (its target and stream bounds are that provider's); an attempt on
another provider after a failover derives its call from that one, with the new provider's
target and bounds.

Every answer carries ``x-request-id``: the client's when it is 1-128 characters of
``A-Z a-z 0-9 . _ : -``, else a generated one (never an error); the same id is in the request's
log line and goes upstream.

Client disconnects cancel the handler (the runner is built with ``handler_cancellation``): a
queued request leaves the queue, an upstream call is aborted (a CLI process group killed), and
the lease is released on the way out.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Final, Protocol

from aiohttp import web

from iop_edge.adapters.base import Executor
from iop_edge.adapters.registry import NodeAdapters
from iop_edge.admission import AdmissionScheduler, Lease
from iop_edge.api.attempt import Failed, execute, failure_code, final_reply
from iop_edge.api.auth import Authenticator, ProviderAuthForwarder
from iop_edge.api.bodies import prepare
from iop_edge.api.catalog import (
    Catalog,
    ModelEntry,
    RouteEntry,
    admission_group,
    model_not_found,
)
from iop_edge.api.errors import client_message, describe, error_headers
from iop_edge.api.exchange import Exchange
from iop_edge.api.guard import RequestGuard, exception_summary, require_json_body
from iop_edge.api.keepalive import Keepalive, KeepaliveTicker
from iop_edge.api.record import RequestObserver, RequestRecord
from iop_edge.api.surface import Surface
from iop_edge.config.policy import route_group
from iop_edge.config.schema import EdgeConfig
from iop_edge.config.validate import is_loopback
from iop_edge.errors import AdapterError, AdmissionError, IopEdgeError, RequestError
from iop_edge.pool import ANONYMOUS
from iop_edge.runtime.listeners import ConnectionGuard
from iop_edge.runtime.logs import Logger, RequestLineWriter, structured_request_line
from iop_edge.seams import Clock

if TYPE_CHECKING:
    from iop_edge.handover.relay import HandoverRelay

__all__ = ["ErrorRenderer", "RequestPath", "error_response", "request_id", "session_id"]

_REQUEST_ID_RE: Final = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
# Generated request ids: 32 hex characters, a random per-process prefix and a counter — unique
# without a system call per request (they identify requests; they are not secrets).
_ID_PREFIX: Final = os.urandom(8).hex()
_ID_COUNTER: Final = itertools.count(1)
_JSON: Final = "application/json"


class RequestPath:
    """The request path: :meth:`_serve` answers one request of a surface. The server
    (:class:`iop_edge.api.server.OpenAIServer`) routes the surfaces to it. The path reads the
    handover's state from its relay (:class:`iop_edge.handover.relay.HandoverRelay`): once a
    successor took over, a request is relayed to it; a drain that ran out cuts the requests;
    a request relayed to this process keeps the arrival it had at the one before."""

    def __init__(
        self,
        config: EdgeConfig,
        catalog: Catalog,
        scheduler: AdmissionScheduler,
        adapters: NodeAdapters,
        *,
        clock: Clock,
        logger: Logger,
        write_request_line: RequestLineWriter | None = None,
        observers: Iterable[RequestObserver] = (),
        relay: HandoverRelay,
    ) -> None:
        self.catalog = catalog
        self.relay = relay
        self.scheduler = scheduler
        self.adapters = adapters
        self.clock = clock
        self.log = logger
        self.write_request_line = write_request_line or structured_request_line(logger)
        self.observers = list(observers)
        self.auth = Authenticator(config.openai)
        self.provider_auth = ProviderAuthForwarder(config.openai)
        self.max_body_bytes = config.openai.max_body_bytes
        #: the one timer of the streams that wait with a keep-alive (api/keepalive.py)
        self.keepalives = KeepaliveTicker(clock)
        # An open surface trusts whoever can reach loopback: a browser page must not count
        # (DNS rebinding), so only loopback Host names are answered. With allow_anonymous
        # off loopback the operator has chosen to trust the network.
        self.guard = RequestGuard(
            allowed_origins=config.openai.allowed_origins,
            loopback_hosts_only=self.auth.open and is_loopback(config.openai.listen),
            no_origin="list it in openai.allowed_origins to let web pages of that origin "
            "call this edge.",
            why_loopback="openai.principal_tokens is empty; add principal tokens to serve "
            "other names.",
        )

    async def _serve(self, request: web.Request, surface: Surface) -> web.StreamResponse:
        """A request of ``surface``: its answer, or its error in the surface's envelope, and
        always its request line."""
        record = RequestRecord(request_id(request), surface.name, self.clock.now())
        try:
            response = await self._run(request, surface, record)
            if self.relay.handed_over and not response.prepared:
                # Handed over: the answer closes its connection (saying so), and the client's
                # next request opens a new one, which the new process accepts.
                response.force_close()
            return response
        except IopEdgeError as exc:
            if (
                isinstance(exc, AdmissionError)
                and exc.reason == "handed_over"
                and self.relay.handed_over
            ):
                return await self._relayed(request, record)
            status, record.code, _ = describe(exc)
            record.status = surface.error_status(record.code, status)
            if record.error is None:  # (an allow-list denial has set what the log says)
                record.error = str(exc)
            if isinstance(exc, AdapterError) and exc.code.startswith("upstream_"):
                record.upstream_failure = exc.code
            return error_response(
                exc,
                record.request_id,
                record.provider,
                render=surface.render_error,
                status_of=surface.error_status,
            )
        except asyncio.CancelledError:
            record.status, record.code = (
                (503, "drain_timeout") if self.relay.cutting else record.cancelled_as
            )
            raise
        except Exception as exc:
            # A bug, not a client's fault: answer in the surface's envelope and log where it
            # happened — the type and the frames, never the message or the exception's
            # arguments: they may quote request data (a UnicodeError holds the whole header).
            kind, frames = exception_summary(exc)
            where = f" at {frames[-1]}" if frames else ""
            record.status, record.code = 500, "internal_error"
            record.error = f"internal error: {kind}{where}"
            self.log.error(
                "request_failed", request_id=record.request_id, error_type=kind, traceback=frames
            )
            return error_response(
                IopEdgeError(
                    "The edge failed to handle this request; its log has the details "
                    "under this request's x-request-id."
                ),
                record.request_id,
                record.provider,
                render=surface.render_error,
                status_of=surface.error_status,
            )
        finally:
            record.duration = self.clock.now() - record.started
            self.finish(record)

    async def _relayed(self, request: web.Request, record: RequestRecord) -> web.StreamResponse:
        """The successor's answer to ``request``, which this process no longer serves."""
        relayed = await self.relay.forward(request, record.request_id, record.started)
        record.status, record.code = relayed.status, "relayed"
        return relayed

    async def _run(
        self, request: web.Request, surface: Surface, record: RequestRecord
    ) -> web.StreamResponse:
        headers = request.headers
        self.guard.check(headers)
        record.session_id = session_id(headers)
        # Handed over: what still comes on a kept-alive connection is the new process's to
        # judge, with its config (a token, model or limit the restart added): relayed unjudged.
        handed_over = self.relay.handed_over
        if not handed_over:
            record.principal = self.auth.authenticate_headers(headers)
        raw = await self.read_body(request, record)
        if handed_over:
            return await self._relayed(request, record)
        parsed = surface.parse(raw, headers, record.principal)
        body = parsed.body
        endpoint = surface.endpoint
        record.model = model_id = body["model"]
        record.stream = endpoint != "embeddings" and bool(body.get("stream"))
        catalog = self.catalog
        share, model, route = self.resolve(record, catalog, model_id)
        refusal = parsed.refusal
        if refusal is not None and not any(
            parsed.native_api in executor.native_apis
            for _, executor, _ in self.executors(catalog, model, route)
        ):
            raise refusal  # (no provider of the model could take it as it is)
        if model is None:
            prepared = prepare(body, endpoint, None, catalog.long_context_threshold_tokens)
            # Admitted like a group (its capacity, the principal's caps and share); its
            # outcomes are not reported: a route has no health.
            group, long_context = route_group(model_id), False
        else:
            prepared = prepare(body, endpoint, model, catalog.long_context_threshold_tokens)
            group = admission_group(model, endpoint, body)
            long_context = prepared.long_context
        exchange = Exchange(
            parsed,
            endpoint,
            prepared,
            model,
            route,
            self.provider_auth.upstream_headers(headers),
            record.request_id,
            model_id,
        )
        if not prepared.stream or parsed.keepalive is None:
            return await self._admitted(request, record, exchange, share, group, long_context)
        # A stream that may wait long: its head and the surface's keep-alive event go out
        # if it does (api/keepalive.py); a refusal after that travels in the stream.
        keepalive = Keepalive(
            request, self.keepalives, parsed.keepalive, {"x-request-id": record.request_id}
        )
        exchange.keepalive = keepalive
        try:
            return await self._admitted(request, record, exchange, share, group, long_context)
        except IopEdgeError as exc:
            response = await keepalive.settle()
            if response is None:
                raise
            await self._refused_in_stream(response, exc, record, exchange)
            return response
        finally:
            keepalive.stop()

    async def _refused_in_stream(
        self,
        response: web.StreamResponse,
        exc: IopEdgeError,
        record: RequestRecord,
        exchange: Exchange,
    ) -> None:
        """A refusal of a stream whose head went out (keep-alive): the surface's error event
        as its last write (the status said 200; the request line's code says what happened)."""
        status, code, _ = describe(exc)
        record.status, record.code = 200, code or "upstream_error"
        record.error = record.error or str(exc)
        if isinstance(exc, AdapterError):
            status = exc.status
            if exc.code.startswith("upstream_"):
                record.upstream_failure = exc.code
        renderer = exchange.parsed.renderer(
            native=False, estimated_input_tokens=exchange.prepared.estimated_input_tokens
        )
        message = client_message(exc, record.provider)
        await response.write(renderer.render_stream_error(message, record.code, status))
        await response.write_eof()

    async def read_body(self, request: web.Request, record: RequestRecord) -> bytes:
        """The request's JSON body (a 415 for another type, a 413 past
        ``openai.max_body_bytes``; a body that stops arriving is cut, and logged as such)."""
        require_json_body(request)
        # A body still arriving has openai.header_timeout_ms to finish (the listener's body
        # timer); its guard says whether that timer cut it (taken now: the cut forgets it).
        guard = None if request.content.is_eof() else ConnectionGuard.of(request)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise RequestError(
                "request_too_large",
                f"The request body is larger than this edge accepts ({self.max_body_bytes} "
                "bytes, openai.max_body_bytes).",
                status=413,
            ) from None
        except asyncio.CancelledError:
            if guard is not None and guard.body_timed_out:
                record.cancelled_as = (408, "body_timeout")
                record.error = (
                    "the client did not send the rest of its request body within "
                    f"{guard.header_timeout:g} s (openai.header_timeout_ms); the edge closed "
                    "the connection"
                )
            raise
        return raw

    def executors(
        self, catalog: Catalog, model: ModelEntry | None, route: RouteEntry | None
    ) -> list[tuple[str, Executor, str]]:
        """The providers of a model group (in its order; a disabled one has no executor) or
        the route's one adapter: each provider's id, executor and upstream target."""
        if model is None:
            assert route is not None
            return [
                (route.adapter, self.adapters.route(route.node_id, route.adapter), route.target)
            ]
        found = []
        nodes = catalog.provider_nodes
        for provider_id, target in model.targets.items():
            try:
                executor = self.adapters.provider(nodes[provider_id], provider_id)
            except KeyError:
                continue
            found.append((provider_id, executor, target))
        return found

    def resolve(
        self, record: RequestRecord, catalog: Catalog, model_id: str
    ) -> tuple[str, ModelEntry | None, RouteEntry | None]:
        """The request's share (whose allow-list, caps and fair share it counts under) and its
        model: a ``models[]`` group or else a route. A model the share may not use is answered
        exactly as an unknown one (the allow-list leaks no model's existence; only the log
        line says why)."""
        principal = record.principal
        share = (
            catalog.share_of(principal.principal_ref, principal.token_ref)
            if principal
            else ANONYMOUS
        )
        if not catalog.permits(share, model_id):
            if model_id in catalog.models or model_id in catalog.routes:
                record.error = (
                    f"the principal '{share}' may not use the model '{model_id}' "
                    f"(provider_pool.principals[{share}].models); answered as an unknown model"
                )
            raise model_not_found(model_id)
        model = catalog.models.get(model_id)
        route = catalog.routes.get(model_id) if model is None else None
        if model is None and route is None:
            raise model_not_found(model_id)
        record.resolved = True
        return share, model, route

    async def _admitted(
        self,
        request: web.Request,
        record: RequestRecord,
        exchange: Exchange,
        share: str,
        group: str,
        long_context: bool,
    ) -> web.StreamResponse:
        """Admit the request into ``group``, run its attempts (failing over), and answer."""
        lease: Lease | None = await self.scheduler.admit(
            group,
            long_context=long_context,
            principal=share,
            submitted_at=self.relay.arrival(request.headers),
        )
        assert lease is not None
        record.queue_wait = lease.queue_wait
        model, route, prepared = exchange.model, exchange.route, exchange.prepared
        try:
            while True:
                if model is not None:
                    record.node, record.provider = lease.node_id, lease.provider_id
                    # The scheduler and the catalog are swapped together: the current catalog
                    # knows the provider the lease names, even if a refresh happened while we
                    # queued. The provider's stream bounds are live too.
                    catalog = self.catalog
                    current = catalog.models.get(model.id, model)
                    target = (
                        current.targets.get(lease.provider_id) or model.targets[lease.provider_id]
                    )
                    bounds = (
                        catalog.stream_bounds.get(lease.provider_id) if prepared.stream else None
                    )
                    executor = self.adapters.provider(lease.node_id, lease.provider_id)
                    told: Lease | None = lease
                else:  # a model route: one attempt, on its own adapter and target
                    assert route is not None  # (resolved above: the model is one or the other)
                    record.node, record.provider = route.node_id, route.adapter
                    target, bounds = route.target, None
                    executor = self.adapters.route(route.node_id, route.adapter)
                    told = None  # (a route has no health to tell)
                call, renderer = exchange.attempt(executor, target, bounds)
                attempt = await execute(
                    request,
                    record,
                    renderer,
                    executor,
                    call,
                    self.clock,
                    told,
                    exchange.keepalive,
                )
                if not isinstance(attempt, Failed):
                    return attempt
                failed, lease = lease, None  # released by failover(), whatever it returns
                # Recorded as soon as the request re-enters admission (before the wait): a
                # retry that times out in the queue, or whose client leaves, still counts.
                retried = functools.partial(
                    record.failed_over,
                    attempt.failure.kind,
                    failure_code(attempt.error),
                    self.clock.now(),
                )
                lease = await self.scheduler.failover(failed, attempt.failure, retried=retried)
                if lease is None:  # no retry (or none left): this attempt's error is the answer
                    if isinstance(attempt.error, AdapterError):
                        raise attempt.error
                    return await final_reply(
                        record, renderer, attempt.error, self.clock, exchange.keepalive
                    )
        finally:
            if lease is not None:
                lease.release()

    def finish(self, record: RequestRecord, **shown: object) -> None:
        """Log the request's line (``shown``: fields of its own, after ``endpoint``) and tell
        every observer (the metrics)."""
        self.write_request_line({"endpoint": record.endpoint, **shown, **record.log_fields()})
        for observe in self.observers:
            observe(record)


def session_id(headers: Mapping[str, str]) -> str | None:
    """The agent session a request belongs to: ``X-Claude-Code-Session-Id`` when it is 1-128
    characters of ``A-Z a-z 0-9 . _ : -`` (as for ``x-request-id``), else none (an invalid
    one is dropped, never logged: it may carry anything)."""
    given = headers.get("x-claude-code-session-id")
    if given is not None and _REQUEST_ID_RE.match(given):
        return given
    return None


def request_id(request: web.Request) -> str:
    """The request's id: the client's ``x-request-id`` when it is valid, else a new one."""
    given = request.headers.get("x-request-id")
    if given is not None and _REQUEST_ID_RE.match(given):
        return given
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


class ErrorRenderer(Protocol):
    """Builds an error answer's body (:meth:`~iop_edge.api.surface.Surface.render_error`)."""

    def __call__(
        self, message: str, code: str | None, *, status: int, param: str | None = None
    ) -> bytes:
        """The body of an error answer of ``status``."""
        ...


def error_response(
    exc: IopEdgeError,
    request_id: str,
    provider: str | None = None,
    *,
    render: ErrorRenderer,
    status_of: Callable[[str | None, int], int] | None = None,
) -> web.Response:
    """The error answer to ``exc`` (its status, code and headers), rendered by ``render``;
    ``status_of`` gives a surface's status for the edge's code and status (else the edge's)."""
    status, code, param = describe(exc)
    if status_of is not None:
        status = status_of(code, status)
    headers = {"x-request-id": request_id, **error_headers(code)}
    if isinstance(exc, AdmissionError) and exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    if provider:
        headers["x-iop-provider"] = provider
    return web.Response(
        body=render(client_message(exc, provider), code, status=status, param=param),
        status=status,
        content_type=_JSON,
        headers=headers,
    )

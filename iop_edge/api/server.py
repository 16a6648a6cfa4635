"""The OpenAI-compatible HTTP surface (aiohttp).

``POST /v1/chat/completions``, ``POST /v1/completions`` and ``POST /v1/embeddings``:
authenticate, read and check the body, resolve the model (a ``models[]`` group through the
scheduler, or a fixed ``model_routes[]`` entry), apply the generation policy, admit into the
providers of the group that serve the endpoint and honour the request's fields, execute on the
provider's adapter, relay the answer, release the lease exactly once, and record one log line.
An attempt that fails before the client got a byte (a connect error, a timeout before the
response head, HTTP 429/500/502/503/504, a CLI that could not start or exited before any output)
fails over to a provider the request has not tried (:meth:`AdmissionScheduler.failover`), up to
``provider_pool.failover.max_attempts``, when the failed provider's ``retry_on`` lists the
failure's class (the scheduler decides); every attempt's outcome feeds its provider's health.
``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /healthz`` and ``GET /readyz`` answer from
the current catalog. Any other path or method answers 404 ``unknown_url`` / 405
``method_not_allowed`` (with ``Allow``) in the OpenAI envelope, logged and counted like a request
(model ``(unknown)``).

Every answer carries ``x-request-id``: the client's when it is 1-128 characters of
``A-Z a-z 0-9 . _ : -``, else a generated one (never an error); the same id is in the request's
log line and goes upstream.

Client disconnects cancel the handler (the runner is built with ``handler_cancellation``): a
queued request leaves the queue, an upstream call is aborted (a CLI process group killed), and
the lease is released on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import os
import re
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Final

from aiohttp import web

from iop_edge.adapters.base import (
    Executor,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
)
from iop_edge.adapters.fields import refusal
from iop_edge.adapters.registry import NodeAdapters
from iop_edge.admission import AdmissionScheduler, Lease
from iop_edge.api.auth import Authenticator, ProviderAuthForwarder
from iop_edge.api.bodies import Endpoint, parse_body, prepare
from iop_edge.api.catalog import Catalog, LoadTimes, ModelEntry, build_catalog
from iop_edge.api.errors import client_message, describe, error_headers
from iop_edge.api.guard import (
    Cors,
    RequestGuard,
    exception_summary,
    install_log_scrubber,
    require_json_body,
)
from iop_edge.api.record import RequestObserver, RequestRecord
from iop_edge.config.policy import (
    EMBEDDING_TYPES,
    capable_group,
    completions_group,
    embeddings_group,
    route_group,
)
from iop_edge.config.schema import EdgeConfig
from iop_edge.config.validate import is_loopback
from iop_edge.envelope import envelope
from iop_edge.errors import AdapterError, AdmissionError, IopEdgeError, RequestError
from iop_edge.pool import ANONYMOUS, Failure
from iop_edge.runtime.lifecycle import Lifecycle, Phase
from iop_edge.runtime.listeners import ConnectionGuard
from iop_edge.runtime.logs import Logger, RequestLineWriter, structured_request_line
from iop_edge.seams import Clock

if TYPE_CHECKING:
    from iop_edge.handover.relay import HandoverRelay

_REQUEST_ID_RE: Final = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
# Generated request ids: 32 hex characters, a random per-process prefix and a counter — unique
# without a system call per request (they identify requests; they are not secrets).
_ID_PREFIX: Final = os.urandom(8).hex()
_ID_COUNTER: Final = itertools.count(1)
_JSON: Final = "application/json"
#: Upstream statuses that fail over to another provider (and count toward its ejection, but
#: for 429, which holds the provider out for its Retry-After instead).
_FAILOVER_STATUSES: Final = frozenset({429, 500, 502, 503, 504})
#: the phases this process serves in itself (ready for /readyz, unless it handed over)
_SERVING_PHASES: Final = frozenset({Phase.READY, Phase.HANDING_OVER})


class _Failed:
    """An attempt that failed before the client got a byte: its failure for the provider's
    health, and its error to return when no other provider is left to try."""

    __slots__ = ("error", "failure")

    def __init__(self, failure: Failure, error: AdapterError | UpstreamReply) -> None:
        self.failure = failure
        self.error = error


class OpenAIServer:
    """The request path. :meth:`swap_catalog` replaces the catalog atomically on a refresh."""

    def __init__(
        self,
        config: EdgeConfig,
        scheduler: AdmissionScheduler,
        adapters: NodeAdapters,
        *,
        clock: Clock,
        logger: Logger,
        write_request_line: RequestLineWriter | None = None,
        observers: Iterable[RequestObserver] = (),
        lifecycle: Lifecycle,
        relay: HandoverRelay,
    ) -> None:
        #: when this process first loaded each model id (the ``created`` of /v1/models)
        self.load_times = LoadTimes(time.time)
        self.catalog: Catalog = build_catalog(config, created=self.load_times)
        self.scheduler = scheduler
        self.adapters = adapters
        self.clock = clock
        self.log = logger
        self.write_request_line = write_request_line or structured_request_line(logger)
        self.observers = list(observers)
        self.auth = Authenticator(config.openai)
        self.provider_auth = ProviderAuthForwarder(config.openai)
        self.max_body_bytes = config.openai.max_body_bytes
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
        #: the process's phase and its handover: read here, moved by the daemon
        self.lifecycle = lifecycle
        self.relay = relay
        #: the routes build_app added (what a 405's Allow is computed from)
        self._known: tuple[web.AbstractResource, ...] = ()

    @property
    def ready(self) -> bool:
        """Whether ``/readyz`` says ready: in the phase ``ready``, and while handing over
        until the leases went to the new process (:mod:`iop_edge.runtime.lifecycle`)."""
        return self.lifecycle.phase in _SERVING_PHASES and not self.relay.handed_over

    def swap_catalog(self, catalog: Catalog) -> None:
        """Serve new requests from ``catalog`` (requests in flight keep the one they started
        with for their policy; their upstream target is read after admission)."""
        self.catalog = catalog

    def build_app(self) -> web.Application:
        """The aiohttp application (body limit: ``openai.max_body_bytes``). With
        ``openai.allowed_origins`` it also answers CORS for those origins (preflights, and
        ``Access-Control-Allow-Origin`` on answers); without, none of that code runs."""
        install_log_scrubber()
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/v1/models/{model_id:.+}", self.get_model)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        self._known = tuple(app.router.resources())
        if self.guard.allowed_origins:
            cors = Cors(self.guard, self.provider_auth.from_header)
            app.router.add_route("OPTIONS", "/v1/{path:.*}", cors.preflight)
            app.on_response_prepare.append(cors.allow)
        # Last, and indexed under "/": aiohttp tries it only after every other route failed
        # to match, so it costs the known routes nothing.
        app.router.add_route("*", "/{path:.*}", self.unknown_route)
        return app

    # -- small endpoints ---------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        """Liveness: the process answers."""
        return web.Response(
            body=b'{"status":"ok"}',
            content_type=_JSON,
            headers={"x-request-id": _request_id(request)},
        )

    async def readyz(self, request: web.Request) -> web.Response:
        """Readiness: the config is loaded and the listeners are bound."""
        headers = {"x-request-id": _request_id(request)}
        if self.ready:
            return web.Response(body=b'{"status":"ready"}', content_type=_JSON, headers=headers)
        return web.Response(
            body=b'{"status":"starting"}', status=503, content_type=_JSON, headers=headers
        )

    async def unknown_route(self, request: web.Request) -> web.Response:
        """Any path or method no route serves: 404 ``unknown_url``, or 405
        ``method_not_allowed`` with ``Allow`` when the path is served with other methods; in
        the OpenAI envelope, logged (method and path, cut at 200 characters) and counted under
        the model ``(unknown)`` — never the path as a label."""
        record = RequestRecord(_request_id(request), "(unknown)", self.clock.now())
        with contextlib.suppress(IopEdgeError):  # (attribution only: the answer is the same)
            record.principal = self.auth.authenticate(request.headers.get("Authorization"))
        allowed: set[str] = set()
        for resource in self._known:
            _, methods = await resource.resolve(request)
            allowed |= methods
        method, path = request.method, request.path
        shown = path if len(path) <= 200 else path[:197] + "..."
        headers = {"x-request-id": record.request_id}
        if allowed:
            record.status, record.code = 405, "method_not_allowed"
            allow = ", ".join(sorted(allowed))
            headers["Allow"] = allow
            message = f"The method {method} is not allowed on {shown}; it allows {allow}."
        else:
            record.status, record.code = 404, "unknown_url"
            message = (
                f"Unknown request URL: {method} {shown}. This edge serves POST "
                "/v1/chat/completions, /v1/completions and /v1/embeddings, and GET /v1/models."
            )
        record.error = message
        record.duration = self.clock.now() - record.started
        self._finish(record, endpoint=None, method=method[:16], path=shown)
        return web.Response(
            body=envelope(message, record.code, status=record.status),
            status=record.status,
            content_type=_JSON,
            headers=headers,
        )

    async def list_models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``: every model group and model route the caller may use. A refusal
        (401, 403) is logged and counted like any request (model ``(unknown)``); an answer is
        not (a listing is no use of a model)."""
        rid = _request_id(request)
        try:
            self.guard.check(request.headers)
            principal = self.auth.authenticate(request.headers.get("Authorization"))
        except IopEdgeError as exc:
            return self._refused(request, exc, rid)
        catalog = self.catalog
        body = catalog.models_body_for(
            catalog.share_of(principal.principal_ref, principal.token_ref)
        )
        return web.Response(body=body, content_type=_JSON, headers={"x-request-id": rid})

    async def get_model(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{id}`` (a refusal logged and counted as for ``GET /v1/models``)."""
        rid = _request_id(request)
        model_id = request.match_info["model_id"]
        try:
            self.guard.check(request.headers)
            principal = self.auth.authenticate(request.headers.get("Authorization"))
        except IopEdgeError as exc:
            return self._refused(request, exc, rid)
        try:
            catalog = self.catalog
            ref = catalog.share_of(principal.principal_ref, principal.token_ref)
            body = catalog.model_body(model_id) if catalog.permits(ref, model_id) else None
            if body is None:
                raise _model_not_found(model_id)
        except IopEdgeError as exc:
            return _error_response(exc, rid)
        return web.Response(body=body, content_type=_JSON, headers={"x-request-id": rid})

    def _refused(self, request: web.Request, exc: IopEdgeError, rid: str) -> web.Response:
        """A models request refused before it was authenticated: its error answer, with its
        request line and count (model ``(unknown)``), as for the other endpoints."""
        record = RequestRecord(rid, "models", self.clock.now())
        record.status, record.code, _ = describe(exc)
        record.error = str(exc)
        self._finish(record, method=request.method, path=request.path[:200])
        return _error_response(exc, rid)

    # -- completions -------------------------------------------------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions``, streaming or not."""
        return await self._serve(request, "chat/completions")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/completions`` (served by passthrough providers only)."""
        return await self._serve(request, "completions")

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/embeddings`` (served by ``openai_compat`` and ``ollama`` providers)."""
        return await self._serve(request, "embeddings")

    async def _serve(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        record = RequestRecord(_request_id(request), endpoint, self.clock.now())
        try:
            response = await self._run(request, endpoint, record)
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
                relayed = await self.relay.forward(request, record.request_id, record.started)
                record.status, record.code = relayed.status, "relayed"
                return relayed
            record.status, record.code, _ = describe(exc)
            if record.error is None:  # (an allow-list denial has set what the log says)
                record.error = str(exc)
            if isinstance(exc, AdapterError) and exc.code.startswith("upstream_"):
                record.upstream_failure = exc.code
            return _error_response(exc, record.request_id, record.provider)
        except asyncio.CancelledError:
            record.status, record.code = (
                (503, "drain_timeout") if self.relay.cutting else record.cancelled_as
            )
            raise
        except Exception as exc:
            # A bug, not a client's fault: answer in the OpenAI envelope and log where it
            # happened — the type and the frames, never the message or the exception's
            # arguments: they may quote request data (a UnicodeError holds the whole header).
            kind, frames = exception_summary(exc)
            where = f" at {frames[-1]}" if frames else ""
            record.status, record.code = 500, "internal_error"
            record.error = f"internal error: {kind}{where}"
            self.log.error(
                "request_failed", request_id=record.request_id, error_type=kind, traceback=frames
            )
            return _error_response(
                IopEdgeError(
                    "The edge failed to handle this request; its log has the details "
                    "under this request's x-request-id."
                ),
                record.request_id,
                record.provider,
            )
        finally:
            record.duration = self.clock.now() - record.started
            self._finish(record)

    async def _run(
        self, request: web.Request, endpoint: Endpoint, record: RequestRecord
    ) -> web.StreamResponse:
        headers = request.headers
        self.guard.check(headers)
        record.principal = self.auth.authenticate(headers.get("Authorization"))
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
        body = parse_body(raw, endpoint)
        record.model = model_id = body["model"]
        record.stream = endpoint != "embeddings" and bool(body.get("stream"))
        upstream_headers = self.provider_auth.upstream_headers(request.headers)
        catalog = self.catalog
        principal = record.principal
        share = (
            catalog.share_of(principal.principal_ref, principal.token_ref)
            if principal
            else ANONYMOUS
        )
        if not catalog.permits(share, model_id):
            # Exactly as an unknown model: the allow-list leaks no model's existence (only the
            # log line says why).
            if model_id in catalog.models or model_id in catalog.routes:
                record.error = (
                    f"the principal '{share}' may not use the model '{model_id}' "
                    f"(provider_pool.principals[{share}].models); answered as an unknown model"
                )
            raise _model_not_found(model_id)
        model = catalog.models.get(model_id)
        if model is None:
            route = catalog.routes.get(model_id)
            if route is None:
                raise _model_not_found(model_id)
            record.resolved = True
            prepared = prepare(body, endpoint, None, catalog.long_context_threshold_tokens)
            # Admitted like a group (its capacity, the principal's caps and share); its
            # outcomes are not reported: a route has no health.
            async with await self.scheduler.admit(
                route_group(model_id),
                principal=share,
                submitted_at=self.relay.arrival(request.headers),
            ) as admitted:
                record.queue_wait = admitted.queue_wait
                record.node, record.provider = route.node_id, route.adapter
                call = UpstreamCall(
                    endpoint,
                    prepared.body,
                    route.target,
                    prepared.stream,
                    upstream_headers,
                    record.request_id,
                    model_id,
                    prepared.estimated_input_tokens,
                )
                answer = await self._execute(
                    request, record, self.adapters.route(route.node_id, route.adapter), call
                )
            assert not isinstance(answer, _Failed)  # only an attempt with a lease fails over
            return answer

        record.resolved = True
        prepared = prepare(body, endpoint, model, catalog.long_context_threshold_tokens)
        group = _group_for(model, endpoint, body)
        lease: Lease | None = await self.scheduler.admit(
            group,
            long_context=prepared.long_context,
            principal=share,
            submitted_at=self.relay.arrival(request.headers),
        )
        assert lease is not None
        record.queue_wait = lease.queue_wait
        try:
            while True:
                record.node, record.provider = lease.node_id, lease.provider_id
                # The scheduler and the catalog are swapped together: the current catalog
                # knows the provider the lease names, even if a refresh happened while we
                # queued.
                catalog = self.catalog
                current = catalog.models.get(model.id, model)
                target = current.targets.get(lease.provider_id) or model.targets[lease.provider_id]
                call = UpstreamCall(
                    endpoint,
                    prepared.body,
                    target,
                    prepared.stream,
                    upstream_headers,
                    record.request_id,
                    model_id,
                    prepared.estimated_input_tokens,
                    # the provider's live stream bounds, as the current catalog has them
                    catalog.stream_bounds.get(lease.provider_id) if prepared.stream else None,
                )
                executor = self.adapters.provider(lease.node_id, lease.provider_id)
                attempt = await self._execute(request, record, executor, call, lease)
                if not isinstance(attempt, _Failed):
                    return attempt
                failed, lease = lease, None  # released by failover(), whatever it returns
                # Recorded as soon as the request re-enters admission (before the wait): a
                # retry that times out in the queue, or whose client leaves, still counts.
                retried = functools.partial(
                    record.failed_over,
                    attempt.failure.kind,
                    _failure_code(attempt.error),
                    self.clock.now(),
                )
                lease = await self.scheduler.failover(failed, attempt.failure, retried=retried)
                if lease is None:  # no retry (or none left): this attempt's error is the answer
                    if isinstance(attempt.error, AdapterError):
                        raise attempt.error
                    return self._reply(record, attempt.error)
        finally:
            if lease is not None:
                lease.release()

    async def _execute(
        self,
        request: web.Request,
        record: RequestRecord,
        executor: Executor,
        call: UpstreamCall,
        lease: Lease | None = None,
    ) -> web.StreamResponse | _Failed:
        """One attempt. With a ``lease`` (a ``models[]`` group), a failure before the client's
        first byte comes back as :class:`_Failed` and every outcome is told to the lease;
        without (a model route), failures are answered as they are."""
        record.attempts += 1
        record.attempt_started = self.clock.now()
        try:
            if not call.stream:
                return self._answer(record, await executor.complete(call), lease)
            opened = await executor.open_stream(call)
            # The first frame comes before the response head: a stream that fails before it
            # (first_token_timeout_ms) has sent the client nothing, and may fail over.
            first = b"" if isinstance(opened, UpstreamReply) else await opened.first()
        except AdapterError as exc:
            if lease is not None and exc.failure is not None:
                failure = Failure(exc.failure, str(exc))
                if exc.failover:
                    return _Failed(failure, exc)
                lease.failed(failure)
            raise
        if isinstance(opened, UpstreamReply):
            return self._answer(record, opened, lease)
        return await self._relay(request, record, opened, first, lease)

    def _answer(
        self, record: RequestRecord, reply: UpstreamReply, lease: Lease | None
    ) -> web.Response | _Failed:
        if lease is not None:
            if reply.status in _FAILOVER_STATUSES:
                reason = reply.detail or f"the upstream answered HTTP {reply.status}"
                failure = (
                    Failure("status_429", reason, reply.retry_after)
                    if reply.status == 429
                    else Failure("status_5xx", reason)
                )
                return _Failed(failure, reply)
            lease.succeeded()
        return self._reply(record, reply)

    def _reply(self, record: RequestRecord, reply: UpstreamReply) -> web.Response:
        record.status, record.usage = reply.status, reply.usage
        if reply.status >= 400:
            # An upstream's 4xx (but 429) refused the request, it did not fail: client_error,
            # as the per-provider metrics name it.
            refused = reply.status < 500 and reply.status != 429
            record.code = "client_error" if refused else "upstream_error"
            record.upstream_failure = f"http_{reply.status}"
            record.error = reply.detail  # what the upstream said: the log's, not the client's
        else:
            record.time_to_first_token = self.clock.now() - record.started
        headers = _ids(record)
        if reply.retry_after is not None:
            # The upstream's 429 reaches the client with its Retry-After (whole seconds).
            headers["Retry-After"] = str(math.ceil(reply.retry_after))
        return web.Response(
            body=reply.body, status=reply.status, content_type=_JSON, headers=headers
        )

    async def _relay(
        self,
        request: web.Request,
        record: RequestRecord,
        stream: UpstreamStream,
        first: bytes,
        lease: Lease | None,
    ) -> web.StreamResponse:
        # A client that stops reading would hold the slot forever, the handler waiting in
        # write(). The connection's guard cancels this task when the client has taken no data
        # for openai.write_timeout_ms (a timer armed only once a write has to wait), and the
        # exchange's request_timeout_ms cancels it too when it runs out first.
        guard = ConnectionGuard.of(request)
        stalled: str | None = None
        async with stream:
            response = web.StreamResponse(
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
                await response.prepare(request)
                record.status = 200
                try:
                    record.time_to_first_token = self.clock.now() - record.started
                    if first:
                        await response.write(first)
                    async for frame in stream.frames:
                        await response.write(frame)
                    if lease is not None:
                        lease.succeeded()
                except AdapterError as exc:
                    # Headers are gone: the failure travels in the stream, as OpenAI sends it
                    # (no failover now; the provider's health still hears of it).
                    if lease is not None and exc.failure is not None:
                        lease.failed(Failure(exc.failure, str(exc)))
                    record.code, record.error = exc.code, str(exc)
                    record.upstream_failure = exc.code
                    message = client_message(exc, record.provider)
                    error = envelope(message, exc.code, status=exc.status)
                    await response.write(b"data: " + error + b"\n\n")
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

    def _finish(self, record: RequestRecord, **shown: object) -> None:
        """Log the request's line (``shown``: fields of its own, after ``endpoint``) and tell
        every observer (the metrics)."""
        self.write_request_line({"endpoint": record.endpoint, **shown, **record.log_fields()})
        for observe in self.observers:
            observe(record)


def _group_for(model: ModelEntry, endpoint: Endpoint, body: Mapping[str, object]) -> str:
    """The scheduler group a request of ``model`` is admitted into: the providers that serve
    ``endpoint`` (``completions``: ``openai_compat``; ``embeddings``: ``openai_compat`` and
    ``ollama``) and honour every field of ``body`` (see :mod:`iop_edge.adapters.fields`).
    Raises a 400 naming the model when no provider of it serves the endpoint, or naming the
    field when none honours it. A group of ``openai_compat`` providers only costs no check."""
    if endpoint == "completions":
        if not model.serves_completions:
            raise _unsupported_endpoint(model, endpoint, "it has no openai_compat provider")
        return completions_group(model.id)
    if endpoint == "embeddings":
        if not model.serves_embeddings:
            raise _unsupported_endpoint(
                model, endpoint, "its providers are all cli, which cannot embed"
            )
        group, kinds = embeddings_group(model.id), model.kinds & EMBEDDING_TYPES
    else:
        group, kinds = model.id, model.kinds
    if not model.normalized:
        return group
    refused: dict[str, tuple[str, str]] = {}
    for kind in kinds:
        found = refusal(kind, endpoint, body)
        if found is not None:
            refused[kind] = found
    if not refused:
        return group
    capable = kinds - refused.keys()
    if capable:
        return capable_group(model.id, capable)
    field = (refused.get("ollama") or refused["cli"])[0]
    reasons = "; ".join(f"its {kind} providers: '{f}': {why}" for kind, (f, why) in refused.items())
    raise RequestError(
        "unsupported_parameter",
        f"No provider of the model '{model.id}' can honour this request ({reasons}). Leave the "
        "field out, or use a model with an openai_compat provider.",
        param=field,
    )


def _unsupported_endpoint(model: ModelEntry, endpoint: Endpoint, why: str) -> RequestError:
    other = "/v1/chat/completions" if endpoint != "chat/completions" else "another endpoint"
    return RequestError(
        "unsupported_endpoint",
        f"The model '{model.id}' does not serve /v1/{endpoint}: {why}. Use {other}, or a "
        "model with a provider that serves it.",
        param="model",
    )


def _failure_code(error: AdapterError | UpstreamReply) -> str:
    """How an attempt failed, as the upstream-errors metric names it."""
    return error.code if isinstance(error, AdapterError) else f"http_{error.status}"


def _request_id(request: web.Request) -> str:
    given = request.headers.get("x-request-id")
    if given is not None and _REQUEST_ID_RE.match(given):
        return given
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


def _ids(record: RequestRecord) -> dict[str, str]:
    headers = {"x-request-id": record.request_id}
    if record.provider:
        headers["x-iop-provider"] = record.provider
    return headers


def _model_not_found(model_id: str) -> RequestError:
    return RequestError(
        "model_not_found",
        f"The model '{model_id}' does not exist on this edge; GET /v1/models lists the models.",
        status=404,
        param="model",
    )


def _error_response(
    exc: IopEdgeError, request_id: str, provider: str | None = None
) -> web.Response:
    status, code, param = describe(exc)
    headers = {"x-request-id": request_id, **error_headers(code)}
    if isinstance(exc, AdmissionError) and exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    if provider:
        headers["x-iop-provider"] = provider
    return web.Response(
        body=envelope(client_message(exc, provider), code, status=status, param=param),
        status=status,
        content_type=_JSON,
        headers=headers,
    )

"""The HTTP surfaces' application (aiohttp): routes, the small endpoints, the catalog swap.

``POST /v1/chat/completions``, ``POST /v1/completions`` and ``POST /v1/embeddings`` are the
OpenAI surface (:mod:`iop_edge.api.chat`), ``POST /v1/messages`` Anthropic's
(:mod:`iop_edge.api.messages`), each served by the one request path
(:mod:`iop_edge.api.request_path`); ``POST /v1/messages/count_tokens`` counts without a slot
(:mod:`iop_edge.api.count_tokens`). A new surface adds its module beside ``chat.py`` and its
routes here. ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /healthz`` and ``GET /readyz``
answer from the current catalog; the two models routes answer in Anthropic's shapes (and their
errors in Anthropic's envelope) when the request carries ``anthropic-version``, as Anthropic's
clients always do (:mod:`iop_edge.api.model_list`). Any other path or method answers 404
``unknown_url`` / 405 ``method_not_allowed`` (with ``Allow``) in the OpenAI envelope, logged and
counted like a request (model ``(unknown)``).

After a handover (``iop-edge restart``) this process relays the requests it can no longer admit
to the one that took over, and the one that took over keeps a relayed request's place in its
queue (its arrival, from ``X-IOP-Handover``).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final

from aiohttp import web

from iop_edge.adapters.registry import NodeAdapters
from iop_edge.admission import AdmissionScheduler
from iop_edge.api.catalog import Catalog, LoadTimes, build_catalog, model_not_found
from iop_edge.api.chat import CHAT_ROUTES
from iop_edge.api.count_tokens import TokenCounter
from iop_edge.api.errors import describe
from iop_edge.api.guard import Cors, install_log_scrubber
from iop_edge.api.messages import MESSAGES_SURFACE
from iop_edge.api.model_list import ANTHROPIC_DEFAULT_LIMIT, ANTHROPIC_MAX_LIMIT
from iop_edge.api.record import RequestObserver, RequestRecord
from iop_edge.api.request_path import RequestPath, error_response
from iop_edge.api.request_path import request_id as _request_id
from iop_edge.api.responses import ResponsesSurface, deleted_body, owner_of, stored_body
from iop_edge.api.responses_store import ResponsesStore
from iop_edge.config.schema import EdgeConfig
from iop_edge.envelope import envelope
from iop_edge.errors import IopEdgeError, RequestError
from iop_edge.runtime.lifecycle import Lifecycle, Phase
from iop_edge.runtime.logs import Logger, RequestLineWriter
from iop_edge.seams import Clock

if TYPE_CHECKING:
    from iop_edge.handover.relay import HandoverRelay

_JSON: Final = "application/json"
#: The header every Anthropic client sends: the models routes answer in Anthropic's shapes.
ANTHROPIC_VERSION: Final = "anthropic-version"

#: the phases this process serves in itself (ready for /readyz, unless it handed over)
_SERVING_PHASES: Final = frozenset({Phase.READY, Phase.HANDING_OVER})


class OpenAIServer(RequestPath):
    """The OpenAI surface's application on the request path, and the handover's part of it.
    :meth:`swap_catalog` replaces the catalog atomically on a refresh."""

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
        super().__init__(
            config,
            build_catalog(config, created=self.load_times),
            scheduler,
            adapters,
            clock=clock,
            logger=logger,
            write_request_line=write_request_line,
            observers=observers,
            relay=relay,
        )
        #: the process's phase, read here, moved by the daemon
        self.lifecycle = lifecycle
        limits = config.openai.responses_store
        #: the stored responses of /v1/responses (in memory: a restart starts it empty)
        self.responses_store = ResponsesStore(
            max_items=limits.max_items,
            max_bytes=limits.max_bytes,
            ttl=limits.ttl_ms / 1000,
            clock=clock,
        )
        self._responses = ResponsesSurface(lambda: self.responses_store)
        #: the routes build_app added (what a 405's Allow is computed from)
        self._known: tuple[web.AbstractResource, ...] = ()

    @property
    def ready(self) -> bool:
        """Whether ``/readyz`` says ready: in the phase ``ready``, and while handing over
        until the leases went to the new process (:mod:`iop_edge.runtime.lifecycle`)."""
        return self.lifecycle.phase in _SERVING_PHASES and not self.relay.handed_over

    def swap_catalog(self, catalog: Catalog) -> None:
        """Serve new requests from ``catalog`` (requests in flight keep the one they started
        with for their policy; their upstream target is read after admission), and bound the
        stored responses by its limits (shrinking the store at once if they are lower)."""
        self.catalog = catalog
        max_items, max_bytes, ttl_ms = catalog.responses_store
        self.responses_store.reconfigure(
            max_items=max_items, max_bytes=max_bytes, ttl=ttl_ms / 1000
        )

    def build_app(self) -> web.Application:
        """The aiohttp application (body limit: ``openai.max_body_bytes``). With
        ``openai.allowed_origins`` it also answers CORS for those origins (preflights, and
        ``Access-Control-Allow-Origin`` on answers); without, none of that code runs."""
        install_log_scrubber()
        app = web.Application(client_max_size=self.max_body_bytes)
        for path, surface in CHAT_ROUTES:
            app.router.add_post(path, functools.partial(self._serve, surface=surface))
        app.router.add_post(
            "/v1/messages", functools.partial(self._serve, surface=MESSAGES_SURFACE)
        )
        app.router.add_post("/v1/messages/count_tokens", TokenCounter(self).serve)
        app.router.add_post(
            "/v1/responses", functools.partial(self._serve, surface=self._responses)
        )
        app.router.add_get("/v1/responses/{response_id}", self.get_response)
        app.router.add_delete("/v1/responses/{response_id}", self.delete_response)
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
            record.principal = self.auth.authenticate_headers(request.headers)
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
                "/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/messages, "
                "/v1/messages/count_tokens and /v1/responses, GET /v1/models and GET or DELETE "
                "/v1/responses/{id}."
            )
        record.error = message
        record.duration = self.clock.now() - record.started
        self.finish(record, endpoint=None, method=method[:16], path=shown)
        return web.Response(
            body=envelope(message, record.code, status=record.status),
            status=record.status,
            content_type=_JSON,
            headers=headers,
        )

    async def get_response(self, request: web.Request) -> web.Response:
        """``GET /v1/responses/{id}``: a response this principal stored (404 otherwise)."""
        return await self._stored(request, "responses.get", stored_body)

    async def delete_response(self, request: web.Request) -> web.Response:
        """``DELETE /v1/responses/{id}``: forget a response this principal stored."""
        return await self._stored(request, "responses.delete", deleted_body)

    async def _stored(
        self,
        request: web.Request,
        endpoint: str,
        answer: Callable[[ResponsesStore | None, str, str], bytes],
    ) -> web.Response:
        """A request on a stored response: authenticated, answered from the store, with its
        request line (endpoint ``responses.get`` / ``responses.delete``)."""
        record = RequestRecord(_request_id(request), endpoint, self.clock.now())
        try:
            self.guard.check(request.headers)
            record.principal = self.auth.authenticate_headers(request.headers)
            body = answer(
                self.responses_store, request.match_info["response_id"], owner_of(record.principal)
            )
            record.status = 200
            return web.Response(
                body=body, content_type=_JSON, headers={"x-request-id": record.request_id}
            )
        except IopEdgeError as exc:
            record.status, record.code, _ = describe(exc)
            record.error = str(exc)
            return error_response(exc, record.request_id, render=envelope)
        finally:
            record.duration = self.clock.now() - record.started
            self.finish(record)

    async def list_models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``: every model group, alias and model route the caller may use; in
        Anthropic's list shape, one page of it (``limit``, ``after_id``, ``before_id``), when
        the request carries ``anthropic-version``. A refusal (401, 403) is logged and counted
        like any request (model ``(unknown)``); an answer is not (a listing is no use of a
        model)."""
        rid = _request_id(request)
        anthropic = ANTHROPIC_VERSION in request.headers
        try:
            self.guard.check(request.headers)
            principal = self.auth.authenticate_headers(request.headers)
        except IopEdgeError as exc:
            return self._refused(request, exc, rid, anthropic=anthropic)
        catalog = self.catalog
        ref = catalog.share_of(principal.principal_ref, principal.token_ref)
        if not anthropic:
            body = catalog.models_body_for(ref)
        else:
            query = request.query
            try:
                body = catalog.anthropic_page(
                    ref,
                    limit=_page_limit(query.get("limit")),
                    after_id=query.get("after_id"),
                    before_id=query.get("before_id"),
                )
            except IopEdgeError as exc:
                return _error_answer(exc, rid, anthropic=True)
        return web.Response(body=body, content_type=_JSON, headers={"x-request-id": rid})

    async def get_model(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{id}``: OpenAI's model object, or Anthropic's ``ModelInfo`` with
        ``anthropic-version`` (a refusal logged and counted as for ``GET /v1/models``)."""
        rid = _request_id(request)
        model_id = request.match_info["model_id"]
        anthropic = ANTHROPIC_VERSION in request.headers
        try:
            self.guard.check(request.headers)
            principal = self.auth.authenticate_headers(request.headers)
        except IopEdgeError as exc:
            return self._refused(request, exc, rid, anthropic=anthropic)
        try:
            catalog = self.catalog
            ref = catalog.share_of(principal.principal_ref, principal.token_ref)
            body = (
                catalog.model_body(model_id, anthropic=anthropic)
                if catalog.permits(ref, model_id)
                else None
            )
            if body is None:
                raise model_not_found(model_id)
        except IopEdgeError as exc:
            return _error_answer(exc, rid, anthropic=anthropic)
        return web.Response(body=body, content_type=_JSON, headers={"x-request-id": rid})

    def _refused(
        self, request: web.Request, exc: IopEdgeError, rid: str, *, anthropic: bool
    ) -> web.Response:
        """A models request refused before it was authenticated: its error answer, with its
        request line and count (model ``(unknown)``), as for the other endpoints."""
        record = RequestRecord(rid, "models", self.clock.now())
        record.status, record.code, _ = describe(exc)
        record.error = str(exc)
        self.finish(record, method=request.method, path=request.path[:200])
        record.status = (
            MESSAGES_SURFACE.error_status(record.code, record.status)
            if anthropic
            else record.status
        )
        return _error_answer(exc, rid, anthropic=anthropic)


def _error_answer(exc: IopEdgeError, rid: str, *, anthropic: bool) -> web.Response:
    """The error answer of a models route: Anthropic's error object and status for a client
    that sent ``anthropic-version``, else the OpenAI envelope."""
    if anthropic:
        return error_response(
            exc,
            rid,
            render=MESSAGES_SURFACE.render_error,
            status_of=MESSAGES_SURFACE.error_status,
        )
    return error_response(exc, rid, render=envelope)


def _page_limit(value: str | None) -> int:
    """Anthropic's ``limit`` query parameter: an integer from 1 to 1000, 20 when absent."""
    if value is None:
        return ANTHROPIC_DEFAULT_LIMIT
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= ANTHROPIC_MAX_LIMIT:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise RequestError(
            "invalid_request_error",
            f"The limit {shown!r} is not an integer from 1 to {ANTHROPIC_MAX_LIMIT}.",
            param="limit",
        )
    return int(value)

"""One request between its parse and its answer: what each of its attempts is built from.

The request path (:mod:`iop_edge.api.request_path`) parses a request, resolves its model and
applies the generation policy once; then each attempt — the first, and one on another provider
after a failover — asks the :class:`Exchange` for its call and its renderer. The call of the
internal form is built once; a failover derives the next one from it (the provider's target and
stream bounds). An attempt on a provider that speaks the surface's API natively
(``native_apis``) sends the client's own body (built once, when first needed) with the surface's
forwarded headers, and renders with the surface's passthrough renderer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from iop_edge.adapters.base import Endpoint, Executor, StreamBounds, UpstreamCall
from iop_edge.api.bodies import PreparedRequest
from iop_edge.api.catalog import ModelEntry, RouteEntry
from iop_edge.api.keepalive import Keepalive
from iop_edge.api.surface import Renderer, SurfaceRequest

__all__ = ["Exchange"]


class Exchange:
    """One request between its parse and its answer: what every attempt is built from. The
    :class:`~iop_edge.adapters.base.UpstreamCall` of the internal form is built once, for the
    first attempt in that form; an attempt on another provider derives its call from it (its
    target and stream bounds), and an attempt on a provider that speaks the surface's API
    natively sends the client's own body (built once, when first needed)."""

    __slots__ = (
        "_call",
        "_endpoint",
        "_headers",
        "_model_id",
        "_native",
        "_request_id",
        "keepalive",
        "model",
        "parsed",
        "prepared",
        "route",
    )

    def __init__(
        self,
        parsed: SurfaceRequest,
        endpoint: Endpoint,
        prepared: PreparedRequest,
        model: ModelEntry | None,
        route: RouteEntry | None,
        headers: Mapping[str, str],
        request_id: str,
        model_id: str,
    ) -> None:
        self.parsed = parsed
        self._endpoint = endpoint
        self.prepared = prepared
        self.model = model
        self.route = route
        self._headers = headers
        self._request_id = request_id
        self._model_id = model_id
        self._call: UpstreamCall | None = None
        self._native: UpstreamCall | None = None
        self.keepalive: Keepalive | None = None

    def attempt(
        self, executor: Executor, target: str, bounds: StreamBounds | None
    ) -> tuple[UpstreamCall, Renderer]:
        """The call and the renderer of an attempt on ``executor``."""
        parsed, prepared = self.parsed, self.prepared
        api = parsed.native_api
        native = api is not None and api in executor.native_apis
        if not native and parsed.refusal is not None:
            raise parsed.refusal  # (only a provider that speaks the API could take it)
        call = self._native if native else self._call
        if call is None:
            call = UpstreamCall(
                api if native else self._endpoint,  # type: ignore[arg-type]
                parsed.native_body(prepared.body) if native else prepared.body,
                target,
                prepared.stream,
                {**self._headers, **parsed.native_headers()} if native else self._headers,
                self._request_id,
                self._model_id,
                prepared.estimated_input_tokens,
                bounds,
            )
            if native:
                self._native = call
            else:
                self._call = call
        elif call.target != target or call.bounds != bounds:
            call = dataclasses.replace(call, target=target, bounds=bounds)
        renderer = parsed.renderer(
            native=native, estimated_input_tokens=prepared.estimated_input_tokens
        )
        return call, renderer

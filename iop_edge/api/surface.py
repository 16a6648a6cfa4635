"""The seam between an API surface and the request path: what a surface must do, nothing more.

A surface is one family of client endpoints with its own request and answer formats:
:mod:`iop_edge.api.chat` (OpenAI's ``/v1/chat/completions``, ``/v1/completions`` and
``/v1/embeddings``) and :mod:`iop_edge.api.messages` (Anthropic's ``/v1/messages``). It reads
its request body into a :class:`SurfaceRequest` whose ``body`` is the **internal form** — an
OpenAI request body of one :data:`~iop_edge.adapters.base.Endpoint`, which is what every
adapter takes — and, per attempt, gives the :class:`Renderer` that writes that attempt's
answers (OpenAI JSON and SSE frames, or an upstream's own) back in its own format.
Everything between — authentication, the model and its allow-list, the generation policy,
admission, failover, the lease, the request line and the metrics — is the request path's
(:mod:`iop_edge.api.request_path`), the same for every surface: it never asks which surface it
serves.

**Passthrough.** A surface whose API some upstreams speak natively names it
(:attr:`SurfaceRequest.native_api`, e.g. ``"messages"``); on a provider that declares that API
(``native_apis``), the attempt sends :meth:`SurfaceRequest.native_body` to the adapter's
endpoint of that name instead of the internal form, and renders with the passthrough renderer.
A body the surface cannot put in the internal form (an Anthropic server tool, say) but that
such a provider can take is kept with its refusal (:attr:`SurfaceRequest.refusal`): it is
served when its model has a provider that speaks the API, and refused as the translation said
otherwise — or when admission gives it a provider that does not.

**Keep-alive.** A streamed request of a surface that has a keep-alive event
(:attr:`SurfaceRequest.keepalive`, Anthropic's ``ping``) that waits — in the queue, for an
upstream's answer, for its first token — gets the stream's head and that event at an interval
(:mod:`iop_edge.api.keepalive`), so that proxies and clients do not time out a request that is
only waiting.

A new surface (OpenAI Responses) is a module beside ``chat.py`` with a class implementing
:class:`Surface`, routed in :meth:`iop_edge.api.server.OpenAIServer.build_app`. A surface whose
format is the internal one renders by returning what it is given, so chat pays nothing for the
seam beyond a method call per answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from iop_edge.adapters.base import Endpoint, UpstreamReply
    from iop_edge.api.auth import Principal
    from iop_edge.errors import RequestError

__all__ = ["Renderer", "Surface", "SurfaceRequest"]


class Renderer(Protocol):
    """How one attempt's answer reaches the client, in the surface's format."""

    def render_reply(self, reply: UpstreamReply) -> bytes:
        """The client's body for a non-streamed answer, or for an upstream's own error status
        (``reply.body`` is then the adapter's error body: an OpenAI error envelope for the
        internal form, the upstream's own body on passthrough)."""
        ...

    def render_stream(
        self, first: bytes, frames: AsyncIterator[bytes]
    ) -> tuple[bytes, AsyncIterator[bytes]]:
        """The client's stream from the upstream's: its first write (``first`` is the
        upstream's first frame, ``b""`` for a stream without any) and the writes after it.
        An :class:`~iop_edge.errors.AdapterError` raised by ``frames`` must propagate: the
        request path renders it with :meth:`render_stream_error`."""
        ...

    def render_stream_error(self, message: str, code: str, status: int) -> bytes:
        """The last write of a stream that failed after it started (the status line is gone:
        the failure travels in the stream)."""
        ...

    def render_stream_reply(self, reply: UpstreamReply) -> bytes:
        """The last write of a stream whose head went out (keep-alive) and whose upstream then
        answered an error status: that error, as the stream's last event."""
        ...

    def stream_finished(self, final_response: Callable[[], bytes | None]) -> None:
        """The stream was relayed whole (``final_response()``: the last Response a passthrough
        upstream of the Responses API sent, else ``None``; encoded when called, so a renderer
        that keeps nothing never pays for it)."""
        ...


class SurfaceRequest(Protocol):
    """One request of a surface, parsed."""

    @property
    def body(self) -> dict[str, Any]:
        """The request in the internal form, with a non-empty string ``model`` and a boolean
        (or absent) ``stream``; the request path applies the generation policy to it."""
        ...

    @property
    def native_api(self) -> str | None:
        """The API a provider may serve this request in natively (its ``native_apis``), or
        ``None``."""
        ...

    @property
    def keepalive(self) -> bytes | None:
        """The event a waiting stream sends at an interval, or ``None`` (none is sent)."""
        ...

    @property
    def refusal(self) -> RequestError | None:
        """Why the request cannot be put in the internal form (``None``: it is): then only a
        provider that speaks :attr:`native_api` can take it, and :attr:`body` stands for it
        only to be admitted (its model, stream, token limit and size)."""
        ...

    def native_body(self, policy: Mapping[str, Any]) -> dict[str, Any]:
        """The body to send a provider that speaks :attr:`native_api`: the client's, with the
        generation policy that :attr:`body` received (``policy`` is that body, after it)."""
        ...

    def native_headers(self) -> Mapping[str, str]:
        """The client's headers that go to a provider that speaks :attr:`native_api` (its
        API's version and feature flags; never a credential)."""
        ...

    def renderer(self, *, native: bool, estimated_input_tokens: int) -> Renderer:
        """The renderer of one attempt: of the internal form's answers, or (``native``) of the
        upstream's own. ``estimated_input_tokens`` is the edge's estimate of the request."""
        ...


class Surface(Protocol):
    """One API surface: parse into the internal form, render from it."""

    @property
    def name(self) -> str:
        """The surface's endpoint as the request line and the metrics name it."""
        ...

    @property
    def endpoint(self) -> Endpoint:
        """The internal endpoint its requests become (what the adapters are asked to serve)."""
        ...

    def parse(
        self, raw: bytes, headers: Mapping[str, str], principal: Principal | None
    ) -> SurfaceRequest:
        """The request ``raw`` (with its HTTP ``headers``, from ``principal``: ``None`` on an
        edge without tokens). Raises :class:`~iop_edge.errors.RequestError` (400, ``param``
        naming the field) for a body the surface does not accept."""
        ...

    def render_error(
        self, message: str, code: str | None, *, status: int, param: str | None = None
    ) -> bytes:
        """The body of an error answer of ``status`` (the surface's error envelope)."""
        ...

    def error_status(self, code: str | None, status: int) -> int:
        """The HTTP status the surface answers the edge's error ``code`` with (``status``: the
        edge's own, :mod:`iop_edge.api.errors`)."""
        ...

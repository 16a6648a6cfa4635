"""The seam between an API surface and the request path: what a surface must do, nothing more.

A surface is one family of client endpoints with its own request and answer formats:
:mod:`iop_edge.api.chat` (OpenAI's ``/v1/chat/completions``, ``/v1/completions`` and
``/v1/embeddings``) is the first. It reads its request body into the **internal form** — an
OpenAI request body of one :data:`~iop_edge.adapters.base.Endpoint`, which is what every
adapter takes — and writes the internal form's answers (OpenAI JSON, OpenAI SSE frames, the
OpenAI error envelope) back in its own format. Everything between — authentication, the model
and its allow-list, the generation policy, admission, failover, the lease, the request line
and the metrics — is the request path's (:mod:`iop_edge.api.request_path`), the same for
every surface: it never asks which surface it serves.

A new surface (Anthropic Messages, OpenAI Responses) is a module beside ``chat.py`` with a
class implementing :class:`Surface`, routed in :meth:`iop_edge.api.server.OpenAIServer.build_app`.
A surface whose format is the internal one renders by returning what it is given, so chat pays
nothing for the seam beyond a method call per answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from iop_edge.adapters.base import Endpoint, UpstreamReply

__all__ = ["Surface"]


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

    def parse(self, raw: bytes) -> dict[str, Any]:
        """The request ``raw`` in the internal form, with a non-empty string ``model`` and a
        boolean (or absent) ``stream``. Raises :class:`~iop_edge.errors.RequestError` (400,
        ``param`` naming the field) for a body the surface does not accept."""
        ...

    def render_reply(self, reply: UpstreamReply) -> bytes:
        """The client's body for a non-streamed answer, or for an upstream's own error status
        (``reply.body`` is then an OpenAI error envelope)."""
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

    def render_error(
        self, message: str, code: str | None, *, status: int, param: str | None = None
    ) -> bytes:
        """The body of an error answer of ``status`` (the surface's error envelope)."""
        ...

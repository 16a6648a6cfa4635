"""The OpenAI surface: ``POST /v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings``.

The first :class:`~iop_edge.api.surface.Surface`, and the one whose format is the internal
form: :func:`parse_body` checks the fields the edge relies on and passes every other field
untouched (the normalized adapters refuse what they cannot honour), and answers go out as the
adapters make them — OpenAI JSON, OpenAI SSE frames, the OpenAI error envelope
(:func:`iop_edge.envelope.envelope`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final

from iop_edge.adapters.base import Endpoint, UpstreamReply
from iop_edge.api.auth import Principal
from iop_edge.api.bodies import MAX_TOKEN_FIELDS, THINKING_FIELD, decode_json_object
from iop_edge.envelope import envelope
from iop_edge.errors import RequestError

__all__ = ["CHAT_ROUTES", "ChatRenderer", "ChatRequest", "ChatSurface", "parse_body"]


class ChatRenderer:
    """The OpenAI surface's answers: the adapters' own (see
    :class:`~iop_edge.api.surface.Renderer`). Stateless: one serves every request."""

    __slots__ = ()

    def render_reply(self, reply: UpstreamReply) -> bytes:
        """The adapter's OpenAI body, as it is."""
        return reply.body

    def render_stream(
        self, first: bytes, frames: AsyncIterator[bytes]
    ) -> tuple[bytes, AsyncIterator[bytes]]:
        """The adapter's OpenAI SSE frames, as they are."""
        return first, frames

    def render_stream_error(self, message: str, code: str, status: int) -> bytes:
        """A final ``data: {"error": ...}`` event, as OpenAI sends one (no ``[DONE]``)."""
        return b"data: " + envelope(message, code, status=status) + b"\n\n"

    def render_stream_reply(self, reply: UpstreamReply) -> bytes:
        """Never called: an OpenAI stream sends no keep-alive, so its head waits for the
        upstream's first frame; given for the protocol, as a final error event."""
        return b"data: " + reply.body + b"\n\n"

    def stream_finished(self, final_response: Callable[[], bytes | None]) -> None:
        """Nothing to do at the end of the stream."""


_RENDERER: Final = ChatRenderer()


class ChatRequest:
    """A parsed request of the OpenAI surface (see :class:`~iop_edge.api.surface.SurfaceRequest`):
    its body is the internal form already; no upstream speaks it other than as it is."""

    __slots__ = ("body",)

    native_api: Final = None
    keepalive: Final = None
    refusal: Final = None

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def native_body(self, policy: Mapping[str, Any]) -> dict[str, Any]:
        """The body after the policy (no other form exists)."""
        return dict(policy)

    def native_headers(self) -> Mapping[str, str]:
        """None: the internal form has no headers of its own."""
        return {}

    def renderer(self, *, native: bool, estimated_input_tokens: int) -> ChatRenderer:
        """The one :class:`ChatRenderer`."""
        return _RENDERER


class ChatSurface:
    """One endpoint of the OpenAI surface (see :class:`~iop_edge.api.surface.Surface`)."""

    __slots__ = ("endpoint", "name")

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint: Final[Endpoint] = endpoint
        self.name: Final[str] = endpoint

    def parse(
        self, raw: bytes, headers: Mapping[str, str], principal: Principal | None
    ) -> ChatRequest:
        """The body, checked (:func:`parse_body`): it is the internal form already."""
        return ChatRequest(parse_body(raw, self.endpoint))

    render_error = staticmethod(envelope)
    """The OpenAI error envelope."""

    def error_status(self, code: str | None, status: int) -> int:
        """The edge's own status (:mod:`iop_edge.api.errors`)."""
        return status

    def __repr__(self) -> str:
        return f"ChatSurface({self.endpoint!r})"


CHAT_ROUTES: Final = (
    ("/v1/chat/completions", ChatSurface("chat/completions")),
    ("/v1/completions", ChatSurface("completions")),
    ("/v1/embeddings", ChatSurface("embeddings")),
)
"""The OpenAI surface's ``POST`` paths: streaming or not (chat), served by passthrough providers
only (completions), by ``openai_compat`` and ``ollama`` providers (embeddings)."""


def _bad(message: str, param: str | None) -> RequestError:
    return RequestError("invalid_request_error", message, status=400, param=param)


def parse_body(raw: bytes, endpoint: Endpoint) -> dict[str, Any]:
    """Decode and check the fields the edge relies on; unknown fields pass through untouched."""
    body = decode_json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a non-empty string.", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise _bad(f"'stream' must be a boolean, not {stream!r}.", "stream")
    if endpoint == "chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' is required and must be a non-empty array.", "messages")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise _bad(
                    f"'messages[{index}]' must be an object with a string 'role'.",
                    f"messages[{index}]",
                )
            calls = message.get("tool_calls")
            if calls is not None and not isinstance(calls, list):
                raise _bad(
                    f"'messages[{index}].tool_calls' must be an array, not {calls!r:.40}.",
                    f"messages[{index}].tool_calls",
                )
    elif endpoint == "completions":
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list):
            raise _bad("'prompt' is required and must be a string or an array.", "prompt")
    else:
        _check_input(body.get("input"))
        return body  # (no generation fields: nothing is generated)
    for name in (*MAX_TOKEN_FIELDS, THINKING_FIELD):
        value = body.get(name)
        if value is not None and (type(value) is not int or value < 0):
            raise _bad(f"'{name}' must be a non-negative integer, not {value!r}.", name)
    return body


def _check_input(value: Any) -> None:
    """``input`` of ``/v1/embeddings``: a non-empty string, or a non-empty array of non-empty
    strings, of token ids, or of non-empty token-id arrays (OpenAI's rules)."""
    if isinstance(value, str):
        if value:
            return
    elif isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, str):
            bad = next((i for i, v in enumerate(value) if not isinstance(v, str) or not v), None)
        elif type(first) is int:
            bad = next((i for i, v in enumerate(value) if type(v) is not int), None)
        else:
            bad = next(
                (
                    i
                    for i, v in enumerate(value)
                    if not isinstance(v, list) or not v or any(type(t) is not int for t in v)
                ),
                None,
            )
        if bad is None:
            return
        raise _bad(
            f"'input[{bad}]' must be of the same kind as input[0]: a non-empty string, a token "
            f"id, or a non-empty array of token ids (not {value[bad]!r:.40}).",
            "input",
        )
    raise _bad(
        "'input' is required and must be a non-empty string or a non-empty array of strings or "
        f"token ids (not {value!r:.40}).",
        "input",
    )

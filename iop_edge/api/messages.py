"""The Anthropic Messages surface: ``POST /v1/messages`` (Claude Code, the ``anthropic`` SDK).

A request is translated into the internal form by the pure core
(:func:`iop_edge.translate.messages_request.translate_request`) and goes the one request path
(:mod:`iop_edge.api.request_path`) as a chat request would: authentication (``x-api-key`` or
``Authorization: Bearer``), the model (an id, an alias or a route) and its allow-list, the
generation policy, admission, failover before the first byte, the request line and the metrics.
Each attempt renders in one of two ways:

- **translated** (a provider that does not speak Messages: ``openai_compat`` chat, ``ollama``,
  ``cli``): the adapter's chat answer is decoded into neutral events and rendered as a Message
  or as Messages' event stream (:mod:`iop_edge.translate.messages_reply`,
  :mod:`iop_edge.translate.messages_stream`), an upstream's error status as Anthropic's error
  object with the upstream's own message;
- **passthrough** (an ``openai_compat`` provider with ``native_apis: [messages]``): the
  client's body goes upstream untouched but for ``model`` (the provider's target) and the
  generation policy (``max_tokens`` raised to ``min_max_tokens``; the group's thinking budget
  as ``thinking`` when the client sent none), with the client's ``anthropic-version`` and
  ``anthropic-beta``; the answer, the stream and an error come back as they came, but for
  ``model``.

The reasoning a client asks for (``thinking``, ``output_config.effort``) becomes the group's
reasoning fields in the internal form: a budget is ``thinking_token_budget`` (so it replaces the
group's ``default_thinking_token_budget``), ``disabled`` is a budget of 0, ``adaptive`` leaves the
group's default, and an effort is ``reasoning_effort`` (``xhigh`` and ``max``, which OpenAI's
field does not have, as ``high``).

A streamed request that waits (the queue, the upstream's first token) sends the stream's head and
``ping`` events every :data:`~iop_edge.api.keepalive.KEEPALIVE_INTERVAL` seconds
(:mod:`iop_edge.api.keepalive`). Errors are Anthropic's ``{"type": "error", "error": {...}}``
with its types and statuses (:mod:`iop_edge.translate.anthropic_errors`); a failure after the
stream started is an ``error`` event, never ``message_stop``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final

import orjson

from iop_edge.adapters.base import Endpoint, UpstreamReply
from iop_edge.api.auth import Principal
from iop_edge.api.bodies import decode_json_object
from iop_edge.api.translated import translated_frames
from iop_edge.errors import RequestError
from iop_edge.translate.anthropic_errors import (
    ANTHROPIC_ERRORS,
    anthropic_error,
    error_payload,
    upstream_error_type,
)
from iop_edge.translate.chat_events import decode_completion
from iop_edge.translate.chat_request import InternalRequest, apply_reasoning
from iop_edge.translate.messages_reply import message_body
from iop_edge.translate.messages_request import translate_request
from iop_edge.translate.messages_stream import PING, MessagesStreamTranslator
from iop_edge.translate.sse import dumps, encode_event

__all__ = [
    "FORWARDED_HEADERS",
    "MESSAGES_API",
    "MessagesRequest",
    "MessagesSurface",
    "PassthroughRenderer",
    "TranslatedRenderer",
    "untranslated",
]

#: the ``native_apis`` name of Anthropic Messages
MESSAGES_API: Final = "messages"
#: the client's headers a passthrough provider gets (never a credential)
FORWARDED_HEADERS: Final = ("anthropic-version", "anthropic-beta")


def _error_event(kind: str, message: str) -> bytes:
    return encode_event("error", error_payload(kind, message))  # type: ignore[arg-type]


def _upstream_message(reply: UpstreamReply) -> str:
    """What an upstream's error status said (the adapter's OpenAI envelope's message)."""
    try:
        parsed = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if isinstance(message, str):
        return message
    return reply.detail or f"The upstream answered HTTP {reply.status}."


class TranslatedRenderer:
    """An attempt on a provider that does not speak Messages: the adapter's chat answer as a
    Message, or as Messages' event stream (see :class:`~iop_edge.api.surface.Renderer`)."""

    __slots__ = ("_estimate", "_model", "_stops", "_translator")

    def __init__(self, model: str, estimated_input_tokens: int, stops: tuple[str, ...]) -> None:
        self._model = model
        self._estimate = estimated_input_tokens
        self._stops = stops
        self._translator: MessagesStreamTranslator | None = None

    def render_reply(self, reply: UpstreamReply) -> bytes:
        """A 200's chat completion as a Message; an error status as Anthropic's error object
        with the upstream's own message."""
        if reply.status >= 400:
            return dumps(error_payload(upstream_error_type(reply.status), _upstream_message(reply)))
        return message_body(
            decode_completion(reply.body),
            model=self._model,
            estimated_input_tokens=self._estimate,
            stop_sequences=self._stops,
        )

    def render_stream(
        self, first: bytes, frames: AsyncIterator[bytes]
    ) -> tuple[bytes, AsyncIterator[bytes]]:
        """The chat frames as Messages' events, as they come."""
        translator = self._translator = MessagesStreamTranslator(
            model=self._model, estimated_input_tokens=self._estimate, stop_sequences=self._stops
        )
        return translator.feed(first), translated_frames(translator, frames)

    def render_stream_error(self, message: str, code: str, status: int) -> bytes:
        """The ``error`` event (after whatever block is open: Anthropic leaves it open)."""
        if self._translator is None:
            return _error_event(anthropic_error(code)[0], message)
        return self._translator.fail(code, message)

    def render_stream_reply(self, reply: UpstreamReply) -> bytes:
        """An upstream's error status, after the stream's head went out: an ``error`` event."""
        return _error_event(upstream_error_type(reply.status), _upstream_message(reply))

    def stream_finished(self, final_response: Callable[[], bytes | None]) -> None:
        """Nothing to do at the end of the stream."""


class PassthroughRenderer:
    """An attempt on a provider that speaks Messages: its answer as it came (the adapter set
    ``model``). Stateless: one serves every request."""

    __slots__ = ()

    def render_reply(self, reply: UpstreamReply) -> bytes:
        """The upstream's body, its error bodies included."""
        return reply.body

    def render_stream(
        self, first: bytes, frames: AsyncIterator[bytes]
    ) -> tuple[bytes, AsyncIterator[bytes]]:
        """The upstream's events."""
        return first, frames

    def render_stream_error(self, message: str, code: str, status: int) -> bytes:
        """The edge's ``error`` event (the upstream failed without one of its own)."""
        return _error_event(anthropic_error(code)[0], message)

    def render_stream_reply(self, reply: UpstreamReply) -> bytes:
        """The upstream's error body as the data of an ``error`` event."""
        try:
            parsed = orjson.loads(reply.body)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("type") == "error":
            return b"event: error\ndata: " + reply.body.strip() + b"\n\n"
        return _error_event(upstream_error_type(reply.status), _upstream_message(reply))

    def stream_finished(self, final_response: Callable[[], bytes | None]) -> None:
        """Nothing to do at the end of the stream."""


_PASSTHROUGH: Final = PassthroughRenderer()


def untranslated(body: Mapping[str, Any], raw: bytes, refusal: RequestError) -> InternalRequest:
    """What the request path needs of a body only passthrough can take: its model, stream and
    ``max_tokens`` (each checked as the translation checks it; else ``refusal`` is raised), and
    one message of its whole text, so that it is estimated (admission, the context window) by
    its size. Never sent upstream: an attempt that would translate it raises ``refusal``."""
    model, stream, max_tokens = body.get("model"), body.get("stream"), body.get("max_tokens")
    if (
        not isinstance(model, str)
        or not model
        or not isinstance(stream, bool | None)
        or type(max_tokens) is not int
        or max_tokens < 1
    ):
        raise refusal
    chat: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": raw.decode("utf-8", "replace")}],
        "max_tokens": max_tokens,
    }
    if stream:
        chat["stream"] = True
    return InternalRequest(chat, model, bool(stream), None, (), ())


class MessagesRequest:
    """A parsed ``/v1/messages`` request (see :class:`~iop_edge.api.surface.SurfaceRequest`).
    ``refusal``: why the translation refused the body, which then only a provider that speaks
    Messages can take."""

    __slots__ = ("_headers", "_internal", "_raw", "keepalive", "refusal")

    native_api: Final = MESSAGES_API

    def __init__(
        self,
        raw: dict[str, Any],
        internal: InternalRequest,
        headers: Mapping[str, str],
        refusal: RequestError | None = None,
    ) -> None:
        self._raw = raw
        self._internal = internal
        self._headers = headers
        self.keepalive: bytes | None = PING if internal.stream else None
        self.refusal = refusal

    @property
    def body(self) -> dict[str, Any]:
        """The chat body."""
        return self._internal.chat

    def native_body(self, policy: Mapping[str, Any]) -> dict[str, Any]:
        """The client's body with the generation policy the chat body received."""
        body = dict(self._raw)
        max_tokens = policy.get("max_tokens")
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        budget = policy.get("thinking_token_budget")
        if body.get("thinking") is None and budget:
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        return body

    def native_headers(self) -> Mapping[str, str]:
        """``anthropic-version`` and ``anthropic-beta``, when the client sent them."""
        headers = self._headers
        return {name: headers[name] for name in FORWARDED_HEADERS if name in headers}

    def renderer(
        self, *, native: bool, estimated_input_tokens: int
    ) -> TranslatedRenderer | PassthroughRenderer:
        """The passthrough renderer, or a translating one for this request."""
        if native:
            return _PASSTHROUGH
        internal = self._internal
        return TranslatedRenderer(internal.model, estimated_input_tokens, internal.stop_sequences)


class MessagesSurface:
    """``POST /v1/messages`` (see :class:`~iop_edge.api.surface.Surface`)."""

    __slots__ = ()

    name: Final = "messages"
    endpoint: Final[Endpoint] = "chat/completions"

    def parse(
        self, raw: bytes, headers: Mapping[str, str], principal: Principal | None
    ) -> MessagesRequest:
        """The body translated into the internal form. A body the translation refuses (a
        server tool, a field it cannot honour) may still be passed through: it is kept with
        its refusal (:attr:`MessagesRequest.refusal`), for a provider that speaks Messages."""
        body = decode_json_object(raw)
        try:
            internal = translate_request(body)
        except RequestError as exc:
            return MessagesRequest(body, untranslated(body, raw, exc), headers, exc)
        apply_reasoning(internal.chat, internal.reasoning)
        return MessagesRequest(body, internal, headers)

    def render_error(
        self, message: str, code: str | None, *, status: int, param: str | None = None
    ) -> bytes:
        """Anthropic's error object (the type from the edge's code)."""
        kind = anthropic_error(code)[0] if code is not None else upstream_error_type(status)
        return dumps(error_payload(kind, message))

    def error_status(self, code: str | None, status: int) -> int:
        """Anthropic's status for the edge's code (529 for a saturated pool...)."""
        if code is not None and code in ANTHROPIC_ERRORS:
            return ANTHROPIC_ERRORS[code][1]
        return status

    def __repr__(self) -> str:
        return "MessagesSurface()"


MESSAGES_SURFACE: Final = MessagesSurface()

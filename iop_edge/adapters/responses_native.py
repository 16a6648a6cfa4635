"""OpenAI Responses passed through to an ``openai_compat`` upstream that serves them itself
(``native_apis: [responses]``: vLLM, llama.cpp): the ``responses`` calls of
:class:`~iop_edge.adapters.openai_compat.OpenAICompatExecutor`.

- URL: ``{base_url}/responses`` (the ``endpoint`` execution field replaces only the chat
  path). Headers as for chat: ``Content-Type``, the configured ``headers``, the call's
  (provider auth, never the client's own credentials), and ``x-request-id``.
- Body: the client's, with ``model`` set to the target and ``stream`` to the call's;
  everything else untouched (``previous_response_id``, ``store``, tools...), serialised once.
- Answer: the Response object with its top-level ``model`` set to the model the client asked
  for (:attr:`~iop_edge.adapters.base.UpstreamCall.answer_model`); the reply's ``body`` is what
  the edge keeps for ``previous_response_id``.
- Usage: the Response's ``usage``, ``input_tokens`` as ``prompt_tokens`` and
  ``output_tokens`` as ``completion_tokens``. Unlike Anthropic's, OpenAI's Responses usage
  counts cached input inside ``input_tokens`` (``input_tokens_details.cached_tokens`` is a
  part of it, and ``total_tokens`` is ``input_tokens + output_tokens``), as chat's
  ``prompt_tokens`` does; vLLM and llama.cpp report it so. So no sum is needed: the figures add
  up as a chat's do.
- Stream: the upstream's events relayed as they came, framed by the rules of
  :class:`~iop_edge.adapters.native_relay.NamedEvents` (every event keeps its
  ``sequence_number``), but for the ``model`` of the Response object in the lifecycle events
  — ``response.created``, ``response.queued``, ``response.in_progress``,
  ``response.completed``, ``response.incomplete``, ``response.failed`` —, the only events
  decoded besides ``error``: a run of output events (items, parts, text, arguments and
  reasoning deltas) is checked and relayed in one pass, never decoded; an event before the last
  whose only ``"model":`` key names the model the upstream was asked for has it replaced in the
  bytes, undecoded. Usage comes from the last event's ``response.usage``; that event's Response
  (``model`` the client's) is the stream's
  :attr:`~iop_edge.adapters.base.UpstreamStream.final_response`, encoded only when asked for
  (a response the edge stores). The stream is done
  at ``response.completed`` or ``response.incomplete``; a body that ends before one of them
  (or ``response.failed``) is an ``upstream_error``.
- An upstream ``error`` or ``response.failed`` event: relayed to the client untouched (it is
  OpenAI's shape already), then the stream fails with an ``upstream_error`` whose
  ``error_relayed`` is true: the caller writes no second failure event, and the provider's
  health hears of it.
- An upstream error status (400–599): returned with that status and the body as it came when
  it is a JSON object (OpenAI's envelope, or whatever JSON the server uses); any other body
  stays in the log, and the client gets an OpenAI error envelope naming the provider, with the
  upstream's status (:mod:`iop_edge.adapters.native_relay`).
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from iop_edge.adapters.base import UpstreamCall, UpstreamReply, UpstreamStream, Usage
from iop_edge.adapters.native_relay import (
    NamedEvents,
    native_payload,
    open_native,
    post_native,
    require_native,
)
from iop_edge.adapters.openai_format import MODEL_KEY, dumps, read_usage, with_model
from iop_edge.adapters.upstream_http import HttpBackend, HttpTarget
from iop_edge.envelope import envelope

__all__ = ["RESPONSES_ENDPOINT", "ResponsesEvents", "complete_responses", "open_responses_stream"]

RESPONSES_ENDPOINT: Final = "responses"
"""The endpoint of the ``responses`` native API (and the API's ``native_apis`` name)."""

#: The events that carry the Response object (its ``model`` the upstream's name).
_LIFECYCLE: Final = frozenset(
    {
        b"response.created",
        b"response.queued",
        b"response.in_progress",
        b"response.completed",
        b"response.incomplete",
        b"response.failed",
    }
)
#: The last event of a stream, whatever its end (a failed one fails the stream after it).
_LAST: Final = frozenset({b"response.completed", b"response.incomplete", b"response.failed"})


def _openai_error(status: int, message: str) -> bytes:
    """OpenAI's error envelope for an upstream error status whose body is not JSON."""
    return envelope(message, "upstream_error", status=status)


async def complete_responses(
    backend: HttpBackend, target: HttpTarget, call: UpstreamCall, native_apis: frozenset[str]
) -> UpstreamReply:
    """POST a ``responses`` call that is not streamed and return the upstream's Response (see
    the module docstring)."""
    require_native(call, native_apis, RESPONSES_ENDPOINT, target.label)
    url = target.url(RESPONSES_ENDPOINT)
    payload = native_payload(call, stream_field=True)
    got = await post_native(backend, target, call, url, payload, _openai_error)
    if isinstance(got, UpstreamReply):
        return got
    raw, parsed = got
    usage = Usage()
    read_usage(parsed.get("usage"), usage)
    return UpstreamReply(200, with_model(raw, parsed, call.answer_model), usage)


async def open_responses_stream(
    backend: HttpBackend, target: HttpTarget, call: UpstreamCall, native_apis: frozenset[str]
) -> UpstreamStream | UpstreamReply:
    """POST a streamed ``responses`` call; once the upstream answers 200, relay its events."""
    require_native(call, native_apis, RESPONSES_ENDPOINT, target.label)
    url = target.url(RESPONSES_ENDPOINT)
    events = ResponsesEvents(target, url, Usage(), call.answer_model, call.target)
    payload = native_payload(call, stream_field=True)
    opened = await open_native(backend, target, call, url, payload, _openai_error, events)
    if isinstance(opened, UpstreamStream):
        opened.final_response = events.final_response
    return opened


class ResponsesEvents(NamedEvents):
    """An upstream's OpenAI Responses event stream as the client's frames, with the usage and
    the final Response captured (see the module docstring). ``sent_model`` is the ``model``
    the upstream was asked for, which it names in its Responses."""

    __slots__ = ("_final", "_pairs")

    unfinished = (
        "the stream ended before event: response.completed (or response.incomplete, "
        "response.failed)"
    )
    breakers = (
        b"event: response.created",
        b"event: response.queued",
        b"event: response.in_progress",
        b"event: response.completed",
        b"event: response.incomplete",
        b"event: response.failed",
        b"event: error",
    )
    failures = frozenset({b"error", b"response.failed"})

    def __init__(
        self, target: HttpTarget, url: str, usage: Usage, model: str, sent_model: str
    ) -> None:
        super().__init__(target, url, usage, model)
        self._final: dict[str, Any] | None = None
        # the compact "model": pairs of the name the upstream was asked for and the client's
        self._pairs = (MODEL_KEY + orjson.dumps(sent_model), MODEL_KEY + orjson.dumps(model))

    def final_response(self) -> bytes | None:
        """The Response of the last event as relayed (JSON), once it has come: encoded when
        asked for (only a stored response is), not for every stream."""
        return None if self._final is None else dumps(self._final)

    def _take(self, name: bytes, payload: bytes) -> bytes:
        """A lifecycle event: its Response's ``model`` the client's; the last one's usage and
        Response captured, and the end marked."""
        if name not in _LIFECYCLE:
            return payload
        if name not in _LAST:
            renamed = self._renamed(payload)
            if renamed is not None:
                return renamed
        event = self._decode(payload)
        response = event.get("response")
        if not isinstance(response, dict):
            raise self._target.broken(self._url, f"event: {name.decode()} has no response object")
        relayed = with_model(payload, response, self._model, event)
        if name in _LAST:
            read_usage(response.get("usage"), self.usage)
            response["model"] = self._model
            self._final = response
            self.done = name != b"response.failed"
        return relayed

    def _renamed(self, payload: bytes) -> bytes | None:
        """An event before the last with its Response's model the client's, rewritten in the
        bytes without decoding them, when that is unambiguous: the event's only ``"model":``
        key has the name the upstream was asked for (a ``"model":`` inside a string would be
        escaped). Else ``None``: the event is decoded (an upstream that renames its model, a
        ``model`` in the metadata)."""
        sent, answer = self._pairs
        if payload.count(MODEL_KEY) != 1 or sent not in payload:
            return None
        return payload.replace(sent, answer)

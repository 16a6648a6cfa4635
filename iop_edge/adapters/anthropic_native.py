"""Anthropic Messages passed through to an ``openai_compat`` upstream that serves them itself
(``native_apis: [messages]``: vLLM, llama.cpp, Ollama): the ``messages`` and
``messages/count_tokens`` calls of :class:`~iop_edge.adapters.openai_compat.OpenAICompatExecutor`.

- URL: ``{base_url}/messages`` and ``{base_url}/messages/count_tokens`` (the ``endpoint``
  execution field replaces only the chat path). Headers as for chat: ``Content-Type``, the
  configured ``headers``, the call's (the request path puts ``anthropic-version``,
  ``anthropic-beta`` and provider auth there, never the client's own credentials), and
  ``x-request-id``.
- Body: the client's, with ``model`` set to the target and (``messages``) ``stream`` to the
  call's; everything else untouched, serialised once.
- Answer: a Message with its top-level ``model`` set to the model the client asked for
  (:attr:`~iop_edge.adapters.base.UpstreamCall.answer_model`), or count_tokens'
  ``{"input_tokens": N}`` as it came. Usage: :func:`read_messages_usage`.
- Stream: Anthropic's events relayed as they came, framed by the rules of
  :class:`~iop_edge.adapters.native_relay.NamedEvents`, but for the message's ``model`` in
  ``message_start``; ``ping`` is relayed. Only ``message_start``, ``message_delta`` (usage)
  and ``error`` are decoded; a run of other events is checked and relayed in one pass. The
  stream is done at ``message_stop``; a body that ends before it is an ``upstream_error``.
- An upstream ``event: error``: relayed to the client untouched, then the stream fails with an
  ``upstream_error`` whose ``error_relayed`` is true.
- An upstream error status (400–599): returned with that status and the body as it came when
  it is a JSON object (Anthropic's error, or whatever JSON the server uses); any other body
  stays in the log, and the client gets an Anthropic error object naming the provider, with
  the upstream's status (:mod:`iop_edge.adapters.native_relay`).
"""

from __future__ import annotations

from typing import Final

import orjson

from iop_edge.adapters.base import (
    UnsupportedRequestError,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    Usage,
)
from iop_edge.adapters.native_relay import (
    NamedEvents,
    native_payload,
    open_native,
    post_native,
    require_native,
)
from iop_edge.adapters.openai_format import with_model
from iop_edge.adapters.upstream_http import HttpBackend, HttpTarget

__all__ = [
    "MESSAGES_ENDPOINTS",
    "MessagesEvents",
    "complete_messages",
    "open_messages_stream",
    "read_messages_usage",
]

MESSAGES_ENDPOINTS: Final = frozenset({"messages", "messages/count_tokens"})
"""The endpoints of the ``messages`` native API."""

#: Usage fields that count input, each on its own (see :func:`read_messages_usage`).
_INPUT_FIELDS: Final = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def read_messages_usage(source: object, usage: Usage, inputs: dict[str, int]) -> None:
    """Copy the counts of an Anthropic ``usage`` object into ``usage``; ``inputs`` keeps the
    input figures seen so far (a later figure replaces an earlier one, field by field).

    ``prompt_tokens`` is the sum of ``input_tokens``, ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens``: Anthropic counts in ``input_tokens`` only what follows
    the last cache breakpoint and reports cached reads and cache writes apart, while the edge's
    ``prompt_tokens`` (metrics, the request line, a principal's usage) is every input token
    the upstream took for the request — as OpenAI's ``prompt_tokens`` includes its cached
    tokens — so the two surfaces' figures add up alike. ``completion_tokens`` is
    ``output_tokens``.
    """
    if not isinstance(source, dict):
        return
    for name in _INPUT_FIELDS:
        value = source.get(name)
        if type(value) is int:
            inputs[name] = value
    if inputs:
        usage.prompt_tokens = sum(inputs.values())
    output = source.get("output_tokens")
    if type(output) is int:
        usage.completion_tokens = output


def _anthropic_error(status: int, message: str) -> bytes:
    """Anthropic's error object for an upstream error status whose body is not JSON."""
    kind = "api_error" if status >= 500 else "invalid_request_error"
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


async def complete_messages(
    backend: HttpBackend, target: HttpTarget, call: UpstreamCall, native_apis: frozenset[str]
) -> UpstreamReply:
    """POST a ``messages`` (not streamed) or ``messages/count_tokens`` call and return the
    upstream's answer (see the module docstring)."""
    require_native(call, native_apis, "messages", target.label)
    url = target.url(call.endpoint)
    payload = native_payload(call, stream_field=call.endpoint == "messages")
    got = await post_native(backend, target, call, url, payload, _anthropic_error)
    if isinstance(got, UpstreamReply):
        return got
    raw, parsed = got
    usage = Usage()
    if call.endpoint == "messages/count_tokens":
        return UpstreamReply(200, raw, usage)
    read_messages_usage(parsed.get("usage"), usage, {})
    return UpstreamReply(200, with_model(raw, parsed, call.answer_model), usage)


async def open_messages_stream(
    backend: HttpBackend, target: HttpTarget, call: UpstreamCall, native_apis: frozenset[str]
) -> UpstreamStream | UpstreamReply:
    """POST a streamed ``messages`` call; once the upstream answers 200, relay its events."""
    require_native(call, native_apis, "messages", target.label)
    if call.endpoint != "messages":
        raise UnsupportedRequestError(f"/v1/{call.endpoint} is not streamed", param="stream")
    url = target.url(call.endpoint)
    events = MessagesEvents(target, url, Usage(), call.answer_model)
    payload = native_payload(call, stream_field=True)
    return await open_native(backend, target, call, url, payload, _anthropic_error, events)


class MessagesEvents(NamedEvents):
    """An upstream's Anthropic event stream as the client's frames, with the usage captured
    (see the module docstring)."""

    __slots__ = ("_inputs",)

    unfinished = "the stream ended before event: message_stop"
    # message_start, message_delta, message_stop (the end), error
    breakers = (b"event: message_", b"event: error")
    failures = frozenset({b"error"})

    def __init__(self, target: HttpTarget, url: str, usage: Usage, model: str) -> None:
        super().__init__(target, url, usage, model)
        self._inputs: dict[str, int] = {}

    def _take(self, name: bytes, payload: bytes) -> bytes:
        """``message_start``: the input usage captured, the message's ``model`` the client's;
        ``message_delta``: the usage; ``message_stop``: the end."""
        if name == b"message_start":
            event = self._decode(payload)
            message = event.get("message")
            if not isinstance(message, dict):
                raise self._target.broken(self._url, "message_start has no message object")
            read_messages_usage(message.get("usage"), self.usage, self._inputs)
            return with_model(payload, message, self._model, event)
        if name == b"message_delta":
            read_messages_usage(self._decode(payload).get("usage"), self.usage, self._inputs)
        elif name == b"message_stop":
            self.done = True
        return payload

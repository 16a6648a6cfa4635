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
- Stream: Anthropic's events relayed as they came, each framed exactly ``event: X\\ndata:
  {...}\\n\\n`` — untouched bytes for an upstream that frames them so — but for the message's
  ``model`` in ``message_start``; ``ping`` is relayed, comments and ``id:`` / ``retry:`` fields
  are dropped. Only ``message_start``, ``message_delta`` (usage) and ``error`` are decoded; a
  run of other events is checked and relayed in one pass (:meth:`MessagesEvents.translate_read`).
  The stream is done at ``message_stop``; a body that ends before it is an ``upstream_error``.
- An upstream ``event: error``: relayed to the client untouched (it is in Anthropic's shape
  already, and agents match on its wording), then the stream fails with an ``upstream_error``
  whose ``error_relayed`` is true — the caller writes no second error event, and the provider's
  health hears of the failure.
- An upstream error status (400–599): returned with that status and the body as it came when
  it is a JSON object (Anthropic's error, or whatever JSON the server uses); any other body (an
  HTML page from a proxy, text, a body cut at 64 KiB) stays in the log, and the client gets an
  Anthropic error object naming the provider, with the upstream's status.
"""

from __future__ import annotations

import contextlib
from typing import Any, Final

import orjson

from iop_edge.adapters.base import (
    UnsupportedRequestError,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    Usage,
)
from iop_edge.adapters.openai_format import MODEL_KEY, dumps, with_model
from iop_edge.adapters.relay import relay_lines
from iop_edge.adapters.upstream_http import (
    HttpBackend,
    HttpTarget,
    connection_closed,
    connection_protocol,
    post_for_body,
    post_for_stream,
    redact_url,
    upstream_error,
)
from iop_edge.errors import AdapterError

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
#: What begins an event this module decodes: ``message_start``, ``message_delta``,
#: ``message_stop`` (the end), ``error``; a run of events relayed as a whole ends before one.
_RUN_BREAKERS: Final = (b"event: message_", b"event: error")


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


def _require_native(call: UpstreamCall, native_apis: frozenset[str], label: str) -> None:
    if "messages" not in native_apis:
        raise UnsupportedRequestError(
            f"{label} does not serve /v1/{call.endpoint} natively (its native_apis does not "
            "list messages); the request must be translated to chat for it"
        )


def _payload(call: UpstreamCall) -> bytes:
    body = call.body
    changes: dict[str, Any] = {}
    if body.get("model") != call.target:
        changes["model"] = call.target
    if call.endpoint == "messages" and bool(body.get("stream", False)) is not call.stream:
        changes["stream"] = call.stream
    return dumps({**body, **changes} if changes else body)


def _error_reply(reply: UpstreamReply, label: str) -> UpstreamReply:
    """An upstream's error status: its body as it came when it is a JSON object, else an
    Anthropic error object naming the provider (the body went to the log in ``detail``)."""
    parsed: Any = None
    with contextlib.suppress(orjson.JSONDecodeError):
        parsed = orjson.loads(reply.body)
    if isinstance(parsed, dict):
        return reply
    kind = "api_error" if reply.status >= 500 else "invalid_request_error"
    message = (
        f"The upstream of {label} answered HTTP {reply.status} with a body that is not a JSON "
        "error; the edge's log has it under this request's x-request-id."
    )
    reply.body = orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
    return reply


async def complete_messages(
    backend: HttpBackend, target: HttpTarget, call: UpstreamCall, native_apis: frozenset[str]
) -> UpstreamReply:
    """POST a ``messages`` (not streamed) or ``messages/count_tokens`` call and return the
    upstream's answer (see the module docstring)."""
    _require_native(call, native_apis, target.label)
    url = target.url(call.endpoint)
    got = await post_for_body(
        backend, target, url, _payload(call), call.headers, call.request_id, raw_errors=True
    )
    if isinstance(got, UpstreamReply):
        return _error_reply(got, target.label)
    try:
        parsed = orjson.loads(got)
        if not isinstance(parsed, dict):
            raise target.broken(url, "the response is a JSON value but not an object")
    except Exception as exc:
        raise upstream_error(target, url, exc) from exc
    usage = Usage()
    if call.endpoint == "messages/count_tokens":
        return UpstreamReply(200, got, usage)
    read_messages_usage(parsed.get("usage"), usage, {})
    return UpstreamReply(200, with_model(got, parsed, call.answer_model), usage)


async def open_messages_stream(
    backend: HttpBackend, target: HttpTarget, call: UpstreamCall, native_apis: frozenset[str]
) -> UpstreamStream | UpstreamReply:
    """POST a streamed ``messages`` call; once the upstream answers 200, relay its events."""
    _require_native(call, native_apis, target.label)
    if call.endpoint != "messages":
        raise UnsupportedRequestError(f"/v1/{call.endpoint} is not streamed", param="stream")
    url = target.url(call.endpoint)
    opened = await post_for_stream(
        backend,
        target,
        url,
        _payload(call),
        call.headers,
        call.request_id,
        call.bounds,
        raw_errors=True,
    )
    if isinstance(opened, UpstreamReply):
        return _error_reply(opened, target.label)
    response, exchange = opened
    if response.content_type == "application/json":
        exchange.end()
        protocol = connection_protocol(response)
        response.close()
        await connection_closed(protocol)
        raise target.broken(
            url, "it answered a streaming request with a JSON body instead of an event stream"
        )
    usage = Usage()
    events = MessagesEvents(target, url, usage, call.answer_model)
    return relay_lines(response, target, url, exchange, events, usage)


def _run_end(read: bytes, pos: int) -> int:
    """Where the run of events from ``pos`` ends: at the start of the first event that may be
    one to decode (``pos`` when it is the first), else at the end of ``read``."""
    stop = len(read)
    for marker in _RUN_BREAKERS:
        at = read.find(marker, pos, stop)
        if at >= 0:
            start = read.rfind(b"\n\n", pos, at)
            stop = pos if start < 0 else start + 2
    return stop


def _plain_run(run: bytes) -> bool:
    """Whether ``run`` is whole events each framed exactly ``event: X\\ndata: {...}`` and a
    blank line: every newline is then in a ``}\\n\\nevent: `` between two events, in the last
    ``}\\n\\n``, or begins a ``data: {`` line — three per event, counted in one pass each."""
    events = run.count(b"}\n\nevent: ") + 1
    return (
        run.startswith(b"event: ")
        and run.endswith(b"}\n\n")
        and run.count(b"\n") == 3 * events
        and run.count(b"\ndata: {") == events
    )


class MessagesEvents:
    """An upstream's Anthropic event stream as the client's frames, with the usage captured;
    a :class:`~iop_edge.adapters.relay.LineTranslator` (see the module docstring)."""

    __slots__ = (
        "_data",
        "_error",
        "_inputs",
        "_model",
        "_name",
        "_target",
        "_url",
        "_usage",
        "done",
    )

    unfinished = "the stream ended before event: message_stop"

    def __init__(self, target: HttpTarget, url: str, usage: Usage, model: str) -> None:
        self._target = target
        self._url = url
        self._usage = usage
        self._model = model
        self._inputs: dict[str, int] = {}
        self._name: bytes | None = None  # the event: field of the event being read
        self._data: list[bytes] = []  # its data: lines
        self._error: bytes | None = None  # the data of an error event, once one came
        self.done = False

    def translate(self, line: bytes) -> bytes:
        """The frame of the event this line ends, if any (for the relay's last, unterminated
        line: an error event ended by it is not relayed, and fails as such)."""
        frames: list[bytes] = []
        self._line(line, frames)
        if self._error is not None:
            raise self._upstream_error(self._error, relayed=False)
        return b"".join(frames)

    def translate_read(self, read: bytes, frames: list[bytes]) -> None:
        """Append to ``frames`` the frames of one network read's whole lines (``read`` ends in
        ``\\n``); stops at ``message_stop``. Frames come before any raise, so the client gets
        what came before a failure — an upstream's error event included.

        A run of events framed exactly and none to decode is relayed as it came, in one pass
        (:func:`_plain_run`); the rest goes line by line, with the same rules.
        """
        pos, end = 0, len(read)
        runs = True  # a run that failed its check: the rest of this read goes line by line
        while pos < end:
            if runs and self._name is None and not self._data:
                stop = _run_end(read, pos)
                if stop > pos:
                    if _plain_run(read[pos:stop]):
                        frames.append(read[pos:stop])
                        pos = stop
                        continue
                    runs = False
            newline = read.index(b"\n", pos)
            self._line(read[pos:newline], frames)
            pos = newline + 1
            if self._error is not None:  # its frame is the last of ``frames``
                raise self._upstream_error(self._error, relayed=True)
            if self.done:
                return

    def _line(self, line: bytes, frames: list[bytes]) -> None:
        """Take one line of the stream; at a blank line, append the frame of its event (an
        error event's is kept in ``_error`` too, for the caller to fail the stream after it)."""
        if line.endswith(b"\r"):
            line = line[:-1]
        if line:
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            elif line.startswith(b"event:"):
                value = line[6:]
                self._name = value[1:] if value.startswith(b" ") else value
            return  # comments (keep-alives), id: and retry: fields are dropped
        name, self._name = self._name, None
        data = self._data
        if not data:
            return  # (an event without data is never dispatched)
        # A JSON value holds no raw newline: lines of one event joined by a space mean the same.
        payload = data[0] if len(data) == 1 else b" ".join(data)
        data.clear()
        if name is None:
            name = self._type_of(payload)
        if name == b"message_start":
            payload = self._message_start(payload)
        elif name == b"message_delta":
            read_messages_usage(self._decode(payload).get("usage"), self._usage, self._inputs)
        frames.append(b"event: " + name + b"\ndata: " + payload + b"\n\n")
        if name == b"error":
            self._error = payload
        elif name == b"message_stop":
            self.done = True

    def _decode(self, payload: bytes) -> dict[str, Any]:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise self._target.broken(self._url, f"an event is not valid JSON ({exc})") from exc
        if not isinstance(event, dict):
            raise self._target.broken(self._url, "an event is not a JSON object")
        return event

    def _type_of(self, payload: bytes) -> bytes:
        """The name of an event sent without an ``event:`` field: its ``type``."""
        kind = self._decode(payload).get("type")
        if not isinstance(kind, str) or not kind:
            raise self._target.broken(self._url, "an event has neither an event: field nor a type")
        return kind.encode()

    def _message_start(self, payload: bytes) -> bytes:
        """Capture the input usage; set the message's ``model`` to the client's, in the bytes
        when the upstream's compact ``"model":"<name>"`` occurs once, else re-encoded."""
        event = self._decode(payload)
        message = event.get("message")
        if not isinstance(message, dict):
            raise self._target.broken(self._url, "message_start has no message object")
        read_messages_usage(message.get("usage"), self._usage, self._inputs)
        current = message.get("model")
        if current == self._model:
            return payload
        if isinstance(current, str):
            needle = MODEL_KEY + orjson.dumps(current)
            at = payload.find(needle)
            if at >= 0 and payload.find(needle, at + 1) < 0:
                value = MODEL_KEY + orjson.dumps(self._model)
                return payload[:at] + value + payload[at + len(needle) :]
        message["model"] = self._model
        return dumps(event)

    def _upstream_error(self, payload: bytes, *, relayed: bool) -> AdapterError:
        """The failure of a stream whose upstream sent an error event (``relayed``: that
        event's frame is on its way to the client)."""
        said = payload.decode("utf-8", errors="replace")
        with contextlib.suppress(orjson.JSONDecodeError):
            event = orjson.loads(payload)
            error = event.get("error") if isinstance(event, dict) else None
            if isinstance(error, dict):
                said = f"{error.get('type')}: {error.get('message')}"
        return AdapterError(
            "upstream_error",
            f"{self._target.label} at POST {redact_url(self._url)} failed: the upstream "
            f"reported an error mid-stream{' (relayed to the client)' if relayed else ''}: "
            f"{said[:500]}",
            error_relayed=relayed,
        )

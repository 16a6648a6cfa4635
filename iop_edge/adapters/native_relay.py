"""What the native passthroughs share: an API besides OpenAI's chat that an ``openai_compat``
upstream serves itself (``native_apis``), relayed as it came but for ``model`` — Anthropic
Messages (:mod:`iop_edge.adapters.anthropic_native`) and OpenAI Responses
(:mod:`iop_edge.adapters.responses_native`).

- :func:`require_native`: a call of an API the provider's ``native_apis`` does not list is
  refused before any I/O (the request path translates it to chat instead).
- :func:`native_payload`: the client's body with ``model`` set to the target and (a generation
  endpoint) ``stream`` to the call's; everything else untouched, serialised once.
- :func:`post_native`, :func:`open_native`: one POST with ``raw_errors``. An upstream error
  status (400–599) comes back with that status and its body as it came when it is a JSON object
  (the API's own error, or whatever JSON the server uses); any other body (an HTML page from a
  proxy, text, a body cut at 64 KiB) stays in the log, and the client gets the API's own error
  object naming the provider (an :data:`ErrorBody`), with the upstream's status.
- :class:`NamedEvents`: an event stream whose events are named (``event: X`` then ``data:``,
  as Anthropic's and OpenAI Responses' are), relayed as it came, each event framed exactly
  ``event: X\\ndata: {...}\\n\\n`` — untouched bytes for an upstream that frames them so —, but
  for what the API's subclass rewrites in the few events it decodes (:meth:`NamedEvents._take`:
  usage, the model, the end). Comments and ``id:`` / ``retry:`` fields are dropped; an event
  without an ``event:`` field is named by its ``type``. A run of events none of which is to be
  decoded is checked and relayed in one pass (:meth:`NamedEvents.translate_read`).
- An upstream's failure event (:attr:`NamedEvents.failures`): relayed to the client untouched
  (it is in the API's shape already, and agents match on its wording), then the stream fails
  with an ``upstream_error`` whose ``error_relayed`` is true — the caller writes no second error
  event, and the provider's health hears of the failure. A body that ends before the API's last
  event is an ``upstream_error`` too, with nothing relayed to mark an end.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable
from typing import Any, ClassVar

import orjson

from iop_edge.adapters.base import (
    UnsupportedRequestError,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    Usage,
)
from iop_edge.adapters.openai_format import dumps
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
    "ErrorBody",
    "NamedEvents",
    "native_error_reply",
    "native_payload",
    "open_native",
    "post_native",
    "require_native",
]

ErrorBody = Callable[[int, str], bytes]
"""An API's error object for an upstream error status whose body is not JSON: built from the
status and the sentence the client reads."""


def require_native(call: UpstreamCall, native_apis: frozenset[str], api: str, label: str) -> None:
    """Refuse, before any I/O, a call of ``api`` on a provider whose ``native_apis`` lacks it."""
    if api not in native_apis:
        raise UnsupportedRequestError(
            f"{label} does not serve /v1/{call.endpoint} natively (its native_apis does not "
            f"list {api}); the request must be translated to chat for it"
        )


def native_payload(call: UpstreamCall, *, stream_field: bool) -> bytes:
    """The upstream body: the client's with ``model`` set to the target and, when the endpoint
    has a ``stream`` field (``stream_field``), ``stream`` set to the call's."""
    body = call.body
    changes: dict[str, Any] = {}
    if body.get("model") != call.target:
        changes["model"] = call.target
    if stream_field and bool(body.get("stream", False)) is not call.stream:
        changes["stream"] = call.stream
    return dumps({**body, **changes} if changes else body)


def native_error_reply(reply: UpstreamReply, label: str, error_body: ErrorBody) -> UpstreamReply:
    """An upstream's error status: its body as it came when it is a JSON object, else the API's
    error object naming the provider (the body went to the log in ``detail``)."""
    parsed: Any = None
    with contextlib.suppress(orjson.JSONDecodeError):
        parsed = orjson.loads(reply.body)
    if isinstance(parsed, dict):
        return reply
    reply.body = error_body(
        reply.status,
        f"The upstream of {label} answered HTTP {reply.status} with a body that is not a JSON "
        "error; the edge's log has it under this request's x-request-id.",
    )
    return reply


async def post_native(
    backend: HttpBackend,
    target: HttpTarget,
    call: UpstreamCall,
    url: str,
    payload: bytes,
    error_body: ErrorBody,
) -> tuple[bytes, dict[str, Any]] | UpstreamReply:
    """POST a call that is not streamed: the upstream's 200 body and that body parsed (a JSON
    object, else an ``upstream_error``), or its error status as a reply."""
    got = await post_for_body(
        backend, target, url, payload, call.headers, call.request_id, raw_errors=True
    )
    if isinstance(got, UpstreamReply):
        return native_error_reply(got, target.label, error_body)
    try:
        parsed = orjson.loads(got)
        if not isinstance(parsed, dict):
            raise target.broken(url, "the response is a JSON value but not an object")
    except Exception as exc:
        raise upstream_error(target, url, exc) from exc
    return got, parsed


async def open_native(
    backend: HttpBackend,
    target: HttpTarget,
    call: UpstreamCall,
    url: str,
    payload: bytes,
    error_body: ErrorBody,
    events: NamedEvents,
) -> UpstreamStream | UpstreamReply:
    """POST a streamed call; once the upstream answers 200, relay its events through
    ``events`` (whose usage the stream carries); its error status comes back as a reply."""
    opened = await post_for_stream(
        backend,
        target,
        url,
        payload,
        call.headers,
        call.request_id,
        call.bounds,
        raw_errors=True,
    )
    if isinstance(opened, UpstreamReply):
        return native_error_reply(opened, target.label, error_body)
    response, exchange = opened
    if response.content_type == "application/json":
        exchange.end()
        protocol = connection_protocol(response)
        response.close()
        await connection_closed(protocol)
        raise target.broken(
            url, "it answered a streaming request with a JSON body instead of an event stream"
        )
    return relay_lines(response, target, url, exchange, events, events.usage)


@functools.cache
def _breakers_pattern(breakers: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """Any of ``breakers``: one scan finds the first, where a find per breaker scanned a large
    read once for each (seven times for Responses)."""
    return re.compile(b"|".join(re.escape(marker) for marker in breakers))


def _run_end(read: bytes, pos: int, breakers: tuple[bytes, ...]) -> int:
    """Where the run of events from ``pos`` ends: at the start of the first event that may be
    one to decode (``pos`` when it is the first), else at the end of ``read``."""
    found = _breakers_pattern(breakers).search(read, pos)
    if found is None:
        return len(read)
    start = read.rfind(b"\n\n", pos, found.start())
    return pos if start < 0 else start + 2


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


def _error_said(payload: bytes) -> str:
    """What an upstream's failure event says, for the log: ``<type or code>: <message>`` of its
    error object — ``error`` (Anthropic's), ``response.error`` (Responses' ``response.failed``)
    or the event itself (Responses' ``error``) — else its text."""
    said = payload.decode("utf-8", errors="replace")
    with contextlib.suppress(orjson.JSONDecodeError):
        event = orjson.loads(payload)
        if isinstance(event, dict):
            error = event.get("error")
            response = event.get("response")
            if not isinstance(error, dict) and isinstance(response, dict):
                error = response.get("error")
            if not isinstance(error, dict) and "message" in event:
                error = event
            if isinstance(error, dict):
                kind = error.get("code") or error.get("type")
                said = f"{kind}: {error.get('message')}"
    return said


class NamedEvents:
    """An upstream's named event stream as the client's frames, with the usage captured; a
    :class:`~iop_edge.adapters.relay.LineTranslator` (see the module docstring). A subclass per
    API says what begins an event to decode (:attr:`breakers`), which events report a failure
    (:attr:`failures`), the ``unfinished`` reason, and what is done with an event
    (:meth:`_take`, which sets :attr:`done` at the last one)."""

    __slots__ = ("_data", "_error", "_model", "_name", "_target", "_url", "done", "usage")

    unfinished: str
    """The reason in the ``upstream_error`` of a body that ends before :attr:`done`."""
    breakers: ClassVar[tuple[bytes, ...]]
    """What begins every event :meth:`_take` decodes (``b"event: message_"``); a run of events
    relayed as a whole ends before one."""
    failures: ClassVar[frozenset[bytes]]
    """The names of the events that report the upstream's failure: relayed, then failed."""

    def __init__(self, target: HttpTarget, url: str, usage: Usage, model: str) -> None:
        self._target = target
        self._url = url
        self.usage = usage
        """The usage the stream reports, filled in as its events come."""
        self._model = model
        self._name: bytes | None = None  # the event: field of the event being read
        self._data: list[bytes] = []  # its data: lines
        self._error: bytes | None = None  # the data of a failure event, once one came
        self.done = False

    def translate(self, line: bytes) -> bytes:
        """The frame of the event this line ends, if any (for the relay's last, unterminated
        line: a failure event ended by it is not relayed, and fails as such)."""
        frames: list[bytes] = []
        self._line(line, frames)
        if self._error is not None:
            raise self._upstream_error(self._error, relayed=False)
        return b"".join(frames)

    def translate_read(self, read: bytes, frames: list[bytes]) -> None:
        """Append to ``frames`` the frames of one network read's whole lines (``read`` ends in
        ``\\n``); stops at the last event. Frames come before any raise, so the client gets
        what came before a failure — an upstream's failure event included.

        A run of events framed exactly and none to decode is relayed as it came, in one pass
        (:func:`_plain_run`); the rest goes line by line, with the same rules.
        """
        pos, end = 0, len(read)
        runs = True  # a run that failed its check: the rest of this read goes line by line
        while pos < end:
            if runs and self._name is None and not self._data:
                stop = _run_end(read, pos, self.breakers)
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
        """Take one line of the stream; at a blank line, append the frame of its event (a
        failure event's is kept in ``_error`` too, for the caller to fail the stream after it)."""
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
        payload = self._take(name, payload)
        frames.append(b"event: " + name + b"\ndata: " + payload + b"\n\n")
        if name in self.failures:
            self._error = payload

    def _take(self, name: bytes, payload: bytes) -> bytes:
        """The data to relay for the event ``name`` (its ``payload``, or that with what the
        API rewrites); captures usage, and sets :attr:`done` at the API's last event."""
        raise NotImplementedError

    def _decode(self, payload: bytes) -> dict[str, Any]:
        """An event's data as a JSON object, else an ``upstream_error``."""
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

    def _upstream_error(self, payload: bytes, *, relayed: bool) -> AdapterError:
        """The failure of a stream whose upstream sent a failure event (``relayed``: that
        event's frame is on its way to the client)."""
        return AdapterError(
            "upstream_error",
            f"{self._target.label} at POST {redact_url(self._url)} failed: the upstream "
            f"reported an error mid-stream{' (relayed to the client)' if relayed else ''}: "
            f"{_error_said(payload)[:500]}",
            error_relayed=relayed,
        )

"""The ``openai_compat`` adapter: OpenAI requests passed through to an OpenAI-compatible server.

- URL: ``{base_url}/chat/completions``, ``{base_url}/completions`` or
  ``{base_url}/embeddings``. The ``endpoint`` execution field, when set, replaces the chat path:
  a path joined to ``base_url`` (``endpoint: /openai/v1/chat/completions``) or an absolute
  ``http(s)://`` URL. The other two always use ``base_url``.
- Headers: ``Content-Type: application/json``, the ``headers`` execution field, the call's
  headers (provider auth), later ones winning, and ``x-request-id``; nothing else of the
  client's request.
- Body: the client's body with ``model`` set to the target and ``stream`` to the call's
  (embeddings: ``model`` only); every other field goes through untouched, serialised once.
- ``model`` in the answer: the model id the client asked for (:attr:`UpstreamCall.answer_model`),
  not the upstream's name. The upstream's compact ``"model":"<name>"`` is replaced in the bytes
  when it occurs once (one scan of the body or event, no re-encoding); any other spelling is
  re-encoded from the parsed object, which is decoded anyway to be checked. (A stream event
  without ``model`` is relayed without one.)
- When the client streams without having said whether it wants usage (no
  ``stream_options.include_usage``), usage is requested upstream so it can be captured, and
  hidden again from the client: the usage-only final chunk is not relayed and the
  ``"usage":null`` that upstreams add to every other chunk is removed (compact form only;
  anything else is relayed as is).
- Non-streaming: the upstream body is returned as is (bytes) once checked to be a JSON object;
  usage is read from it. Streaming: SSE events are relayed one by one as they arrive, each as
  ``data: <payload>\\n\\n`` (comments and ``event:``/``id:`` fields are dropped), until
  ``data: [DONE]``; a stream that ends without it is a failure.
- ``native_apis``: Anthropic Messages calls (``messages``) are passed through too, to
  ``{base_url}/messages``, and OpenAI Responses calls (``responses``) to
  ``{base_url}/responses`` — :mod:`iop_edge.adapters.anthropic_native` and
  :mod:`iop_edge.adapters.responses_native` have their rules.
- An upstream error status (400–599) is returned as an :class:`UpstreamReply` with that
  status: an OpenAI envelope passes through unchanged; any other body stays in the log and the
  client gets an envelope naming the provider. Any other status but 200 (1xx, 2xx other than
  200, 3xx, past 599) is an ``upstream_error``. An error event inside a stream
  (``data: {"error": ...}``) is raised as ``upstream_error`` instead of being relayed, so the
  caller renders every mid-stream failure the same way.
- :meth:`~OpenAICompatExecutor.count_tokens` asks the upstream's own tokenizer (vLLM's or
  llama.cpp's, detected once): :mod:`iop_edge.adapters.tokenize`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from iop_edge.adapters.anthropic_native import (
    MESSAGES_ENDPOINTS,
    complete_messages,
    open_messages_stream,
)
from iop_edge.adapters.base import (
    NO_NATIVE_APIS,
    Endpoint,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    Usage,
)
from iop_edge.adapters.openai_format import DONE_FRAME, MODEL_KEY, dumps, read_usage, with_model
from iop_edge.adapters.relay import relay_lines
from iop_edge.adapters.responses_native import (
    RESPONSES_ENDPOINT,
    complete_responses,
    open_responses_stream,
)
from iop_edge.adapters.tokenize import UpstreamTokenizer
from iop_edge.adapters.upstream_http import (
    HttpBackend,
    HttpTarget,
    connection_closed,
    post_for_body,
    post_for_stream,
    redact_url,
    upstream_error,
)
from iop_edge.errors import AdapterError

__all__ = ["OpenAICompatExecutor"]

_USAGE_NULL: Final = b',"usage":null'
_RUN_BREAKERS: Final = (b'"usage":{', b'"error"', b"[DONE]")
"""What ends a run of events relayed as a whole (see ``_SseEvents.translate_read``)."""


class OpenAICompatExecutor:
    """Passes calls through to one OpenAI-compatible upstream (see the module docstring)."""

    def __init__(
        self,
        backend: HttpBackend,
        target: HttpTarget,
        endpoint: str | None,
        native_apis: frozenset[str] = NO_NATIVE_APIS,
    ) -> None:
        self._backend = backend
        self._target = target
        self._native_apis = native_apis
        self._chat_url: str | None = None
        if endpoint is not None and endpoint.startswith(("http://", "https://")):
            self._chat_url = endpoint.rstrip("/")
        self._chat_path = endpoint or "chat/completions"
        self._tokenizer = UpstreamTokenizer(backend, target)

    async def count_tokens(
        self,
        chat_body: dict[str, Any],
        target: str,
        headers: Mapping[str, str],
        request_id: str,
    ) -> int | None:
        """The input tokens of ``chat_body`` by the upstream's tokenizer, with the chat
        template applied; ``None`` when it serves no tokenizer the edge knows or fails (never
        raises): see :mod:`iop_edge.adapters.tokenize`."""
        return await self._tokenizer.count(chat_body, target, headers, request_id)

    @property
    def native_apis(self) -> frozenset[str]:
        """The provider's ``native_apis`` (``{"messages"}``: Messages calls pass through;
        ``{"responses"}``: Responses calls do)."""
        return self._native_apis

    def _url(self, endpoint: Endpoint) -> str:
        if endpoint != "chat/completions":
            return self._target.url(endpoint)
        return self._chat_url or self._target.url(self._chat_path)

    def _payload(self, call: UpstreamCall) -> tuple[bytes, bool]:
        """The upstream body, and whether the usage chunk is ours to hide from the client."""
        body = call.body
        changes: dict[str, Any] = {}
        if body.get("model") != call.target:
            changes["model"] = call.target
        if call.endpoint == "embeddings":
            return dumps({**body, **changes} if changes else body), False
        if bool(body.get("stream", False)) is not call.stream:
            changes["stream"] = call.stream
        hide_usage = False
        if call.stream:
            options = body.get("stream_options")
            if options is None:
                changes["stream_options"] = {"include_usage": True}
                hide_usage = True
            elif isinstance(options, dict) and "include_usage" not in options:
                changes["stream_options"] = {**options, "include_usage": True}
                hide_usage = True
        return dumps({**body, **changes} if changes else body), hide_usage

    async def complete(self, call: UpstreamCall) -> UpstreamReply:
        """POST the call and return the upstream's JSON body as is, with its usage."""
        if call.endpoint in MESSAGES_ENDPOINTS:
            return await complete_messages(self._backend, self._target, call, self._native_apis)
        if call.endpoint == RESPONSES_ENDPOINT:
            return await complete_responses(self._backend, self._target, call, self._native_apis)
        url = self._url(call.endpoint)
        payload, _ = self._payload(call)
        got = await post_for_body(
            self._backend, self._target, url, payload, call.headers, call.request_id
        )
        if isinstance(got, UpstreamReply):
            return got
        try:
            parsed = orjson.loads(got)
            if not isinstance(parsed, dict):
                raise self._target.broken(url, "the response is a JSON value but not an object")
        except Exception as exc:
            raise upstream_error(self._target, url, exc) from exc
        usage = Usage()
        read_usage(parsed.get("usage"), usage)
        return UpstreamReply(200, with_model(got, parsed, call.answer_model), usage)

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream | UpstreamReply:
        """POST the call; once the upstream answers 200, relay its SSE events as frames."""
        if call.endpoint in MESSAGES_ENDPOINTS:
            return await open_messages_stream(self._backend, self._target, call, self._native_apis)
        if call.endpoint == RESPONSES_ENDPOINT:
            return await open_responses_stream(self._backend, self._target, call, self._native_apis)
        url = self._url(call.endpoint)
        payload, hide_usage = self._payload(call)
        opened = await post_for_stream(
            self._backend, self._target, url, payload, call.headers, call.request_id, call.bounds
        )
        if isinstance(opened, UpstreamReply):
            return opened
        response, exchange = opened
        if response.content_type == "application/json":
            exchange.end()
            protocol = response.connection.protocol if response.connection else None
            response.close()
            await connection_closed(protocol)
            raise AdapterError(
                "upstream_error",
                f"{self._target.label} at POST {redact_url(url)} answered a streaming "
                "request with a JSON body instead of an event stream",
            )
        usage = Usage()
        events = _SseEvents(self._target, url, usage, hide_usage, call.answer_model)
        return relay_lines(response, self._target, url, exchange, events, usage)


def _run_end(read: bytes, pos: int) -> int:
    """Where the run of events from ``pos`` ends: at the start of the first event that holds a
    usage object, an ``"error"`` or ``[DONE]`` (``pos`` when it is the first), else at the
    end of ``read``."""
    stop = len(read)
    for marker in _RUN_BREAKERS:
        at = read.find(marker, pos, stop)
        if at >= 0:
            start = read.rfind(b"\n\n", pos, at)
            stop = pos if start < 0 else start + 2
    return stop


class _SseEvents:
    """The upstream's SSE events as ``data:`` frames, checked one by one, with the usage
    captured (and hidden when ours); a :class:`~iop_edge.adapters.relay.LineTranslator`."""

    __slots__ = (
        "_data",
        "_fast",
        "_hide_usage",
        "_model",
        "_model_value",
        "_target",
        "_url",
        "_usage",
        "done",
    )

    unfinished = "the stream ended before data: [DONE]"

    def __init__(
        self, target: HttpTarget, url: str, usage: Usage, hide_usage: bool, model: str
    ) -> None:
        self._target = target
        self._url = url
        self._usage = usage
        self._hide_usage = hide_usage
        self._data: list[bytes] = []
        self.done = False
        #: the answer's model and its compact JSON pair
        self._model = model
        self._model_value = MODEL_KEY + orjson.dumps(model)
        #: how the upstream names its model in an event (its compact pair, or b"" for not at
        #: all), learnt from the first event parsed; None until then
        self._fast: bytes | None = None

    def translate(self, line: bytes) -> bytes:
        """The frame of the event this line ends, if any."""
        line = line.rstrip(b"\r\n")
        if line:
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            return b""  # comments (keep-alives) and other SSE fields are dropped
        data = self._data
        if not data:
            return b""
        event = data[0] if len(data) == 1 else b"\n".join(data)
        data.clear()
        if event == b"[DONE]":
            self.done = True
            return DONE_FRAME
        return self._check(event)

    def translate_read(self, read: bytes, frames: list[bytes]) -> None:
        """Append to ``frames`` the frames of one network read's whole lines (``read`` ends in
        ``\\n``); stops at ``[DONE]``. Frames come before any raise, so the client gets what
        came before a failure.

        A run of events like the ones before it is checked and relayed as a whole
        (:meth:`_run`); the rest — the first event, the usage, an error, ``[DONE]``, any other
        form — goes line by line through :meth:`translate`, with the same rules. For a read of
        many events, one pass instead of a few checks per event (that was the most of a
        streamed request's own CPU after issue 16's first cuts).
        """
        pos, end = 0, len(read)
        runs = True  # a run that failed its check: the rest of this read goes line by line
        while pos < end:
            if runs and self._fast is not None and not self._data:
                stop = _run_end(read, pos)
                if stop > pos:
                    run = self._run(read[pos:stop])
                    if run is None:
                        runs = False
                    else:
                        frames.append(run)
                        pos = stop
                        continue
            newline = read.index(b"\n", pos)
            frame = self.translate(read[pos:newline])
            pos = newline + 1
            if frame:
                frames.append(frame)
            if self.done:
                return

    def _run(self, run: bytes) -> bytes | None:
        """The frames of ``run``, whole events each framed exactly as ``data: {…}`` and a blank
        line, or ``None`` when one of them is not like the events before it: the rules of
        :meth:`_check` for all of them at once — every ``"usage"`` null (ours hidden), every
        ``"model":`` the one of the first event (replaced), by one pass each; no ``"error"``
        (:func:`_run_end` ends a run before one)."""
        # Every newline is in a "}\n\ndata: {" between two events or in the last "}\n\n":
        # each event is one line, framed exactly, and a blank line.
        events = run.count(b"}\n\ndata: {") + 1
        if (
            run.count(b"\n") != 2 * events
            or not run.startswith(b"data: {")
            or not run.endswith(b"}\n\n")
        ):
            return None
        usages = run.count(b'"usage"')
        if usages:
            if run.count(_USAGE_NULL) != usages:
                return None
            if self._hide_usage:
                run = run.replace(_USAGE_NULL, b"")
        fast = self._fast
        if fast:
            if run.count(MODEL_KEY) != events or run.count(fast) != events:
                return None
            if fast != self._model_value:
                run = run.replace(fast, self._model_value)
        elif MODEL_KEY in run:
            return None
        return run

    def _check(self, event: bytes) -> bytes:
        """The frame to relay for one event (or b"").

        An event like the ones before it — framed as a JSON object, no ``"error"``, no usage
        but the ``"usage":null`` an upstream puts in every chunk, and its model named exactly as
        in the first event — is relayed without being decoded (its model replaced in the
        bytes): decoding every chunk was most of what the edge spent per streamed chunk. Any
        other event (the first, the usage, an error, a new form) is parsed in full
        (:meth:`_parse`), so usage stays exact and an upstream's error is seen.
        """
        fast = self._fast
        if fast is None or event[:1] != b"{" or event[-1:] != b"}" or b'"error"' in event:
            return self._parse(event)
        if b'"usage"' in event:
            if _USAGE_NULL not in event or event.count(b'"usage"') != 1:
                return self._parse(event)
            if self._hide_usage:
                event = event.replace(_USAGE_NULL, b"")
        if fast:
            at = event.find(fast)
            if at < 0 or event.find(fast, at + 1) >= 0:
                return self._parse(event)
            model = self._model_value
            if fast != model:
                event = event[:at] + model + event[at + len(fast) :]
        elif MODEL_KEY in event:
            return self._parse(event)
        return b"data: " + event + b"\n\n"

    def _parse(self, event: bytes) -> bytes:
        """Validate one event and capture its usage; return the frame to relay (or b"")."""
        url = self._url
        try:
            chunk = orjson.loads(event)
        except orjson.JSONDecodeError as exc:
            raise self._target.broken(url, f"an event is not valid JSON ({exc})") from exc
        if not isinstance(chunk, dict):
            raise self._target.broken(url, "an event is not a JSON object")
        error = chunk.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else error
            raise self._target.broken(url, f"the upstream reported an error mid-stream: {message}")
        reported = chunk.get("usage")
        if reported is not None:
            read_usage(reported, self._usage)
            if self._hide_usage and not chunk.get("choices"):
                return b""
        if self._hide_usage and _USAGE_NULL in event:
            event = event.replace(_USAGE_NULL, b"")
        current = chunk.get("model")
        if current is None:
            self._fast = b""
        elif isinstance(current, str):
            self._fast = MODEL_KEY + orjson.dumps(current)
        if current is not None:
            event = with_model(event, chunk, self._model)
        return b"data: " + event + b"\n\n"

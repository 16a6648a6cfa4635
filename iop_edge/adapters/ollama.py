"""The ``ollama`` adapter: OpenAI chat requests translated to Ollama's ``/api/chat`` and back.

Request (``POST {base_url}/api/chat``; headers: JSON content type, the ``headers`` execution
field, then the call's): ``model`` = the target, ``stream`` = the call's, ``messages`` with
their text (content parts joined; ``developer`` becomes ``system``; images given as ``data:``
URLs become ``images``, other image URLs are refused with 400), and ``options``:

==========================  =========================================================
Ollama option               from
==========================  =========================================================
``num_predict``             ``max_completion_tokens``, else ``max_tokens``
``temperature``, ``top_p``  the same fields
``stop``                    ``stop`` (a string becomes a one-item list)
``seed``                    ``seed``
``presence_penalty``,       the same fields
``frequency_penalty``
``num_ctx``                 the ``context_size`` execution field
==========================  =========================================================

``response_format`` ``json_object`` becomes ``format: "json"`` and ``json_schema`` its schema.
Tools are not translated (a request with ``tools`` gets a plain answer).

Reply: ``prompt_eval_count`` / ``eval_count`` become ``usage``; ``done_reason`` ``length``
becomes ``finish_reason: "length"``, anything else ``"stop"``; ``message.thinking`` becomes
``reasoning_content``. A stream (NDJSON) becomes ``chat.completion.chunk`` frames as described
in :mod:`iop_edge.adapters.openai_format`; an ``{"error": ...}`` line, a line that is not JSON,
or an end before the ``"done": true`` line raises ``upstream_error`` out of the frames.
Upstream statuses are mapped as :mod:`iop_edge.adapters.upstream_http` describes (200 an
answer, 400–599 Ollama's error relayed with its status, anything else ``upstream_error``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from iop_edge.adapters.base import (
    UnsupportedRequestError,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    Usage,
)
from iop_edge.adapters.openai_format import (
    DONE_FRAME,
    ChatChunks,
    chat_completion,
    dumps,
    include_usage,
    message_text,
    require_chat,
)
from iop_edge.adapters.upstream_http import (
    HttpBackend,
    HttpTarget,
    post_for_body,
    post_for_stream,
    relay_lines,
    upstream_error,
)

__all__ = ["OllamaExecutor", "ollama_request"]

_PASSED_OPTIONS: Final = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _message(message: Mapping[str, Any], label: str) -> dict[str, Any]:
    role = message.get("role")
    converted: dict[str, Any] = {
        "role": "system" if role == "developer" else role,
        "content": message_text(message.get("content")),
    }
    content = message.get("content")
    if isinstance(content, list):
        images: list[str] = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "image_url":
                continue
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if not isinstance(url, str) or not url.startswith("data:") or "," not in url:
                raise UnsupportedRequestError(
                    f"{label} takes images only as data: URLs (base64); it cannot fetch "
                    "an image by URL"
                )
            images.append(url.partition(",")[2])
        if images:
            converted["images"] = images
    return converted


def ollama_request(call: UpstreamCall, context_size: int | None, label: str) -> dict[str, Any]:
    """The ``/api/chat`` body of an OpenAI chat call (see the module docstring)."""
    body = call.body
    messages = [_message(m, label) for m in require_chat(call, label)]
    options: dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        options["num_predict"] = max_tokens
    for name in _PASSED_OPTIONS:
        if _number(body.get(name)):
            options[name] = body[name]
    stop = body.get("stop")
    if isinstance(stop, str):
        options["stop"] = [stop]
    elif isinstance(stop, list) and stop:
        options["stop"] = stop
    if context_size is not None:
        options["num_ctx"] = context_size
    request: dict[str, Any] = {
        "model": call.target,
        "messages": messages,
        "stream": call.stream,
        "options": options,
    }
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping):
        if response_format.get("type") == "json_object":
            request["format"] = "json"
        elif response_format.get("type") == "json_schema":
            schema = response_format.get("json_schema")
            if isinstance(schema, Mapping) and isinstance(schema.get("schema"), Mapping):
                request["format"] = schema["schema"]
    return request


def _finish_reason(done_reason: object) -> str:
    return "length" if done_reason == "length" else "stop"


def _read_counts(final: Mapping[str, Any], usage: Usage) -> None:
    for source, name in (
        ("prompt_eval_count", "prompt_tokens"),
        ("eval_count", "completion_tokens"),
    ):
        value = final.get(source)
        if isinstance(value, int) and not isinstance(value, bool):
            setattr(usage, name, value)


class OllamaExecutor:
    """Runs chat calls on one Ollama server (see the module docstring)."""

    def __init__(self, backend: HttpBackend, target: HttpTarget, context_size: int | None) -> None:
        self._backend = backend
        self._target = target
        self._context_size = context_size

    def _prepare(self, call: UpstreamCall) -> tuple[str, bytes]:
        request = ollama_request(call, self._context_size, self._target.label)
        return self._target.url("api/chat"), dumps(request)

    async def complete(self, call: UpstreamCall) -> UpstreamReply:
        """Ask for a whole answer and return it as a ``chat.completion``."""
        url, payload = self._prepare(call)
        got = await post_for_body(self._backend, self._target, url, payload, call.headers)
        if isinstance(got, UpstreamReply):
            return got
        try:
            answer = orjson.loads(got)
            message = answer.get("message") if isinstance(answer, dict) else None
            if not isinstance(message, dict) or not isinstance(message.get("content"), str):
                raise self._target.broken(url, "the answer has no message.content")
        except Exception as exc:
            raise upstream_error(self._target, url, exc) from exc
        usage = Usage()
        _read_counts(answer, usage)
        thinking = message.get("thinking")
        reply = chat_completion(
            call.request_id,
            call.target,
            message["content"],
            _finish_reason(answer.get("done_reason")),
            usage,
            reasoning=thinking if isinstance(thinking, str) else None,
        )
        return UpstreamReply(200, reply, usage)

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream | UpstreamReply:
        """Ask for a streamed answer; once Ollama answers 200, translate its NDJSON lines."""
        url, payload = self._prepare(call)
        opened = await post_for_stream(self._backend, self._target, url, payload, call.headers)
        if isinstance(opened, UpstreamReply):
            return opened
        response, deadline = opened
        usage = Usage()
        chunks = ChatChunks(call.request_id, call.target)
        lines = _ChatLines(self._target, url, usage, chunks, include_usage(call.body))
        return relay_lines(response, self._target, url, deadline, lines, usage, chunks.role())


class _ChatLines:
    """Ollama's NDJSON stream lines as ``chat.completion.chunk`` frames; a
    :class:`~iop_edge.adapters.upstream_http.LineTranslator`."""

    __slots__ = ("_chunks", "_target", "_url", "_usage", "_with_usage", "done")

    unfinished = 'the stream ended before the "done": true line'

    def __init__(
        self, target: HttpTarget, url: str, usage: Usage, chunks: ChatChunks, with_usage: bool
    ) -> None:
        self._target = target
        self._url = url
        self._usage = usage
        self._chunks = chunks
        self._with_usage = with_usage
        self.done = False

    def translate(self, line: bytes) -> bytes:
        """The frames of one NDJSON line (the last one ends the stream)."""
        line = line.strip()
        if not line:
            return b""
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise self._target.broken(
                self._url, f"a stream line is not valid JSON ({exc})"
            ) from exc
        if not isinstance(item, dict):
            raise self._target.broken(self._url, "a stream line is not a JSON object")
        if "error" in item:
            raise self._target.broken(
                self._url, f"the upstream reported an error mid-stream: {item['error']}"
            )
        chunks = self._chunks
        frames = b""
        message = item.get("message")
        if isinstance(message, dict):
            thinking = message.get("thinking")
            if isinstance(thinking, str) and thinking:
                frames = chunks.reasoning(thinking)
            content = message.get("content")
            if isinstance(content, str) and content:
                frames += chunks.content(content)
        if item.get("done") is True:
            self.done = True
            _read_counts(item, self._usage)
            frames += chunks.finish(_finish_reason(item.get("done_reason")))
            if self._with_usage:
                frames += chunks.usage(self._usage)
            frames += DONE_FRAME
        return frames

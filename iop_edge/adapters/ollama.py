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

**Reasoning.** Ollama's ``think`` (top level) is set from the chat fields, and left out when
none is set (the model's default then applies):

- ``thinking_token_budget: 0`` → ``think: false`` (a budget of nothing turns thinking off,
  whatever else the request says);
- else ``reasoning_effort`` → ``think: "low"`` (``minimal``, ``low``), ``"medium"`` or
  ``"high"`` (``high``, and ``xhigh`` / ``max``, which the Anthropic surface may produce), or
  ``think: false`` (``none``). Ollama applies the level where the model has levels (gpt-oss)
  and takes any level as thinking on where it has only on and off;
- else a ``thinking_token_budget`` above 0 → ``think: true``. Ollama has no budget: the model
  thinks as long as it likes (the budget is not enforced).

In the history, an assistant message's ``reasoning_content`` goes back to Ollama as the
message's ``thinking`` (Ollama's field for a turn's reasoning), never into its ``content``.

**Tools.** ``tools`` go to Ollama as they are (Ollama takes OpenAI's function-tool objects);
``tool_choice: "none"`` sends none. In the history, an assistant message's ``tool_calls``
become Ollama's (``function.arguments`` parsed from its JSON string into an object; a string
that is not a JSON object is a 400 naming it) and a ``role: "tool"`` message gets the
``tool_name`` of the call its ``tool_call_id`` answers. In the answer, Ollama's
``message.tool_calls`` become OpenAI's: ``id`` (Ollama's, else ``call_<request id>_<n>``),
``type: "function"``, ``function.name`` and ``function.arguments`` as a JSON string;
``finish_reason`` is then ``tool_calls`` and ``content`` null when Ollama sent no text. Streamed,
each Ollama chunk with ``tool_calls`` becomes a delta with ``tool_calls`` (``index`` counting
every call of the answer). Ollama cannot be told to call one tool at a time, so
``parallel_tool_calls: false`` (what Codex sends) is kept by the edge: the answer carries the
first call only, the others are dropped (the client calls that tool, sends its result, and
the model asks again for what it still needs).

Any other request field is checked by :func:`iop_edge.adapters.fields.refusal`: one this
adapter cannot honour (``n: 2``, ``logprobs: true``...) is a 400 naming it, before any I/O.

Reply: ``prompt_eval_count`` / ``eval_count`` become ``usage``; ``done_reason`` ``length``
becomes ``finish_reason: "length"``, anything else ``"stop"`` (``tool_calls`` as above);
``message.thinking`` becomes ``reasoning_content``. A stream (NDJSON) becomes
``chat.completion.chunk`` frames as described in :mod:`iop_edge.adapters.openai_format`; an
``{"error": ...}`` line, a line that is not JSON, or an end before the ``"done": true`` line
raises ``upstream_error`` out of the frames.

**Embeddings** (``POST {base_url}/api/embed``): ``{"model", "input"}`` (a string or strings;
token ids are refused) with ``dimensions`` when set; Ollama's ``embeddings`` become OpenAI's
``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
"usage": {"prompt_tokens", "total_tokens"}}`` (``prompt_eval_count``), each vector a list of
floats or, with ``encoding_format: "base64"`` (what the OpenAI SDKs ask for), the base64 of its
little-endian float32 bytes.
Upstream statuses are mapped as :mod:`iop_edge.adapters.upstream_http` describes (200 an
answer, 400–599 Ollama's error relayed with its status, anything else ``upstream_error``).

**Token counting** (``count_tokens``, for ``/v1/messages/count_tokens``): Ollama serves no
tokenizer endpoint, so the executor answers ``None`` and the edge estimates.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping
from typing import Any, Final

import orjson

from iop_edge.adapters.base import (
    NO_NATIVE_APIS,
    UnsupportedRequestError,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    Usage,
)
from iop_edge.adapters.fields import THINK_LEVELS, refuse_unhonoured
from iop_edge.adapters.openai_format import (
    DONE_FRAME,
    ChatChunks,
    chat_completion,
    dumps,
    include_usage,
    message_text,
    require_chat,
)
from iop_edge.adapters.relay import relay_lines
from iop_edge.adapters.upstream_http import (
    HttpBackend,
    HttpTarget,
    post_for_body,
    post_for_stream,
    upstream_error,
)

__all__ = ["OllamaExecutor", "embed_request", "ollama_request", "ollama_think"]

_PASSED_OPTIONS: Final = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _arguments(value: object, param: str) -> object:
    """OpenAI's ``function.arguments`` (a JSON string) as the object Ollama takes."""
    if isinstance(value, Mapping):
        return value
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    raise UnsupportedRequestError(
        f"'{param}' must be a JSON object in a string, not {value!r:.60}.", param=param
    )


def _tool_calls(calls: list[Any], index: int, names: dict[str, str]) -> list[dict[str, Any]]:
    """An assistant message's OpenAI ``tool_calls`` as Ollama's; remembers each id's name."""
    converted: list[dict[str, Any]] = []
    for position, call in enumerate(calls):
        where = f"messages[{index}].tool_calls[{position}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(name, str):
            raise UnsupportedRequestError(
                f"'{where}' must be a function call with a string function.name.", param=where
            )
        call_id = call.get("id")
        if isinstance(call_id, str):
            names[call_id] = name
        arguments = _arguments(function.get("arguments"), f"{where}.function.arguments")
        converted.append({"function": {"name": name, "arguments": arguments}})
    return converted


def _message(
    message: Mapping[str, Any], label: str, index: int, names: dict[str, str]
) -> dict[str, Any]:
    role = message.get("role")
    converted: dict[str, Any] = {
        "role": "system" if role == "developer" else role,
        "content": message_text(message.get("content")),
    }
    reasoning = message.get("reasoning_content")
    if role == "assistant" and isinstance(reasoning, str) and reasoning:
        converted["thinking"] = reasoning
    calls = message.get("tool_calls")
    if calls:
        converted["tool_calls"] = _tool_calls(calls, index, names)
    call_id = message.get("tool_call_id")
    if role == "tool" and isinstance(call_id, str) and call_id in names:
        converted["tool_name"] = names[call_id]
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


def ollama_think(body: Mapping[str, Any]) -> bool | str | None:
    """Ollama's ``think`` for a chat body (``None``: leave it out); see the module docstring.
    Assumes the body passed :func:`~iop_edge.adapters.fields.refuse_unhonoured`."""
    given = body.get("thinking_token_budget")
    budget = given if isinstance(given, int) and not isinstance(given, bool) else None
    if budget == 0:
        return False
    effort = body.get("reasoning_effort")
    if effort is not None:
        return THINK_LEVELS[effort]
    if budget is not None and budget > 0:
        return True
    return None


def ollama_request(call: UpstreamCall, context_size: int | None, label: str) -> dict[str, Any]:
    """The ``/api/chat`` body of an OpenAI chat call (see the module docstring)."""
    body = call.body
    refuse_unhonoured(call, "ollama", label)
    names: dict[str, str] = {}  # tool call id → function name, for the tool messages
    messages = [_message(m, label, i, names) for i, m in enumerate(require_chat(call, label))]
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
    think = ollama_think(body)
    if think is not None:
        request["think"] = think
    tools = body.get("tools")
    if tools and body.get("tool_choice") != "none":
        request["tools"] = tools
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping):
        if response_format.get("type") == "json_object":
            request["format"] = "json"
        elif response_format.get("type") == "json_schema":
            schema = response_format.get("json_schema")
            if isinstance(schema, Mapping) and isinstance(schema.get("schema"), Mapping):
                request["format"] = schema["schema"]
    return request


def embed_request(call: UpstreamCall, label: str) -> dict[str, Any]:
    """The ``/api/embed`` body of an OpenAI embeddings call (see the module docstring)."""
    refuse_unhonoured(call, "ollama", label)
    request: dict[str, Any] = {"model": call.target, "input": call.body["input"]}
    dimensions = call.body.get("dimensions")
    if dimensions is not None:
        request["dimensions"] = dimensions
    return request


def _vector(values: object, base64_wanted: bool) -> object:
    if not isinstance(values, list) or not all(_number(v) for v in values):
        raise ValueError("an embedding is not an array of numbers")
    if base64_wanted:
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
    return values


def embeddings_body(answer: object, call: UpstreamCall, usage: Usage) -> bytes:
    """Ollama's ``/api/embed`` answer as an OpenAI embeddings list, each vector base64 when
    the call's ``encoding_format`` asks for it (raises ValueError when it is not one)."""
    base64_wanted = call.body.get("encoding_format") == "base64"
    vectors = answer.get("embeddings") if isinstance(answer, dict) else None
    if not isinstance(vectors, list):
        raise ValueError('the answer has no "embeddings" array')
    given = call.body["input"]
    expected = 1 if isinstance(given, str) else len(given)
    if len(vectors) != expected:
        raise ValueError(f"the answer has {len(vectors)} embeddings for {expected} inputs")
    assert isinstance(answer, dict)
    count = answer.get("prompt_eval_count")
    if isinstance(count, int) and not isinstance(count, bool):
        usage.prompt_tokens = count
    prompt = usage.prompt_tokens or 0
    return orjson.dumps(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": index, "embedding": _vector(v, base64_wanted)}
                for index, v in enumerate(vectors)
            ],
            "model": call.answer_model,
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
        }
    )


def _finish_reason(done_reason: object) -> str:
    return "length" if done_reason == "length" else "stop"


def openai_tool_calls(calls: object, request_id: str, first: int) -> list[dict[str, Any]]:
    """Ollama's ``message.tool_calls`` as OpenAI's (``first``: the index of the first one in
    the answer, for generated ids); raises ValueError for one without a function name."""
    if not isinstance(calls, list):
        raise ValueError("message.tool_calls is not an array")
    converted: list[dict[str, Any]] = []
    for offset, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str):
            raise ValueError("a tool call has no function name")
        arguments = function.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = orjson.dumps(arguments).decode()
        call_id = call.get("id")
        converted.append(
            {
                "id": call_id
                if isinstance(call_id, str) and call_id
                else f"call_{request_id}_{first + offset}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    return converted


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

    async def count_tokens(
        self,
        chat_body: dict[str, Any],
        target: str,
        headers: Mapping[str, str],
        request_id: str,
    ) -> int | None:
        """Always ``None``: Ollama serves no tokenizer endpoint (no ``/tokenize``; its
        ``prompt_eval_count`` comes only with an answer), so the edge estimates."""
        return None

    @property
    def native_apis(self) -> frozenset[str]:
        """None: Ollama's requests are translated to its own API."""
        return NO_NATIVE_APIS

    def _prepare(self, call: UpstreamCall) -> tuple[str, bytes]:
        request = ollama_request(call, self._context_size, self._target.label)
        return self._target.url("api/chat"), dumps(request)

    async def complete(self, call: UpstreamCall) -> UpstreamReply:
        """Ask for a whole answer and return it as a ``chat.completion`` (or, for
        ``embeddings``, an embeddings list)."""
        if call.endpoint == "embeddings":
            return await self._embed(call)
        url, payload = self._prepare(call)
        got = await post_for_body(
            self._backend, self._target, url, payload, call.headers, call.request_id
        )
        if isinstance(got, UpstreamReply):
            return got
        try:
            answer = orjson.loads(got)
            message = answer.get("message") if isinstance(answer, dict) else None
            if not isinstance(message, dict) or not isinstance(message.get("content"), str):
                raise self._target.broken(url, "the answer has no message.content")
            calls = message.get("tool_calls")
            tool_calls = openai_tool_calls(calls, call.request_id, 0) if calls else None
            if tool_calls and call.body.get("parallel_tool_calls") is False:
                tool_calls = tool_calls[:1]  # (one call at most, as the request asked)
        except Exception as exc:
            raise upstream_error(self._target, url, exc) from exc
        usage = Usage()
        _read_counts(answer, usage)
        thinking = message.get("thinking")
        reply = chat_completion(
            call.request_id,
            call.answer_model,
            message["content"],
            "tool_calls" if tool_calls else _finish_reason(answer.get("done_reason")),
            usage,
            reasoning=thinking if isinstance(thinking, str) else None,
            tool_calls=tool_calls,
        )
        return UpstreamReply(200, reply, usage)

    async def _embed(self, call: UpstreamCall) -> UpstreamReply:
        url = self._target.url("api/embed")
        payload = dumps(embed_request(call, self._target.label))
        got = await post_for_body(
            self._backend, self._target, url, payload, call.headers, call.request_id
        )
        if isinstance(got, UpstreamReply):
            return got
        usage = Usage()
        try:
            body = embeddings_body(orjson.loads(got), call, usage)
        except ValueError as exc:  # (orjson's decode error is one)
            raise self._target.broken(url, str(exc)) from exc
        return UpstreamReply(200, body, usage)

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream | UpstreamReply:
        """Ask for a streamed answer; once Ollama answers 200, translate its NDJSON lines."""
        if call.endpoint == "embeddings":
            return await self._embed(call)  # (an embedding is never streamed)
        url, payload = self._prepare(call)
        opened = await post_for_stream(
            self._backend, self._target, url, payload, call.headers, call.request_id, call.bounds
        )
        if isinstance(opened, UpstreamReply):
            return opened
        response, exchange = opened
        usage = Usage()
        chunks = ChatChunks(call.request_id, call.answer_model)
        lines = _ChatLines(
            self._target,
            url,
            usage,
            chunks,
            include_usage(call.body),
            call.request_id,
            single_call=call.body.get("parallel_tool_calls") is False,
        )
        return relay_lines(response, self._target, url, exchange, lines, usage, chunks.role())


class _ChatLines:
    """Ollama's NDJSON stream lines as ``chat.completion.chunk`` frames; a
    :class:`~iop_edge.adapters.relay.LineTranslator`."""

    __slots__ = (
        "_calls",
        "_chunks",
        "_request_id",
        "_single",
        "_target",
        "_url",
        "_usage",
        "_with_usage",
        "done",
    )

    unfinished = 'the stream ended before the "done": true line'

    def __init__(
        self,
        target: HttpTarget,
        url: str,
        usage: Usage,
        chunks: ChatChunks,
        with_usage: bool,
        request_id: str,
        *,
        single_call: bool = False,
    ) -> None:
        self._target = target
        self._single = single_call  # (parallel_tool_calls: false: the first call only)
        self._url = url
        self._usage = usage
        self._chunks = chunks
        self._with_usage = with_usage
        self._request_id = request_id
        self._calls = 0  # tool calls sent so far
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
            calls = message.get("tool_calls")
            if calls:
                try:
                    converted = openai_tool_calls(calls, self._request_id, self._calls)
                except ValueError as exc:
                    raise self._target.broken(self._url, str(exc)) from exc
                if self._single:
                    converted = converted[: 1 - self._calls]
                if converted:
                    frames += chunks.tool_calls(converted, self._calls)
                    self._calls += len(converted)
        if item.get("done") is True:
            self.done = True
            _read_counts(item, self._usage)
            reason = "tool_calls" if self._calls else _finish_reason(item.get("done_reason"))
            frames += chunks.finish(reason)
            if self._with_usage:
                frames += chunks.usage(self._usage)
            frames += DONE_FRAME
        return frames

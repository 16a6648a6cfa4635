"""OpenAI wire objects built and read by the adapters: chat completions, chunk frames, usage.

The normalized adapters (``ollama``, ``cli``) produce what the OpenAI API produces:

- non-streaming, a ``chat.completion`` object with one choice and ``usage`` when known;
- streaming, ``chat.completion.chunk`` SSE frames: the role (``{"role": "assistant",
  "content": ""}``), content deltas, a finish frame (empty delta, ``finish_reason``), a
  usage-only frame (``choices: []``) when the client set ``stream_options.include_usage``,
  then ``data: [DONE]``.

``id`` is ``chatcmpl-<request id>`` and ``model`` the model id the client asked for
(:attr:`~iop_edge.adapters.base.UpstreamCall.answer_model`), whichever provider answered.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, Final

import orjson

from iop_edge.adapters.base import UnsupportedRequestError, UpstreamCall, Usage

__all__ = [
    "DONE_FRAME",
    "MODEL_KEY",
    "ChatChunks",
    "chat_completion",
    "dumps",
    "include_usage",
    "message_text",
    "read_usage",
    "require_chat",
    "usage_object",
    "with_model",
]

DONE_FRAME: Final = b"data: [DONE]\n\n"
MODEL_KEY: Final = b'"model":'
"""How a compact JSON object names its ``model`` key (what :func:`with_model` looks for)."""
_OPEN_CHOICE_TAIL: Final = b',"logprobs":null,"finish_reason":null}]}\n\n'


def dumps(value: Any) -> bytes:
    """Serialise JSON compactly; falls back to :mod:`json` for what orjson refuses (integers
    beyond 64 bits, which a client may legitimately send in an unknown field)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        pass
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    except (RecursionError, ValueError) as exc:
        culprit = _unencodable_field(value)
        raise UnsupportedRequestError(
            f"The request cannot be forwarded: {culprit or 'the body'} is nested too deeply "
            "to encode.",
            param=culprit,
        ) from exc


def _unencodable_field(value: Any) -> str | None:
    """The top-level field that makes ``value`` impossible to encode (on the failure path)."""
    if not isinstance(value, dict):
        return None
    for key, item in value.items():
        try:
            json.dumps(item)
        except (RecursionError, ValueError):
            return str(key)
    return None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_usage(source: object, usage: Usage) -> None:
    """Copy token counts from an OpenAI (``prompt_tokens`` / ``completion_tokens``) or an
    Anthropic-style (``input_tokens`` / ``output_tokens``) usage object into ``usage``."""
    if not isinstance(source, Mapping):
        return
    prompt = _count(source.get("prompt_tokens", source.get("input_tokens")))
    completion = _count(source.get("completion_tokens", source.get("output_tokens")))
    if prompt is not None:
        usage.prompt_tokens = prompt
    if completion is not None:
        usage.completion_tokens = completion


def usage_object(usage: Usage) -> dict[str, int] | None:
    """The OpenAI ``usage`` object of ``usage``; ``None`` when no count is known."""
    if usage.prompt_tokens is None and usage.completion_tokens is None:
        return None
    prompt = usage.prompt_tokens or 0
    completion = usage.completion_tokens or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def include_usage(body: Mapping[str, Any]) -> bool:
    """Whether the client asked for the usage chunk (``stream_options.include_usage``)."""
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


def message_text(content: object) -> str:
    """The text of an OpenAI message ``content``: a string, or the ``text`` parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping)
            and part.get("type", "text") == "text"
            and isinstance(part.get("text"), str)
        )
    return ""


def require_chat(call: UpstreamCall, label: str) -> list[Mapping[str, Any]]:
    """The messages of a chat call, for an adapter that serves ``chat/completions`` only.

    Raises :class:`UnsupportedRequestError` for another endpoint or a body without a list of
    message objects.
    """
    if call.endpoint != "chat/completions":
        needs = {
            "completions": "an openai_compat provider",
            "embeddings": "an openai_compat or ollama provider",
        }.get(call.endpoint, "translating to chat, or an openai_compat provider with native_apis")
        raise UnsupportedRequestError(
            f"{label} serves only /v1/chat/completions; /v1/{call.endpoint} needs {needs}"
        )
    messages = call.body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
        raise UnsupportedRequestError("messages: must be a list of message objects")
    return messages


def chat_completion(
    request_id: str,
    model: str,
    content: str,
    finish_reason: str,
    usage: Usage,
    *,
    reasoning: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> bytes:
    """A non-streaming ``chat.completion`` body (``content`` null when there are tool calls
    and no text, as OpenAI answers)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
        if not content:
            message["content"] = None
    body: dict[str, Any] = {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        ],
    }
    counts = usage_object(usage)
    if counts is not None:
        body["usage"] = counts
    return orjson.dumps(body)


class ChatChunks:
    """Builds the ``chat.completion.chunk`` frames of one streamed answer.

    The invariant part of every frame is serialised once; a content frame costs one
    ``orjson.dumps`` of the text.
    """

    __slots__ = ("_created", "_head", "_id", "_model")

    def __init__(self, request_id: str, model: str) -> None:
        self._id = f"chatcmpl-{request_id}"
        self._model = model
        self._created = int(time.time())
        self._head = (
            b'data: {"id":'
            + orjson.dumps(self._id)
            + b',"object":"chat.completion.chunk","created":'
            + str(self._created).encode()
            + b',"model":'
            + orjson.dumps(model)
            + b',"choices":[{"index":0,"delta":'
        )

    def role(self) -> bytes:
        """The first frame: the assistant role with empty content."""
        return (
            self._head
            + b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def content(self, text: str) -> bytes:
        """A content delta."""
        return self._head + b'{"content":' + orjson.dumps(text) + b"}" + _OPEN_CHOICE_TAIL

    def reasoning(self, text: str) -> bytes:
        """A reasoning delta (``reasoning_content``, as vLLM and DeepSeek stream thinking)."""
        return self._head + b'{"reasoning_content":' + orjson.dumps(text) + b"}" + _OPEN_CHOICE_TAIL

    def tool_calls(self, calls: list[dict[str, Any]], first: int) -> bytes:
        """A delta with whole tool calls (each with its ``index`` in the answer, from
        ``first``): Ollama sends a call complete, so its name and arguments come at once."""
        delta = [{"index": first + offset, **call} for offset, call in enumerate(calls)]
        return self._head + b'{"tool_calls":' + orjson.dumps(delta) + b"}" + _OPEN_CHOICE_TAIL

    def finish(self, reason: str) -> bytes:
        """The finish frame: an empty delta with ``finish_reason``."""
        return (
            self._head + b'{},"logprobs":null,"finish_reason":' + orjson.dumps(reason) + b"}]}\n\n"
        )

    def usage(self, usage: Usage) -> bytes:
        """The usage-only frame (``choices: []``) sent when the client asked for usage."""
        frame = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [],
            "usage": usage_object(usage),
        }
        return b"data: " + orjson.dumps(frame) + b"\n\n"


def with_model(
    raw: bytes, parsed: dict[str, Any], model: str, whole: dict[str, Any] | None = None
) -> bytes:
    """``raw`` (the JSON of ``whole``, or of ``parsed`` when ``whole`` is None) with the
    ``model`` of ``parsed`` set to ``model``: ``parsed`` is the top-level object, or an object
    inside ``whole`` (a stream event's message or response).

    The upstream's ``"model":"<name>"`` is replaced in the bytes when the compact form occurs
    exactly once (a ``"model":`` inside a string would be escaped, so a single occurrence is the
    key); otherwise the object is re-encoded. Nothing is done when the name already matches.
    """
    current = parsed.get("model")
    if current == model:
        return raw
    if isinstance(current, str):
        needle = MODEL_KEY + orjson.dumps(current)
        at = raw.find(needle)
        if at >= 0 and raw.find(needle, at + 1) < 0:
            return raw[:at] + MODEL_KEY + orjson.dumps(model) + raw[at + len(needle) :]
    parsed["model"] = model
    return dumps(parsed if whole is None else whole)

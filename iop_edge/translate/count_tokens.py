"""The edge's estimate of a request's input tokens: the chat form's, and ``count_tokens``'.

One formula for every surface (the request path's admission estimate,
:func:`iop_edge.api.bodies.estimate_input_tokens`, calls :func:`estimate_chat_tokens` for a
chat body, so a Messages request is classed and checked against the context window exactly as
``/v1/messages/count_tokens`` counts it): ``ceil(B / 4) + 3 × M + 1600 × I``, where ``B``
counts the UTF-8 bytes of the message contents (strings and text parts), names, reasoning sent
back in history (``reasoning_content``), tool-call arguments and the JSON of the tools, ``M``
the messages and ``I`` the images:

- **images** count :data:`IMAGE_TOKENS` each (Anthropic's own figure for an image at its largest
  size, about 1.15 megapixels; the edge does not decode images, so every image counts at the
  bound — an upper estimate, which keeps a request of many images out of a general slot);
- **reasoning** sent back in history counts like text: the upstream reads it.

So the system prompt (the first message), every turn, the tool definitions, the tool calls and
the tool results all count. ``count_tokens``' body is translated as for ``/v1/messages``
(``max_tokens`` not required) and counted the same way (:func:`count_input_tokens`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from iop_edge.errors import RequestError
from iop_edge.translate.messages_request import translate_request
from iop_edge.translate.sse import dumps

__all__ = ["IMAGE_TOKENS", "PER_MESSAGE_TOKENS", "count_input_tokens", "estimate_chat_tokens"]

IMAGE_TOKENS: Final = 1600
PER_MESSAGE_TOKENS: Final = 3


def _text_bytes(value: object) -> int:
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8"))
    return 0


def _content(value: object) -> tuple[int, int]:
    """UTF-8 bytes of a message content's text, and its images."""
    if not isinstance(value, list):
        return _text_bytes(value), 0
    total = images = 0
    for part in value:
        if isinstance(part, str):
            total += _text_bytes(part)
        elif isinstance(part, Mapping):
            total += _text_bytes(part.get("text"))
            images += part.get("type") == "image_url"
    return total, images


def estimate_chat_tokens(chat: Mapping[str, Any]) -> int:
    """The estimated input tokens of a chat body (see the module docstring)."""
    total = images = 0
    messages = chat.get("messages") or ()
    for message in messages:
        size, seen = _content(message.get("content"))
        total += size + _text_bytes(message.get("name"))
        total += _text_bytes(message.get("reasoning_content"))
        images += seen
        for call in message.get("tool_calls") or ():
            if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
                total += _text_bytes(call["function"].get("arguments"))
        legacy = message.get("function_call")
        if isinstance(legacy, Mapping):
            total += _text_bytes(legacy.get("arguments"))
    tools = chat.get("tools")
    if tools:
        try:
            total += len(orjson.dumps(tools))
        except orjson.JSONEncodeError as exc:
            if "ecursion" in str(exc):  # (deeper than 254 levels: no upstream takes that)
                raise RequestError(
                    "invalid_request_error",
                    "'tools' is nested too deeply (more than 254 levels).",
                    param="tools",
                ) from None
            total += len(dumps(tools))  # (an integer beyond 64 bits, which json can write)
    return -(-total // 4) + PER_MESSAGE_TOKENS * len(messages) + IMAGE_TOKENS * images


def count_input_tokens(body: Mapping[str, Any]) -> int:
    """The estimated input tokens of a count_tokens body (a Messages request without
    ``max_tokens``); raises :class:`~iop_edge.errors.RequestError` as
    :func:`~iop_edge.translate.messages_request.translate_request` does."""
    return estimate_chat_tokens(translate_request(body, counting=True).chat)

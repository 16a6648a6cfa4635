"""The messages and the system prompt of an Anthropic Messages request, as chat messages.

Messages: ``user`` and ``assistant`` turns (and a ``system`` turn, should one come
mid-conversation). Content is a string or blocks:

- ``text`` → a text part (one text part alone becomes a plain string; several stay parts, as
  a chat client would send them); ``image`` (``source`` ``base64`` → a ``data:`` URL, ``url``
  → the URL) → an ``image_url`` part (user turns only);
- ``tool_use`` (assistant) → a tool call (``id``, ``name``, ``input`` as JSON text);
- ``tool_result`` (user) → a ``tool`` message, placed before the turn's other content (chat
  wants the results right after the calls): its text blocks joined by a newline, prefixed
  ``Error: `` when ``is_error`` is true (chat has no error flag; the model must still see it);
  images in a result go, in order, to a user message right after the tool messages (a chat
  tool message carries no image);
- ``thinking`` (assistant) → the turn's ``reasoning_content`` (several joined by a blank line),
  never its text; the ``signature`` is opaque and not forwarded (no chat upstream checks it);
- ``redacted_thinking`` → dropped: its ``data`` is encrypted for Anthropic's models and says
  nothing another model could read.

The system prompt (top-level ``system``, or a ``system`` turn): a string, or text blocks joined
by a blank line — all but the **billing header**, a text block whose text starts with
``x-anthropic-billing-header:`` (Claude Code sends one whose value changes with every request;
kept, it would change the prompt's first bytes and defeat every upstream prefix cache).

Dropped without a word: ``cache_control`` on any block (the upstreams cache prefixes by
themselves), a text block's ``citations``, and any key of a block or message not named above
(the API adds display and bookkeeping keys to blocks often; none of them changes what the model
reads). Anything else is a :class:`~iop_edge.errors.RequestError` naming its path
(``messages[3].content[1].type``), the value and the rule (built by
:mod:`iop_edge.translate.request_checks`, as for the whole request).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from iop_edge.errors import RequestError
from iop_edge.translate.chat_request import (
    assistant_message,
    image_part,
    message_content,
    text_part,
    tool_call,
    tool_message,
)
from iop_edge.translate.request_checks import object_at, refusal, shown, string_at
from iop_edge.translate.sse import dumps

__all__ = ["BILLING_HEADER", "system_text", "translate_messages"]

BILLING_HEADER: Final = "x-anthropic-billing-header:"
_IMAGE_SOURCES: Final = "base64 or url"


def _blocks(content: object, path: str) -> list[Mapping[str, Any]]:
    """The blocks of a ``content`` array, each checked to be an object with a string type."""
    if not isinstance(content, list):
        raise refusal(path, f"must be a string or an array of content blocks, not {shown(content)}")
    for index, block in enumerate(content):
        where = f"{path}[{index}]"
        if not isinstance(object_at(block, where).get("type"), str):
            raise refusal(f"{where}.type", f"must be a string, not {shown(block.get('type'))}")
    return content


def _unsupported(block: Mapping[str, Any], where: str, allowed: str) -> RequestError:
    return refusal(
        f"{where}.type",
        f"{block['type']!r} is not a block the edge translates here; it translates {allowed}",
    )


def system_text(content: object, path: str) -> str:
    """A system prompt (a string, or text blocks joined by a blank line, the billing header
    left out); ``path`` names it in errors."""
    if isinstance(content, str):
        return content
    texts = []
    for index, block in enumerate(_blocks(content, path)):
        where = f"{path}[{index}]"
        if block["type"] != "text":
            raise _unsupported(block, where, "text blocks in a system prompt")
        text = string_at(block.get("text"), f"{where}.text", empty=True)
        if not text.startswith(BILLING_HEADER):
            texts.append(text)
    return "\n\n".join(texts)


def _image_url(block: Mapping[str, Any], where: str) -> str:
    source = object_at(block.get("source"), f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        media = string_at(source.get("media_type"), f"{where}.source.media_type")
        if not media.startswith("image/"):
            raise refusal(f"{where}.source.media_type", f"{media!r} is not an image type (image/…)")
        data = string_at(source.get("data"), f"{where}.source.data")
        return f"data:{media};base64,{data}"
    if kind == "url":
        url = string_at(source.get("url"), f"{where}.source.url")
        if not url.startswith(("http://", "https://")):
            raise refusal(f"{where}.source.url", f"{shown(url)} is not an http(s) URL")
        return url
    raise refusal(
        f"{where}.source.type",
        f"{shown(kind)} is not an image source the edge translates ({_IMAGE_SOURCES}; a file id "
        "names a file stored at Anthropic)",
    )


def _tool_result(block: Mapping[str, Any], where: str) -> tuple[dict[str, Any], list[Any]]:
    """A ``tool_result`` block: its tool message and the image parts it carried."""
    call_id = string_at(block.get("tool_use_id"), f"{where}.tool_use_id")
    content = block.get("content")
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    if isinstance(content, str):
        texts.append(content)
    elif content is not None:
        for index, part in enumerate(_blocks(content, f"{where}.content")):
            at = f"{where}.content[{index}]"
            if part["type"] == "text":
                texts.append(string_at(part.get("text"), f"{at}.text", empty=True))
            elif part["type"] == "image":
                images.append(image_part(_image_url(part, at)))
            else:
                raise _unsupported(part, at, "text and image blocks in a tool result")
    text = "\n".join(texts)
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise refusal(f"{where}.is_error", f"must be a boolean, not {shown(is_error)}")
    return tool_message(call_id, f"Error: {text}" if is_error else text), images


def _user_turn(content: object, path: str) -> list[dict[str, Any]]:
    """A user turn: its tool messages first, then a user message with the rest (if any)."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tools: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for index, block in enumerate(_blocks(content, f"{path}.content")):
        where = f"{path}.content[{index}]"
        kind = block["type"]
        if kind == "text":
            parts.append(text_part(string_at(block.get("text"), f"{where}.text", empty=True)))
        elif kind == "image":
            parts.append(image_part(_image_url(block, where)))
        elif kind == "tool_result":
            message, carried = _tool_result(block, where)
            tools.append(message)
            images += carried
        else:
            raise _unsupported(block, where, "text, image and tool_result blocks in a user turn")
    if images or parts:
        return [*tools, {"role": "user", "content": message_content(images + parts)}]
    return tools if tools else [{"role": "user", "content": ""}]


def _assistant_turn(content: object, path: str) -> dict[str, Any]:
    """An assistant turn: text, reasoning (``reasoning_content``) and tool calls."""
    if isinstance(content, str):
        return assistant_message(content, "", [])
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(_blocks(content, f"{path}.content")):
        where = f"{path}.content[{index}]"
        kind = block["type"]
        if kind == "text":
            texts.append(string_at(block.get("text"), f"{where}.text", empty=True))
        elif kind == "thinking":
            thoughts.append(string_at(block.get("thinking"), f"{where}.thinking", empty=True))
        elif kind == "redacted_thinking":
            continue  # (encrypted for Anthropic's models: nothing another model can read)
        elif kind == "tool_use":
            call_id = string_at(block.get("id"), f"{where}.id")
            name = string_at(block.get("name"), f"{where}.name")
            arguments = dumps(object_at(block.get("input"), f"{where}.input")).decode()
            calls.append(tool_call(call_id, name, arguments))
        else:
            raise _unsupported(
                block,
                where,
                "text, thinking, redacted_thinking and tool_use blocks in an assistant turn",
            )
    return assistant_message("".join(texts), "\n\n".join(thoughts), calls)


def translate_messages(value: object) -> list[dict[str, Any]]:
    """The chat messages of a request's ``messages`` (see the module docstring)."""
    if not isinstance(value, list) or not value:
        raise refusal("messages", f"must be a non-empty array of messages, not {shown(value)}")
    converted: list[dict[str, Any]] = []
    for index, message in enumerate(value):
        path = f"messages[{index}]"
        role = object_at(message, path).get("role")
        content = message.get("content")
        if role == "user":
            converted += _user_turn(content, path)
        elif role == "assistant":
            converted.append(_assistant_turn(content, path))
        elif role == "system":
            converted.append({"role": "system", "content": system_text(content, path)})
        else:
            raise refusal(f"{path}.role", f"{shown(role)} is not a role; use user or assistant")
    return converted

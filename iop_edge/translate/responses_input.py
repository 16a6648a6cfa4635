"""The input items of an OpenAI Responses request (and its stored history), as chat messages.

The conversation is the stored history's items (``history[i]``: the previous response's input
and output items, when the request continues one) followed by the request's ``input``
(``input[i]``; a string is one user message), translated in order:

- ``message`` (``type`` may be left out): ``user`` → a user message; ``system`` and
  ``developer`` → a ``system`` message (chat upstreams know no developer role), joined with
  a blank line to a system message right before it (several system prompts in a row are one:
  many chat templates take a single one); ``assistant`` → an assistant message. Content is a
  string or parts: ``input_text`` and ``output_text`` (any role), ``refusal`` (assistant: its
  text), ``input_image`` (user: ``image_url``, an ``http(s)`` or ``data:`` URL; ``detail`` is
  dropped). A user message of one text part is a plain string, of several the parts; a system
  or assistant message's text parts are joined by a newline. ``id``, ``status`` and ``phase``
  are bookkeeping and dropped.
- ``function_call`` → a tool call (``call_id`` its id, ``name``, ``arguments`` as given) of an
  assistant message: of the assistant message or call right before it (consecutive calls, and
  calls right after the text they follow, are one assistant turn, as chat has it), else of an
  assistant message of their own (``content`` null).
- ``function_call_output`` → a ``tool`` message for ``call_id``: the output string, or its
  ``input_text`` parts joined by a newline; its ``input_image`` parts go, in order, to a user
  message right after the run of tool messages (a chat tool message carries no image).
- ``reasoning`` → the ``reasoning_content`` of the assistant message that follows (several
  joined by a blank line), or of an assistant message of its own when none follows; never
  text. Its text is its ``content`` (``reasoning_text`` parts), else what the edge sealed in
  its ``encrypted_content`` (:func:`~iop_edge.translate.responses_reply.open_reasoning`),
  else its ``summary`` texts. Another ``encrypted_content`` (OpenAI's) cannot be decrypted
  and is dropped: the upstream then does not see that reasoning.

Refused, each a 400 naming the path, the value and the rule: ``item_reference`` (it points at
an item stored at OpenAI; the edge keeps no items by id), ``input_image`` with a ``file_id``
and ``input_file`` (files stored at OpenAI, or documents the edge does not read),
``input_audio``, and every item of a built-in tool (``web_search_call``, ``computer_call``,
``local_shell_call``, ``custom_tool_call``, ``mcp_call``, ``compaction``…: the edge translates
no built-in tool, so none can be in a conversation it serves).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from iop_edge.translate.chat_request import (
    assistant_message,
    image_part,
    message_content,
    text_part,
    tool_call,
    tool_message,
)
from iop_edge.translate.request_checks import object_at, refusal, shown, string_at
from iop_edge.translate.responses_reply import open_reasoning

__all__ = ["input_items", "translate_items"]

_ROLES: Final = ("user", "assistant", "system", "developer")
_TEXT_PARTS: Final = frozenset({"input_text", "output_text"})
_ITEMS: Final = "message, function_call, function_call_output and reasoning items"


def input_items(value: object, *, continued: bool = False) -> tuple[dict[str, Any], ...]:
    """A request's ``input`` as items: a string is one user message; each item of an array is
    checked to be an object (a message given without ``type`` gets ``"type": "message"``).
    ``continued``: the request continues a stored response, so its input may be empty."""
    if isinstance(value, str):
        text = {"type": "input_text", "text": value}
        return ({"type": "message", "role": "user", "content": [text]},)
    if not isinstance(value, list) or (not value and not continued):
        raise refusal(
            "input", f"must be a string or a non-empty array of items, not {shown(value)}"
        )
    items = []
    for index, item in enumerate(value):
        item = dict(object_at(item, f"input[{index}]"))
        if item.get("type") is None and "role" in item:
            item["type"] = "message"
        items.append(item)
    return tuple(items)


def _texts(parts: object, path: str, allowed: frozenset[str]) -> list[str]:
    """The texts of a part list whose parts may only be of the ``allowed`` text types."""
    if not isinstance(parts, list):
        raise refusal(path, f"must be a string or an array of content parts, not {shown(parts)}")
    texts = []
    for index, part in enumerate(parts):
        where = f"{path}[{index}]"
        kind = object_at(part, where).get("type")
        if kind not in allowed:
            raise _unsupported_part(kind, where, allowed)
        field = "refusal" if kind == "refusal" else "text"
        texts.append(string_at(part.get(field), f"{where}.{field}", empty=True))
    return texts


def _unsupported_part(kind: object, where: str, allowed: frozenset[str]) -> Exception:
    if kind == "input_file":
        why = "a file (stored at OpenAI, or a document) is not translated; send its text"
    elif kind == "input_audio":
        why = "audio is not translated; the upstreams read text and images"
    else:
        why = f"it is not a content part the edge translates here ({', '.join(sorted(allowed))})"
    return refusal(f"{where}.type", f"{shown(kind)}: {why}")


def _image_url(part: Mapping[str, Any], where: str) -> str:
    url = part.get("image_url")
    if url is None and part.get("file_id") is not None:
        raise refusal(
            f"{where}.file_id",
            f"{shown(part['file_id'])} names a file stored at OpenAI, which the edge cannot "
            "read; send the image as image_url (a data: URL)",
        )
    url = string_at(url, f"{where}.image_url")
    if not url.startswith(("http://", "https://", "data:")):
        raise refusal(f"{where}.image_url", f"{shown(url)} is not an http(s) or data: URL")
    return url


def _user_content(content: object, path: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise refusal(path, f"must be a string or an array of content parts, not {shown(content)}")
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        where = f"{path}[{index}]"
        kind = object_at(part, where).get("type")
        if kind in _TEXT_PARTS:
            parts.append(text_part(string_at(part.get("text"), f"{where}.text", empty=True)))
        elif kind == "input_image":
            parts.append(image_part(_image_url(part, where)))
        else:
            raise _unsupported_part(kind, where, _TEXT_PARTS | {"input_image"})
    return message_content(parts) if parts else ""


def _function_output(item: Mapping[str, Any], path: str) -> tuple[str, list[dict[str, Any]]]:
    """A ``function_call_output``'s text and the image parts it carried."""
    output = item.get("output")
    if isinstance(output, str):
        return output, []
    if not isinstance(output, list):
        raise refusal(
            f"{path}.output", f"must be a string or an array of content parts, not {shown(output)}"
        )
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    for index, part in enumerate(output):
        where = f"{path}.output[{index}]"
        kind = object_at(part, where).get("type")
        if kind in _TEXT_PARTS:
            texts.append(string_at(part.get("text"), f"{where}.text", empty=True))
        elif kind == "input_image":
            images.append(image_part(_image_url(part, where)))
        else:
            raise _unsupported_part(kind, where, frozenset({"input_text", "input_image"}))
    return "\n".join(texts), images


def _reasoning_text(item: Mapping[str, Any], path: str) -> str:
    """A reasoning item's text (module docstring); ``""`` when it carries none readable."""
    content = item.get("content")
    if content is not None:
        kinds = frozenset({"reasoning_text", "text"})
        texts = _texts(content, f"{path}.content", kinds)
        if texts:
            return "\n\n".join(texts)
    sealed = item.get("encrypted_content")
    if sealed is not None:
        try:
            opened = open_reasoning(string_at(sealed, f"{path}.encrypted_content", empty=True))
        except ValueError as exc:
            raise refusal(f"{path}.encrypted_content", f"{shown(sealed)}: {exc}") from None
        if opened is not None:
            return opened
    summary = item.get("summary")
    if summary is None:
        return ""
    return "\n\n".join(_texts(summary, f"{path}.summary", frozenset({"summary_text"})))


class _Conversation:
    """The chat messages being built, with what the next item may join."""

    __slots__ = ("images", "messages", "open_turn", "reasoning")

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.reasoning: list[str] = []  # reasoning waiting for the assistant message it precedes
        self.open_turn: dict[str, Any] | None = None  # an assistant message calls may join
        self.images: list[dict[str, Any]] = []  # images of the tool messages just added

    def add(self, message: dict[str, Any]) -> None:
        """Append a message that is not a tool message: the tool messages' images, then the
        reasoning that no assistant message took, go first."""
        if self.images:
            self.messages.append({"role": "user", "content": message_content(self.images)})
            self.images = []
        if self.reasoning and message["role"] != "assistant":
            self.messages.append(assistant_message("", self._take_reasoning(), []))
        self.open_turn = None
        self.messages.append(message)

    def _take_reasoning(self) -> str:
        text = "\n\n".join(self.reasoning)
        self.reasoning = []
        return text

    def message(self, item: Mapping[str, Any], path: str) -> None:
        role = item.get("role")
        content = item.get("content")
        where = f"{path}.content"
        if role == "user":
            self.add({"role": "user", "content": _user_content(content, where)})
        elif role in ("system", "developer"):
            text = (
                content
                if isinstance(content, str)
                else "\n".join(_texts(content, where, _TEXT_PARTS))
            )
            last = self.messages[-1] if self.messages else None
            if (
                last is not None
                and last["role"] == "system"
                and not self.images
                and not self.reasoning
            ):
                last["content"] = f"{last['content']}\n\n{text}"
            else:
                self.add({"role": "system", "content": text})
        elif role == "assistant":
            kinds = _TEXT_PARTS | {"refusal"}
            text = content if isinstance(content, str) else "\n".join(_texts(content, where, kinds))
            turn = assistant_message(text, self._take_reasoning(), [])
            self.add(turn)
            self.open_turn = turn
        else:
            raise refusal(f"{path}.role", f"{shown(role)} is not one of {', '.join(_ROLES)}")

    def function_call(self, item: Mapping[str, Any], path: str) -> None:
        call = tool_call(
            string_at(item.get("call_id"), f"{path}.call_id"),
            string_at(item.get("name"), f"{path}.name"),
            string_at(item.get("arguments"), f"{path}.arguments", empty=True),
        )
        turn = self.open_turn
        if turn is None:
            turn = assistant_message("", self._take_reasoning(), [call])
            self.add(turn)
            self.open_turn = turn
        else:
            turn.setdefault("tool_calls", []).append(call)
            if not turn["content"]:
                turn["content"] = None

    def function_output(self, item: Mapping[str, Any], path: str) -> None:
        call_id = string_at(item.get("call_id"), f"{path}.call_id")
        text, images = _function_output(item, path)
        if self.reasoning:
            self.messages.append(assistant_message("", self._take_reasoning(), []))
        self.open_turn = None
        self.messages.append(tool_message(call_id, text))
        self.images += images

    def finish(self) -> list[dict[str, Any]]:
        """The messages, with what is left at the end: the last tool messages' images, or
        reasoning that no assistant message followed."""
        if self.images:
            self.messages.append({"role": "user", "content": message_content(self.images)})
            self.images = []
        if self.reasoning:
            self.messages.append(assistant_message("", self._take_reasoning(), []))
        return self.messages


def translate_items(
    items: Sequence[tuple[str, Mapping[str, Any]]], *, instructions: str = ""
) -> list[dict[str, Any]]:
    """The chat messages of a conversation's items, each with its path (``input[3]``,
    ``history[0]``) for the errors, after the ``instructions`` as a first system message
    (none when empty; see the module docstring)."""
    conversation = _Conversation()
    if instructions:
        conversation.add({"role": "system", "content": instructions})
    for path, item in items:
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        if kind == "message":
            conversation.message(item, path)
        elif kind == "function_call":
            conversation.function_call(item, path)
        elif kind == "function_call_output":
            conversation.function_output(item, path)
        elif kind == "reasoning":
            text = _reasoning_text(item, path)
            if text:
                conversation.reasoning.append(text)
                conversation.open_turn = None  # (a new assistant turn begins with its reasoning)
        elif kind == "item_reference":
            raise refusal(
                f"{path}.type",
                "'item_reference' points at an item stored at OpenAI, and the edge keeps no "
                "items by id; send the item itself, or continue a response with "
                "previous_response_id",
            )
        elif isinstance(kind, str):
            raise refusal(
                f"{path}.type",
                f"{kind!r} is not an item the edge translates (an item of a built-in tool, which "
                f"the edge does not run); it translates {_ITEMS}",
            )
        else:
            raise refusal(f"{path}.type", f"must be a string, not {shown(kind)}")
    return conversation.finish()

"""The internal form of a request: an OpenAI chat body, plus what chat cannot say.

A surface (Anthropic Messages, later OpenAI Responses) parses its body into an
:class:`InternalRequest`; the request path, admission and the adapters see only its ``chat``
body, exactly as if a chat client had sent it (so ``fields.refusal`` refuses, per adapter, a
field the adapter cannot honour, e.g. ``top_k`` on ``ollama``). The chat messages are built
here, once for every surface:

- an assistant turn's reasoning goes in ``reasoning_content`` (what vLLM and llama.cpp take
  back; never mixed into ``content``), its tool calls in ``tool_calls`` with ``arguments`` as a
  JSON string, and ``content`` is ``null`` when it has tool calls and no text (as OpenAI
  sends it);
- a tool's result is a ``role: "tool"`` message with its ``tool_call_id``;
- images are ``image_url`` content parts (``data:`` URLs for inline images).

The reasoning a client asks for is not a chat field: it travels beside the body as a
:class:`ReasoningRequest`, and the shell maps it to the model group's policy (a thinking token
budget, ``reasoning_effort``...) — this package does not guess the upstream's field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = [
    "InternalRequest",
    "ReasoningEffort",
    "ReasoningMode",
    "ReasoningRequest",
    "apply_reasoning",
    "assistant_message",
    "function_tool",
    "image_part",
    "message_content",
    "text_part",
    "tool_call",
    "tool_message",
]

#: ``disabled``: no reasoning; ``enabled``: reasoning (within ``budget_tokens`` when given);
#: ``adaptive``: the model decides whether and how much.
ReasoningMode = Literal["disabled", "enabled", "adaptive"]
#: How much effort the client asks for (Anthropic's ``output_config.effort``: low … max;
#: OpenAI's ``reasoning_effort``: minimal … high).
ReasoningEffort = Literal["minimal", "low", "medium", "high", "xhigh", "max"]


@dataclass(frozen=True, slots=True)
class ReasoningRequest:
    """The reasoning a client asked for, surface-neutral (``None`` fields: not said)."""

    mode: ReasoningMode | None = None
    budget_tokens: int | None = None
    effort: ReasoningEffort | None = None


@dataclass(frozen=True, slots=True)
class InternalRequest:
    """A surface's request in the internal form.

    ``chat`` is the chat body (its ``model`` the id the client asked for: the shell resolves
    aliases as for chat); ``model`` that id, for the answer; ``reasoning`` ``None`` when the
    client said nothing about reasoning (the group's default applies); ``stop_sequences`` the
    client's, to name the one that ended an answer; ``dropped`` the top-level fields that were
    accepted and not forwarded (documented per surface), for the request's log line.
    """

    chat: dict[str, Any]
    model: str
    stream: bool
    reasoning: ReasoningRequest | None
    stop_sequences: tuple[str, ...]
    dropped: tuple[str, ...]


def text_part(text: str) -> dict[str, Any]:
    """A chat ``text`` content part."""
    return {"type": "text", "text": text}


def image_part(url: str) -> dict[str, Any]:
    """A chat ``image_url`` content part (``url`` a ``data:`` URL or an ``http(s)`` URL)."""
    return {"type": "image_url", "image_url": {"url": url}}


def message_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A message's chat content: one text part alone as a plain string (as a chat client sends
    it), else the parts."""
    if len(parts) == 1 and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    return parts


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """A chat tool call (``arguments``: the JSON text of the input object)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant_message(text: str, reasoning: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat assistant turn: its text, its reasoning in ``reasoning_content`` (when any), its
    tool calls (when any; ``content`` is then ``null`` without text)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
        if not text:
            message["content"] = None
    return message


def tool_message(call_id: str, content: str) -> dict[str, Any]:
    """A chat ``tool`` message: the result of the call ``call_id``."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def function_tool(
    name: str, description: str | None, parameters: dict[str, Any], strict: bool | None
) -> dict[str, Any]:
    """A chat function tool."""
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    function["parameters"] = parameters
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


_CHAT_EFFORTS: Final = {"minimal": "minimal", "low": "low", "medium": "medium", "high": "high"}


def apply_reasoning(chat: dict[str, Any], reasoning: ReasoningRequest | None) -> None:
    """The client's reasoning request as the internal form's fields, in place: a budget is
    ``thinking_token_budget`` (so it replaces the model group's
    ``default_thinking_token_budget``), ``disabled`` a budget of 0, ``adaptive`` leaves the
    group's default; an effort is ``reasoning_effort`` (``xhigh`` and ``max``, which OpenAI's
    field does not have, as ``high``)."""
    if reasoning is None:
        return
    if reasoning.mode == "enabled" and reasoning.budget_tokens is not None:
        chat["thinking_token_budget"] = reasoning.budget_tokens
    elif reasoning.mode == "disabled":
        chat["thinking_token_budget"] = 0
    if reasoning.effort is not None:
        chat["reasoning_effort"] = _CHAT_EFFORTS.get(reasoning.effort, "high")

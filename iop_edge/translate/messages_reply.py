"""A whole answer (:class:`~iop_edge.translate.events.Answer`) as an Anthropic Message.

``{"id", "type": "message", "role": "assistant", "model", "content", "stop_reason",
"stop_sequence", "usage"}``:

- ``id``: ``msg_`` and the chat id without its ``chatcmpl-`` prefix (characters other than
  letters, digits, ``_`` and ``-`` become ``_``): ``chatcmpl-<request id>`` for ``ollama`` and
  ``cli``, the upstream's id for ``openai_compat``;
- ``model``: the model the client asked for, whichever provider answered;
- ``content``: a ``thinking`` block (the reasoning), a ``text`` block, then one ``tool_use``
  block per call, each only when there is one. A tool call keeps the upstream's id (the
  client sends it back in its ``tool_result``, and the upstream's chat template may expect its
  own form), else gets ``toolu_<message id>_<n>``; its ``input`` is the arguments parsed (they
  were checked to be a JSON object when decoded: anything else failed the answer, never
  silently). A thinking block's ``signature`` is ``iop-edge.`` and the first 32 hex digits of
  the SHA-256 of its text: opaque, stable, and not empty (clients keep blocks by it); nothing
  checks it when the block comes back;
- ``stop_reason``: ``stop`` → ``end_turn``, or ``stop_sequence`` (with ``stop_sequence`` set)
  when the upstream names the stop string that ended it and it is one the client sent;
  ``length`` → ``max_tokens``; ``tool_calls`` → ``tool_use``; ``content_filter`` →
  ``refusal``;
- ``usage``: ``input_tokens`` (the upstream's prompt tokens less those read from its cache),
  ``output_tokens``, and ``cache_read_input_tokens`` when the upstream reports cached tokens
  (it never reports cache writes: ``cache_creation_input_tokens`` is left out). When the
  upstream reports no usage, ``input_tokens`` is the edge's estimate of the request and
  ``output_tokens`` one token per 4 UTF-8 bytes of the answer (text, reasoning and tool
  arguments), as for a ``cli`` provider.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any, Final, Literal

import orjson

from iop_edge.translate.events import Answer, Finish, TokenUsage
from iop_edge.translate.sse import dumps

__all__ = [
    "StopReason",
    "anthropic_usage",
    "message_body",
    "message_id",
    "render_message",
    "stop_reason",
    "text_bytes",
    "thinking_signature",
    "tool_use_id",
]

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"]
_STOP_REASONS: Final[dict[str, StopReason]] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_-]")
_CHAT_PREFIX: Final = "chatcmpl-"
SIGNATURE_PREFIX: Final = "iop-edge."


def message_id(answer_id: str) -> str:
    """The Message id of the answer whose chat id is ``answer_id``."""
    core = answer_id.removeprefix(_CHAT_PREFIX)
    return "msg_" + (_UNSAFE.sub("_", core) if core else "unidentified")


def tool_use_id(call_id: str, message: str, ordinal: int) -> str:
    """A ``tool_use`` block's id: the upstream's call id, else one made from the message id
    and the call's place in the answer."""
    return call_id or f"toolu_{message.removeprefix('msg_')}_{ordinal}"


def thinking_signature(thinking: str) -> str:
    """The opaque ``signature`` of a thinking block the edge produced."""
    return SIGNATURE_PREFIX + hashlib.sha256(thinking.encode()).hexdigest()[:32]


def stop_reason(finish: Finish, stop_sequences: Sequence[str]) -> tuple[StopReason, str | None]:
    """``stop_reason`` and ``stop_sequence`` of a finished answer."""
    if finish.reason == "stop" and finish.stop_sequence in stop_sequences:
        return "stop_sequence", finish.stop_sequence
    return _STOP_REASONS[finish.reason], None


def text_bytes(text: str) -> int:
    """UTF-8 bytes of ``text`` (the output estimate's unit)."""
    return len(text) if text.isascii() else len(text.encode())


def anthropic_usage(
    usage: TokenUsage | None, estimated_input_tokens: int, output_bytes: int
) -> dict[str, int]:
    """The Message's ``usage`` (see the module docstring)."""
    prompt = usage.prompt_tokens if usage is not None else None
    cached = usage.cached_tokens if usage is not None else None
    completion = usage.completion_tokens if usage is not None else None
    counts = {
        "input_tokens": max(prompt - (cached or 0), 0)
        if prompt is not None
        else estimated_input_tokens,
        "output_tokens": completion if completion is not None else -(-output_bytes // 4),
    }
    if cached is not None and prompt is not None:
        counts["cache_read_input_tokens"] = cached
    return counts


def render_message(
    answer: Answer,
    *,
    model: str,
    estimated_input_tokens: int,
    stop_sequences: Sequence[str] = (),
) -> dict[str, Any]:
    """The Anthropic Message of ``answer``; ``model`` is the model the client asked for and
    ``estimated_input_tokens`` the edge's estimate of the request (used when the upstream
    reported no usage)."""
    identifier = message_id(answer.answer_id)
    content: list[dict[str, Any]] = []
    if answer.reasoning:
        content.append(
            {
                "type": "thinking",
                "thinking": answer.reasoning,
                "signature": thinking_signature(answer.reasoning),
            }
        )
    if answer.text:
        content.append({"type": "text", "text": answer.text})
    output = text_bytes(answer.text) + text_bytes(answer.reasoning)
    for ordinal, call in enumerate(answer.tool_calls):
        output += text_bytes(call.arguments)
        content.append(
            {
                "type": "tool_use",
                "id": tool_use_id(call.call_id, identifier, ordinal),
                "name": call.name,
                "input": orjson.loads(call.arguments),
            }
        )
    reason, sequence = stop_reason(answer.finish, stop_sequences)
    return {
        "id": identifier,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": anthropic_usage(answer.finish.usage, estimated_input_tokens, output),
    }


def message_body(
    answer: Answer,
    *,
    model: str,
    estimated_input_tokens: int,
    stop_sequences: Sequence[str] = (),
) -> bytes:
    """:func:`render_message` as the JSON body of the answer."""
    return dumps(
        render_message(
            answer,
            model=model,
            estimated_input_tokens=estimated_input_tokens,
            stop_sequences=stop_sequences,
        )
    )

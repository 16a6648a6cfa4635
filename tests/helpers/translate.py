"""Builders for the translation tests: one answer planned once, then given as an adapter gives
it — streamed (``chat.completion.chunk`` frames, as ``openai_compat`` relays them) and whole (a
``chat.completion``) — and a checker of the Messages stream grammar."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True)
class Call:
    """A planned tool call: its id (``""``: the upstream gives none), name and the fragments its
    arguments stream in."""

    call_id: str
    name: str
    fragments: tuple[str, ...]


#: ("text" | "reasoning", piece) or a tool call
Piece = tuple[str, str] | Call


@dataclass(frozen=True)
class Plan:
    """One answer: its pieces in order, how it ends, and its usage (None: none reported)."""

    pieces: tuple[Piece, ...]
    finish: str = "stop"
    usage: dict[str, Any] | None = None
    stop_reason: str | None = None
    chat_id: str = "chatcmpl-test1"


def _chunk(plan: Plan, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish is not None and plan.stop_reason is not None:
        choice["stop_reason"] = plan.stop_reason
    return {
        "id": plan.chat_id,
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "upstream-name",
        "choices": [choice],
    }


def chunks(plan: Plan) -> list[dict[str, Any]]:
    """The answer streamed: a role chunk, one chunk per piece or argument fragment (a call's
    first chunk names it), a finish chunk, and a usage-only chunk when there is usage."""
    out = [_chunk(plan, {"role": "assistant", "content": ""})]
    calls = 0
    for piece in plan.pieces:
        if isinstance(piece, Call):
            first = {
                "index": calls,
                "id": piece.call_id or None,
                "type": "function",
                "function": {"name": piece.name, "arguments": ""},
            }
            out.append(_chunk(plan, {"tool_calls": [first]}))
            for fragment in piece.fragments:
                item = {"index": calls, "function": {"arguments": fragment}}
                out.append(_chunk(plan, {"tool_calls": [item]}))
            calls += 1
        else:
            kind, text = piece
            field = "content" if kind == "text" else "reasoning_content"
            out.append(_chunk(plan, {field: text}))
    out.append(_chunk(plan, {}, plan.finish))
    if plan.usage is not None:
        out.append({**_chunk(plan, {}), "choices": [], "usage": plan.usage})
    return out


def frames(plan: Plan) -> bytes:
    """:func:`chunks` as the SSE bytes of an adapter, ending with ``data: [DONE]``."""
    body = b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks(plan))
    return body + b"data: [DONE]\n\n"


def completion(plan: Plan) -> dict[str, Any]:
    """The same answer whole, as a ``chat.completion``."""
    text = "".join(p[1] for p in plan.pieces if not isinstance(p, Call) and p[0] == "text")
    reasoning = "".join(
        p[1] for p in plan.pieces if not isinstance(p, Call) and p[0] == "reasoning"
    )
    calls = [
        {
            "id": p.call_id or None,
            "type": "function",
            "function": {"name": p.name, "arguments": "".join(p.fragments)},
        }
        for p in plan.pieces
        if isinstance(p, Call)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": plan.finish}
    if plan.stop_reason is not None:
        choice["stop_reason"] = plan.stop_reason
    body: dict[str, Any] = {
        "id": plan.chat_id,
        "object": "chat.completion",
        "created": 1,
        "model": "upstream-name",
        "choices": [choice],
    }
    if plan.usage is not None:
        body["usage"] = plan.usage
    return body


_DELTA_OF = {
    "text": {"text_delta"},
    "thinking": {"thinking_delta", "signature_delta"},
    "tool_use": {"input_json_delta"},
}


def check_grammar(events: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """Assert that ``events`` follow the Messages stream grammar (messages_stream's docstring):
    message_start first; blocks indexed 0, 1, 2… in start order, each closed before the next
    opens, deltas of the block's kind, a signature_delta only last in a thinking block;
    message_delta and message_stop last — or an error event last and no message_stop."""
    assert events, "no events"
    for name, payload in events:
        assert payload["type"] == name
    name, payload = events[0]
    assert name == "message_start"
    message = payload["message"]
    assert message["content"] == []
    assert message["stop_reason"] is None
    assert type(message["usage"]["input_tokens"]) is int
    assert type(message["usage"]["output_tokens"]) is int
    expected_index = 0
    open_kind: str | None = None
    signed = False
    ended = False
    for position, (name, payload) in enumerate(events[1:], start=1):
        assert not ended, f"event {position} ({name}) after the stream ended"
        if name == "error":
            assert position == len(events) - 1, "the error event is not the last"
            assert set(payload["error"]) == {"type", "message"}
            return
        if name == "content_block_start":
            assert open_kind is None, f"block {expected_index} opens before the last closed"
            assert payload["index"] == expected_index
            open_kind = payload["content_block"]["type"]
            signed = False
        elif name == "content_block_delta":
            assert open_kind is not None
            assert payload["index"] == expected_index
            kind = payload["delta"]["type"]
            assert kind in _DELTA_OF[open_kind], f"{kind} in a {open_kind} block"
            assert not signed, "a delta after the signature"
            signed = kind == "signature_delta"
        elif name == "content_block_stop":
            assert open_kind is not None
            assert payload["index"] == expected_index
            open_kind = None
            expected_index += 1
        elif name == "message_delta":
            assert open_kind is None, "message_delta with a block open"
            assert payload["delta"]["stop_reason"] is not None
            assert type(payload["usage"]["output_tokens"]) is int
        elif name == "message_stop":
            assert events[position - 1][0] == "message_delta"
            ended = True
        else:
            raise AssertionError(f"unexpected event {name}")
    assert ended, "the stream ended neither with message_stop nor with error"

"""Whole answers rendered as Anthropic Messages (messages_reply)."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest

from iop_edge.translate.events import Answer, Finish, TokenUsage, ToolCall
from iop_edge.translate.messages_reply import (
    message_body,
    message_id,
    render_message,
    stop_reason,
)


def answer(**fields: Any) -> Answer:
    base = {
        "answer_id": "chatcmpl-abc",
        "text": "",
        "reasoning": "",
        "tool_calls": (),
        "finish": Finish("stop", None, TokenUsage(12, 5)),
    }
    return Answer(**{**base, **fields})


def test_blocks_come_thinking_first_then_text_then_tool_uses_with_parsed_input():
    message = render_message(
        answer(
            text="Reading it.",
            reasoning="I should read.",
            tool_calls=(
                ToolCall("call_9", "Read", '{"file_path": "a.py", "n": [1, 2]}'),
                ToolCall("", "List", "{}"),
            ),
            finish=Finish("tool_calls", None, TokenUsage(12, 5)),
        ),
        model="claude-sonnet-4-5",
        estimated_input_tokens=99,
    )
    digest = hashlib.sha256(b"I should read.").hexdigest()[:32]
    assert message == {
        "id": "msg_abc",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [
            {"type": "thinking", "thinking": "I should read.", "signature": f"iop-edge.{digest}"},
            {"type": "text", "text": "Reading it."},
            {
                "type": "tool_use",
                "id": "call_9",
                "name": "Read",
                "input": {"file_path": "a.py", "n": [1, 2]},
            },
            {"type": "tool_use", "id": "toolu_abc_1", "name": "List", "input": {}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 5},
    }


@pytest.mark.parametrize(
    ("finish", "stops", "expected"),
    [
        (Finish("stop"), (), ("end_turn", None)),
        (Finish("length"), (), ("max_tokens", None)),
        (Finish("tool_calls"), (), ("tool_use", None)),
        (Finish("content_filter"), (), ("refusal", None)),
        (Finish("stop", "END"), ("END", "###"), ("stop_sequence", "END")),
        # A stop string the client did not send (the model's own end marker): a natural end.
        (Finish("stop", "<|im_end|>"), ("END",), ("end_turn", None)),
        (Finish("stop", "END"), (), ("end_turn", None)),
    ],
)
def test_stop_reason(finish, stops, expected):
    assert stop_reason(finish, stops) == expected


def test_cached_prompt_tokens_are_cache_reads_outside_input_tokens():
    message = render_message(
        answer(text="x", finish=Finish("stop", None, TokenUsage(100, 3, cached_tokens=80))),
        model="m",
        estimated_input_tokens=1,
    )
    assert message["usage"] == {
        "input_tokens": 20,
        "output_tokens": 3,
        "cache_read_input_tokens": 80,
    }


def test_without_reported_usage_the_edge_estimates_both_counts():
    message = render_message(
        answer(
            text="a" * 9,
            reasoning="é",  # (2 bytes)
            tool_calls=(ToolCall("c", "f", '{"k":1}'),),  # (7 bytes)
            finish=Finish("tool_calls", None, None),
        ),
        model="m",
        estimated_input_tokens=42,
    )
    assert message["usage"] == {"input_tokens": 42, "output_tokens": 5}  # ceil(18 / 4)


def test_an_empty_answer_has_no_blocks():
    assert render_message(answer(), model="m", estimated_input_tokens=1)["content"] == []


@pytest.mark.parametrize(
    ("chat_id", "expected"),
    [
        ("chatcmpl-0f1e", "msg_0f1e"),
        ("chatcmpl-tool/ab c", "msg_tool_ab_c"),
        ("resp-7", "msg_resp-7"),
        ("", "msg_unidentified"),
    ],
)
def test_message_id_is_made_from_the_chat_id(chat_id, expected):
    assert message_id(chat_id) == expected


def test_message_body_is_the_json_of_the_message():
    whole = answer(text="hi")
    assert orjson.loads(message_body(whole, model="m", estimated_input_tokens=1)) == render_message(
        whole, model="m", estimated_input_tokens=1
    )

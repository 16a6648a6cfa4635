"""Whole answers rendered as OpenAI Responses ``response`` objects (responses_reply)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from iop_edge.translate.events import Answer, Finish, TokenUsage, ToolCall
from iop_edge.translate.responses_reply import (
    RESPONSE_DEFAULTS,
    open_reasoning,
    output_items,
    render_response,
    response_body,
    response_error,
    seal_reasoning,
)

FIELDS: dict[str, Any] = {
    "response_id": "resp_01j9",
    "created_at": 1_700_000_123,
    "model": "gpt-oss-20b",
    "echo": {},
    "estimated_input_tokens": 40,
}


def answer(**fields: Any) -> Answer:
    base = {
        "answer_id": "chatcmpl-upstream",
        "text": "",
        "reasoning": "",
        "tool_calls": (),
        "finish": Finish("stop", None, TokenUsage(12, 5)),
    }
    return Answer(**{**base, **fields})


def test_output_is_reasoning_then_the_message_then_one_function_call_per_call():
    response = render_response(
        answer(
            text="Reading both.",
            reasoning="Two files.",
            tool_calls=(ToolCall("call_9", "read", '{"path": "a.py"}'), ToolCall("", "ls", "{}")),
            finish=Finish("tool_calls", None, TokenUsage(12, 5)),
        ),
        **FIELDS,
    )
    assert response["output"] == [
        {
            "id": "rs_01j9_0",
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Two files."}],
        },
        {
            "id": "msg_01j9_1",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "Reading both.", "annotations": [], "logprobs": []}
            ],
        },
        {
            "id": "fc_01j9_2",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_9",
            "name": "read",
            "arguments": '{"path": "a.py"}',
        },
        {
            "id": "fc_01j9_3",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_01j9_1",
            "name": "ls",
            "arguments": "{}",
        },
    ]
    assert response["status"] == "completed"
    assert response["incomplete_details"] is None


def test_items_are_there_only_when_the_answer_has_them_and_ids_follow_their_place():
    assert render_response(answer(text="Hi"), **FIELDS)["output"][0]["id"] == "msg_01j9_0"
    calls_only = render_response(
        answer(tool_calls=(ToolCall("c", "f", "{}"),), finish=Finish("tool_calls")), **FIELDS
    )
    assert [item["id"] for item in calls_only["output"]] == ["fc_01j9_0"]
    assert render_response(answer(), **FIELDS)["output"] == []


@pytest.mark.parametrize(
    ("reason", "details"),
    [("length", "max_output_tokens"), ("content_filter", "content_filter")],
)
def test_a_cut_or_filtered_answer_is_incomplete_and_says_why(reason, details):
    response = render_response(answer(text="Half", finish=Finish(reason)), **FIELDS)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": details}
    assert response["output"][0]["status"] == "incomplete"


def test_the_usage_is_the_upstreams_in_openais_shape():
    response = render_response(
        answer(text="x", finish=Finish("stop", None, TokenUsage(100, 30, 64, 20))), **FIELDS
    )
    assert response["usage"] == {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 64},
        "output_tokens": 30,
        "output_tokens_details": {"reasoning_tokens": 20},
        "total_tokens": 130,
    }


def test_without_reported_usage_the_edges_estimates_stand():
    """Input: the edge's estimate of the request; output: a token per 4 UTF-8 bytes of the
    text, the reasoning and the arguments (the Messages rule)."""
    response = render_response(
        answer(
            text="héllo",  # 6 bytes
            reasoning="abcd",  # 4
            tool_calls=(ToolCall("c", "f", '{"a":1}'),),  # 7
            finish=Finish("tool_calls", None, None),
        ),
        **FIELDS,
    )
    assert response["usage"] == {
        "input_tokens": 40,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,  # ceil(17 / 4)
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 45,
    }


def test_the_response_echoes_the_request_over_openais_defaults():
    bare = render_response(answer(text="Hi"), **FIELDS)
    for name, default in RESPONSE_DEFAULTS.items():
        assert bare[name] == default, name
    assert (bare["id"], bare["object"], bare["created_at"], bare["model"], bare["error"]) == (
        "resp_01j9",
        "response",
        1_700_000_123,
        "gpt-oss-20b",
        None,
    )
    echo = {
        "instructions": "Be brief.",
        "tools": [{"type": "function", "name": "f", "parameters": {}}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0.2,
        "metadata": {"ticket": "42"},
        "store": False,
    }
    echoed = render_response(answer(text="Hi"), **{**FIELDS, "echo": echo})
    assert {name: echoed[name] for name in echo} == echo
    assert echoed["top_p"] is None


def test_reasoning_is_sealed_only_when_the_request_includes_it_and_opens_back():
    thinking = "Ünïcode reasoning\nover lines"
    plain = render_response(answer(reasoning=thinking), **FIELDS)
    assert "encrypted_content" not in plain["output"][0]
    sealed = render_response(
        answer(reasoning=thinking), **FIELDS, include=["reasoning.encrypted_content"]
    )
    content = sealed["output"][0]["encrypted_content"]
    assert content == seal_reasoning(thinking)
    assert content.startswith("iop-edge.r1.")
    assert open_reasoning(content) == thinking
    assert open_reasoning("gAAAAABo-openai-encrypted") is None  # (not the edge's: unreadable)
    with pytest.raises(ValueError, match="the edge's seal"):
        open_reasoning("iop-edge.r1.not base64!")


def test_the_same_answer_renders_the_same_ids_twice_and_unsafe_ids_are_tamed():
    one = render_response(answer(text="Hi"), **FIELDS)
    assert render_response(answer(text="Hi"), **FIELDS) == one
    odd = render_response(answer(text="Hi"), **{**FIELDS, "response_id": "resp_a/b c"})
    assert odd["output"][0]["id"] == "msg_a_b_c_0"
    assert odd["id"] == "resp_a/b c"


def test_a_status_override_replaces_the_status_only():
    response = render_response(answer(text="Hi"), **FIELDS, status_override="cancelled")
    assert response["status"] == "cancelled"
    assert response["output"][0]["status"] == "completed"


def test_the_body_is_the_rendering_as_json_and_output_items_copy_the_output():
    body = response_body(answer(text="Hi", reasoning="r"), **FIELDS)
    rendered = render_response(answer(text="Hi", reasoning="r"), **FIELDS)
    assert orjson.loads(body) == rendered
    items = output_items(rendered)
    assert items == rendered["output"]
    items[0]["id"] = "changed"
    assert rendered["output"][0]["id"] == "rs_01j9_0"
    assert output_items({"output": None}) == []


def test_a_failures_error_uses_openais_codes():
    assert response_error("rate_limit_exceeded", "m") == {
        "code": "rate_limit_exceeded",
        "message": "m",
    }
    for code in ("upstream_error", "upstream_timeout", "queue_timeout"):
        assert response_error(code, "m") == {"code": "server_error", "message": "m"}

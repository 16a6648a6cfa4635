"""Anthropic Messages requests translated into the internal form (messages_request)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from iop_edge.errors import RequestError
from iop_edge.translate.chat_request import ReasoningRequest
from iop_edge.translate.messages_request import (
    DROPPED_FIELDS,
    REFUSED_FIELDS,
    translate_request,
)
from tests.helpers import claude_code


def body(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": "m",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
    }
    return {**base, **fields}


def chat_of(**fields: Any) -> dict[str, Any]:
    return translate_request(body(**fields)).chat


def refusal(request: dict[str, Any]) -> tuple[str | None, str]:
    with pytest.raises(RequestError) as caught:
        translate_request(request)
    assert caught.value.code == "invalid_request_error"
    assert caught.value.status == 400
    return caught.value.param, str(caught.value)


def test_claude_codes_turn_with_history_becomes_the_expected_chat_body():
    request = translate_request(claude_code.turn_with_history())
    assert request.chat == claude_code.expected_chat()
    assert request.model == "claude-sonnet-4-5-20250929"
    assert request.stream is True
    assert request.reasoning == ReasoningRequest("enabled", 31999)
    assert request.dropped == ("context_management",)
    assert request.stop_sequences == ()


def test_the_billing_header_block_is_left_out_so_the_prompt_prefix_stays_the_same():
    """Claude Code's billing header changes with every request; the rest must not."""
    first = claude_code.turn_with_history()
    second = claude_code.turn_with_history()
    second["system"][0]["text"] = claude_code.BILLING.replace("cch=8a61f", "cch=02c4d")
    one, two = translate_request(first).chat, translate_request(second).chat
    assert orjson.dumps(one) == orjson.dumps(two)
    assert "billing" not in orjson.dumps(one).decode()


def test_a_thinking_block_in_history_is_reasoning_content_never_text():
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "first", "signature": "sig-a"},
            {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
            {"type": "thinking", "thinking": "second", "signature": "sig-b"},
            {"type": "text", "text": "answer"},
        ],
    }
    chat = chat_of(messages=[{"role": "user", "content": "q"}, assistant])
    message = chat["messages"][1]
    assert message["reasoning_content"] == "first\n\nsecond"
    assert message["content"] == "answer"
    assert "sig-a" not in orjson.dumps(chat).decode()  # (opaque: not forwarded)


def test_system_as_a_string_and_mid_conversation_system_turns():
    chat = chat_of(
        system="Be brief.",
        messages=[
            {"role": "user", "content": "a"},
            {"role": "system", "content": [{"type": "text", "text": "Now be verbose."}]},
            {"role": "user", "content": "b"},
        ],
    )
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "system", "user"]
    assert chat["messages"][0]["content"] == "Be brief."
    assert chat["messages"][2]["content"] == "Now be verbose."


def test_images_base64_and_url_become_image_url_parts():
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAA="}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "text", "text": "what is this?"},
    ]
    chat = chat_of(messages=[{"role": "user", "content": content}])
    assert chat["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAA="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "text", "text": "what is this?"},
    ]


def test_tool_results_come_first_as_tool_messages_and_text_blocks_join():
    content = [
        {
            "type": "tool_result",
            "tool_use_id": "t1",
            "content": [{"type": "text", "text": "line 1"}, {"type": "text", "text": "line 2"}],
        },
        {"type": "tool_result", "tool_use_id": "t2"},
    ]
    chat = chat_of(messages=[{"role": "user", "content": content}])
    assert chat["messages"] == [
        {"role": "tool", "tool_call_id": "t1", "content": "line 1\nline 2"},
        {"role": "tool", "tool_call_id": "t2", "content": ""},
    ]


def test_sampling_stops_metadata_and_stream_map_to_chat_fields():
    chat = chat_of(
        temperature=0.2,
        top_p=0.9,
        top_k=40,
        stop_sequences=["END", "###"],
        metadata={"user_id": "u1"},
        stream=False,
    )
    assert chat == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 100,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "stop": ["END", "###"],
        "user": "u1",
    }
    assert translate_request(body(stop_sequences=["END"])).stop_sequences == ("END",)


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        (
            {"type": "tool", "name": "Read", "disable_parallel_tool_use": True},
            {
                "tool_choice": {"type": "function", "function": {"name": "Read"}},
                "parallel_tool_calls": False,
            },
        ),
        ({"type": "any", "disable_parallel_tool_use": False}, {"tool_choice": "required"}),
    ],
)
def test_tool_choice(choice, expected):
    chat = chat_of(tools=claude_code.TOOLS[:1], tool_choice=choice)
    assert {k: chat[k] for k in ("tool_choice", "parallel_tool_calls") if k in chat} == expected


def test_a_custom_tool_with_strict_becomes_a_strict_function_tool():
    tool = {"type": "custom", "name": "f", "input_schema": {"type": "object"}, "strict": True}
    assert chat_of(tools=[tool])["tools"] == [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object"}, "strict": True},
        }
    ]


@pytest.mark.parametrize(
    ("thinking", "output_config", "expected"),
    [
        ({"type": "enabled", "budget_tokens": 2048}, None, ReasoningRequest("enabled", 2048)),
        ({"type": "adaptive", "display": "omitted"}, None, ReasoningRequest("adaptive")),
        ({"type": "disabled"}, None, ReasoningRequest("disabled")),
        (None, {"effort": "high"}, ReasoningRequest(None, None, "high")),
        ({"type": "adaptive"}, {"effort": "max"}, ReasoningRequest("adaptive", None, "max")),
        (None, None, None),
    ],
)
def test_thinking_and_effort_become_a_reasoning_request_not_a_chat_field(
    thinking, output_config, expected
):
    request = translate_request(body(thinking=thinking, output_config=output_config))
    assert request.reasoning == expected
    assert set(request.chat) == {"model", "messages", "max_tokens"}


def test_an_output_format_becomes_a_json_schema_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    chat = chat_of(output_config={"format": {"type": "json_schema", "schema": schema}})
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }


def test_cache_control_and_the_documented_fields_are_dropped_and_reported():
    request = translate_request(
        body(
            cache_control={"type": "ephemeral"},
            service_tier="auto",
            speed="fast",
            container=None,  # (null: as if absent)
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
                    ],
                }
            ],
        )
    )
    assert request.dropped == ("cache_control", "service_tier", "speed")
    assert request.chat["messages"] == [{"role": "user", "content": "hi"}]
    assert set(DROPPED_FIELDS) >= {"cache_control", "service_tier", "context_management"}


def test_max_tokens_is_required_but_not_for_counting():
    assert refusal({"model": "m", "messages": [{"role": "user", "content": "x"}]}) == (
        "max_tokens",
        "max_tokens: is required: a positive integer, not None.",
    )
    counted = translate_request(
        {"model": "m", "messages": [{"role": "user", "content": "x"}]}, counting=True
    )
    assert "max_tokens" not in counted.chat


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        (
            {
                "tools": [
                    claude_code.TOOLS[0],
                    {"type": "web_search_20250305", "name": "web_search"},
                ]
            },
            "tools[1].type",
            "tools[1].type: 'web_search_20250305' (tool 'web_search') is an Anthropic server tool",
        ),
        (
            {"tools": [{"type": "bash_20250124", "name": "bash"}]},
            "tools[0].type",
            "'bash_20250124' (tool 'bash') is an Anthropic server tool",
        ),
        (
            {"tools": [{"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]},
            "tools[0].type",
            "'text_editor_20250728'",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "b"},
                    {"role": "user", "content": "c"},
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "x"},
                            {"type": "document", "source": {"type": "text", "data": "d"}},
                        ],
                    },
                ]
            },
            "messages[3].content[1].type",
            "messages[3].content[1].type: 'document' is not a block the edge translates here; it "
            "translates text, image and tool_result blocks in a user turn.",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}],
                    }
                ]
            },
            "messages[0].content[0].input",
            "messages[0].content[0].input: must be an object, not 'x'.",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
                    }
                ]
            },
            "messages[0].content[0].source.type",
            "'file' is not an image source the edge translates (base64 or url",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "content": [{"type": "server_tool_use", "id": "s"}]}
                ]
            },
            "messages[0].content[0].type",
            "'server_tool_use' is not a block the edge translates here",
        ),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            "messages[0].role",
            "'tool' is not a role",
        ),
        ({"messages": []}, "messages", "must be a non-empty array of messages"),
        (
            {"mcp_servers": [{"type": "url", "url": "https://x"}]},
            "mcp_servers",
            "does not connect to MCP servers",
        ),
        (
            {"betas_please": 1},
            "betas_please",
            "betas_please: 1 cannot be honoured: the edge does not translate this field, and a "
            "field is never silently dropped (it drops only cache_control, context_management",
        ),
        (
            {"thinking": {"type": "enabled"}},
            "thinking.budget_tokens",
            "must be a positive integer, not None",
        ),
        ({"thinking": {"type": "between_tools"}}, "thinking.type", "'between_tools' is not one of"),
        (
            {"tool_choice": {"type": "some"}},
            "tool_choice.type",
            "'some' is not one of auto, any, tool, none",
        ),
        ({"metadata": {"user_id": "u", "tier": "x"}}, "metadata.tier", "user_id is the only one"),
        ({"temperature": "hot"}, "temperature", "must be a non-negative number, not 'hot'"),
        ({"top_k": 1.5}, "top_k", "must be a non-negative integer, not 1.5"),
        ({"stop_sequences": "END"}, "stop_sequences", "must be an array of strings"),
        ({"output_config": {"effort": "huge"}}, "output_config.effort", "'huge' is not one of"),
        ({"stream": "yes"}, "stream", "must be a boolean"),
    ],
)
def test_what_cannot_be_translated_is_a_400_naming_the_path_the_value_and_the_rule(
    fields, param, message
):
    got_param, got_message = refusal(body(**fields))
    assert got_param == param
    assert message in got_message


def test_refused_fields_have_their_own_reason_and_are_never_in_the_dropped_list():
    assert not set(REFUSED_FIELDS) & set(DROPPED_FIELDS)
    for name in REFUSED_FIELDS:
        param, message = refusal(body(**{name: "x"}))
        assert param == name
        assert REFUSED_FIELDS[name] in message

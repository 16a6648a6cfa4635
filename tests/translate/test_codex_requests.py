"""Codex CLI's Responses requests (tests/helpers/codex.py) translate, turn after turn."""

from __future__ import annotations

import pytest

from iop_edge.errors import RequestError
from iop_edge.translate.chat_request import ReasoningRequest
from iop_edge.translate.events import Answer, Finish, TokenUsage, ToolCall
from iop_edge.translate.responses_reply import render_response
from iop_edge.translate.responses_request import translate_responses
from tests.helpers import codex


def test_codexs_first_turn_translates_field_for_field():
    request = translate_responses(codex.request(codex.context()))
    chat = request.internal.chat
    assert chat["messages"] == [
        # (its developer message joins the instructions: one system prompt)
        {"role": "system", "content": f"{codex.INSTRUCTIONS}\n\n{codex.PERMISSIONS}"},
        {"role": "user", "content": codex.ENVIRONMENT},
        {"role": "user", "content": codex.TASK},
    ]
    assert chat["tools"][0] == {
        "type": "function",
        "function": {
            "name": "shell",
            "description": codex.TOOLS[0]["description"],
            "parameters": codex.TOOLS[0]["parameters"],
            "strict": False,
        },
    }
    assert [tool["function"]["name"] for tool in chat["tools"]] == [
        "shell",
        "update_plan",
        "view_image",
    ]
    assert {k: v for k, v in chat.items() if k not in ("messages", "tools")} == {
        "model": codex.MODEL,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "prompt_cache_key": codex.CONVERSATION,
    }
    assert request.internal.reasoning == ReasoningRequest(effort="medium")
    assert request.include == ("reasoning.encrypted_content",)
    assert (request.store, request.previous_response_id) == (False, None)
    assert request.internal.dropped == ()


def test_codexs_turn_with_history_translates_to_the_expected_chat_messages():
    """OpenAI's sealed reasoning is dropped (its summary stands), the calls join their turns,
    the tool's image follows the tool messages."""
    messages = translate_responses(codex.turn_with_history()).internal.chat["messages"]
    assert messages == codex.expected_chat_messages()


def test_codex_keeps_the_reasoning_across_turns_through_the_edges_seal():
    """Codex keeps no state at the edge (store false) and sends reasoning back without its
    text: what the edge sealed in encrypted_content brings it back to the upstream."""
    first = codex.request(codex.context())
    translated = translate_responses(first)
    response = render_response(
        Answer(
            "chatcmpl-9",
            "",
            "I should list the files by size.",
            (ToolCall("call_s1", "shell", '{"command":["bash","-lc","ls -S"]}'),),
            Finish("tool_calls", None, TokenUsage(900, 40)),
        ),
        response_id="resp_c1",
        created_at=1,
        model=codex.MODEL,
        echo=translated.echo,
        estimated_input_tokens=900,
        include=translated.include,
    )
    reasoning, call = (codex.sent_back(item) for item in response["output"])
    assert "content" not in reasoning  # (Codex leaves reasoning_text out)
    second = codex.request(
        [
            *codex.context(),
            reasoning,
            call,
            {"type": "function_call_output", "call_id": "call_s1", "output": "big.py"},
        ]
    )
    messages = translate_responses(second).internal.chat["messages"]
    assert messages[3] == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "I should list the files by size.",
        "tool_calls": [
            {
                "id": "call_s1",
                "type": "function",
                "function": {"name": "shell", "arguments": '{"command":["bash","-lc","ls -S"]}'},
            }
        ],
    }
    assert messages[4] == {"role": "tool", "tool_call_id": "call_s1", "content": "big.py"}


def test_codexs_output_schema_becomes_a_strict_json_schema_response_format():
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    chat = translate_responses(codex.request(codex.context(), schema=schema)).internal.chat
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "codex_output_schema", "schema": schema, "strict": True},
    }


def test_codex_without_reasoning_sends_null_reasoning_and_no_include():
    request = translate_responses(codex.request(codex.context(), reasoning=False))
    assert request.internal.reasoning is None
    assert request.include == ()


@pytest.mark.parametrize(
    ("tool", "says"),
    [
        ({"type": "local_shell"}, "'local_shell' is a built-in tool"),
        ({"type": "web_search"}, "'web_search' is a built-in tool"),
        (
            {"type": "custom", "name": "apply_patch", "description": "Edit files."},
            "'custom' (tool 'apply_patch') is a free-form tool",
        ),
    ],
)
def test_the_tools_codex_adds_for_openais_models_are_refused_by_name(tool, says):
    request = codex.request(codex.context())
    request["tools"] = [*codex.TOOLS, tool]
    with pytest.raises(RequestError) as caught:
        translate_responses(request)
    assert caught.value.param == "tools[3].type"
    assert says in str(caught.value)

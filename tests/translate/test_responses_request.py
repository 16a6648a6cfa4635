"""OpenAI Responses requests translated into the internal form (responses_request, _input)."""

from __future__ import annotations

from typing import Any

import pytest

from iop_edge.errors import RequestError
from iop_edge.translate.chat_request import ReasoningRequest
from iop_edge.translate.events import Answer, Finish, TokenUsage, ToolCall
from iop_edge.translate.responses_reply import output_items, render_response, seal_reasoning
from iop_edge.translate.responses_request import DROPPED_FIELDS, translate_responses

PNG = "data:image/png;base64,iVBORw0KGgo="
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "qwen3", "input": "Hi", **fields}


def messages(**fields: Any) -> list[dict[str, Any]]:
    chat = translate_responses(body(**fields)).internal.chat
    return list(chat["messages"])


def text(value: str, kind: str = "input_text") -> dict[str, Any]:
    return {"type": kind, "text": value}


def refused(request: dict[str, Any], history: list[dict[str, Any]] | None = None) -> RequestError:
    with pytest.raises(RequestError) as caught:
        translate_responses(request, history or ())
    assert caught.value.status == 400
    assert caught.value.code == "invalid_request_error"
    return caught.value


def test_a_string_input_is_one_user_message_after_the_instructions():
    request = translate_responses(body(instructions="Be brief."))
    assert request.internal.chat == {
        "model": "qwen3",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
    }
    assert request.input_items == ({"type": "message", "role": "user", "content": [text("Hi")]},)
    assert request.instructions == "Be brief."
    assert (request.internal.model, request.internal.stream) == ("qwen3", False)
    assert request.internal.reasoning is None
    assert (request.store, request.previous_response_id, request.include) == (True, None, ())


def test_messages_of_every_role_and_part():
    assert messages(
        input=[
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "system", "content": [text("Be exact.")]},
            {
                "role": "user",
                "content": [
                    text("What is this?"),
                    {"type": "input_image", "image_url": PNG, "detail": "high"},
                    {"type": "input_image", "image_url": "https://example.com/a.png"},
                ],
            },
            {"role": "user", "content": [text("Just this.")], "id": "msg_1", "status": "done"},
            {
                "role": "assistant",
                "content": [text("A cat", "output_text"), {"type": "refusal", "refusal": "No."}],
                "phase": "final_answer",
            },
        ],
        instructions="Answer.",
    ) == [
        # (consecutive system prompts are one: many chat templates take a single one)
        {"role": "system", "content": "Answer.\n\nUse tools.\n\nBe exact."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": PNG}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            ],
        },
        {"role": "user", "content": "Just this."},
        {"role": "assistant", "content": "A cat\nNo."},
    ]


def test_function_calls_join_the_assistant_turn_before_them_and_outputs_become_tool_messages():
    assert messages(
        input=[
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": [text("Checking.", "output_text")]},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city":"Paris"}',
                "id": "fc_1",
                "status": "completed",
            },
            {
                "type": "function_call",
                "call_id": "call_2",
                "name": "get_weather",
                "arguments": '{"city":"Rome"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
            {"type": "function_call_output", "call_id": "call_2", "output": [text("21C")]},
            {"type": "function_call", "call_id": "call_3", "name": "get_weather", "arguments": ""},
        ]
    ) == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "21C"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ],
        },
    ]


def test_images_of_tool_outputs_follow_the_run_of_tool_messages():
    call = {"type": "function_call", "name": "shot", "arguments": "{}"}
    assert messages(
        input=[
            {**call, "call_id": "a"},
            {**call, "call_id": "b"},
            {
                "type": "function_call_output",
                "call_id": "a",
                "output": [text("one"), {"type": "input_image", "image_url": PNG}, text("two")],
            },
            {
                "type": "function_call_output",
                "call_id": "b",
                "output": [{"type": "input_image", "image_url": "https://x.test/b.png"}],
            },
            {"role": "user", "content": "Compare them."},
        ]
    )[1:] == [
        {"role": "tool", "tool_call_id": "a", "content": "one\ntwo"},
        {"role": "tool", "tool_call_id": "b", "content": ""},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": PNG}},
                {"type": "image_url", "image_url": {"url": "https://x.test/b.png"}},
            ],
        },
        {"role": "user", "content": "Compare them."},
    ]


def reasoning(**fields: Any) -> dict[str, Any]:
    return {"type": "reasoning", "id": "rs_1", "summary": [], **fields}


def test_reasoning_goes_to_the_next_assistant_turn_never_to_its_text():
    assert messages(
        input=[
            {"role": "user", "content": "Hi"},
            reasoning(content=[{"type": "reasoning_text", "text": "Greet."}]),
            reasoning(summary=[{"type": "summary_text", "text": "**Be warm**"}]),
            {"role": "assistant", "content": "Hello!"},
            reasoning(content=[{"type": "reasoning_text", "text": "Look it up."}]),
            {"type": "function_call", "call_id": "c", "name": "find", "arguments": "{}"},
        ]
    )[1:] == [
        {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet.\n\n**Be warm**"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Look it up.",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "find", "arguments": "{}"}}
            ],
        },
    ]


def test_reasoning_that_no_assistant_turn_follows_is_a_turn_of_its_own():
    thought = reasoning(content=[{"type": "reasoning_text", "text": "Hmm."}])
    own = {"role": "assistant", "content": "", "reasoning_content": "Hmm."}
    assert messages(input=[{"role": "user", "content": "a"}, thought])[1:] == [own]
    assert messages(input=[thought, {"role": "user", "content": "b"}]) == [
        own,
        {"role": "user", "content": "b"},
    ]


def test_reasoning_text_comes_from_content_then_the_edges_seal_then_the_summary():
    summary = [{"type": "summary_text", "text": "Summary."}]

    def reasoning_of(item: dict[str, Any]) -> str | None:
        turns = messages(input=[item, {"role": "assistant", "content": "ok"}])
        return turns[0].get("reasoning_content")

    content = [{"type": "reasoning_text", "text": "Whole."}]
    assert reasoning_of(reasoning(content=content, summary=summary)) == "Whole."
    sealed = seal_reasoning("Sealed by the edge.")
    assert reasoning_of(reasoning(encrypted_content=sealed, summary=summary)) == (
        "Sealed by the edge."
    )
    # (OpenAI's encrypted content cannot be read: the summary is all there is)
    assert reasoning_of(reasoning(encrypted_content="gAAAA-openai", summary=summary)) == "Summary."
    assert reasoning_of(reasoning(encrypted_content="gAAAA-openai", content=None)) is None


def test_the_top_level_fields_map_to_chat():
    request = translate_responses(
        body(
            tools=[TOOL, {"type": "function", "name": "now", "parameters": None}],
            tool_choice={"type": "function", "name": "get_weather"},
            parallel_tool_calls=False,
            max_output_tokens=256,
            temperature=0.2,
            top_p=0.9,
            text={"format": {"type": "json_object"}, "verbosity": "low"},
            user="u-1",
            prompt_cache_key="conv-9",
            safety_identifier="h-7",
            stream=True,
            metadata={"ticket": "42"},
            store=False,
            previous_response_id="resp_prev",
        )
    )
    chat = request.internal.chat
    assert {k: v for k, v in chat.items() if k not in ("messages", "tools")} == {
        "model": "qwen3",
        "max_tokens": 256,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.2,
        "top_p": 0.9,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "response_format": {"type": "json_object"},
        "user": "u-1",
        "prompt_cache_key": "conv-9",
        "safety_identifier": "h-7",
    }
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": TOOL["parameters"],
                "strict": True,
            },
        },
        {
            "type": "function",
            "function": {"name": "now", "parameters": {"type": "object", "properties": {}}},
        },
    ]
    assert request.internal.stream is True
    assert (request.store, request.previous_response_id) == (False, "resp_prev")
    assert request.echo["metadata"] == {"ticket": "42"}
    assert request.echo["store"] is False
    assert request.echo["text"] == {"format": {"type": "json_object"}, "verbosity": "low"}
    assert "metadata" not in chat


def test_a_json_schema_format_becomes_chats_nested_one():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {
        "type": "json_schema",
        "name": "count",
        "schema": schema,
        "strict": True,
        "description": "A count.",
    }
    chat = translate_responses(body(text={"format": fmt})).internal.chat
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "count",
            "schema": schema,
            "description": "A count.",
            "strict": True,
        },
    }
    assert (
        "response_format"
        not in translate_responses(body(text={"format": {"type": "text"}})).internal.chat
    )


@pytest.mark.parametrize(
    ("effort", "expected"),
    [
        ("none", ReasoningRequest(mode="disabled")),
        ("minimal", ReasoningRequest(effort="minimal")),
        ("low", ReasoningRequest(effort="low")),
        ("medium", ReasoningRequest(effort="medium")),
        ("high", ReasoningRequest(effort="high")),
        ("xhigh", ReasoningRequest(effort="xhigh")),
    ],
)
def test_reasoning_effort_is_the_neutral_reasoning_request(effort, expected):
    request = translate_responses(body(reasoning={"effort": effort, "summary": "detailed"}))
    assert request.internal.reasoning == expected
    assert "reasoning_effort" not in request.internal.chat  # (the shell maps it, per group)
    assert request.echo["reasoning"] == {"effort": effort, "summary": "detailed"}
    assert translate_responses(body(reasoning={"summary": "auto"})).internal.reasoning is None


def test_tool_choice_strings_are_forwarded_with_tools_only():
    for choice in ("auto", "none", "required"):
        assert (
            translate_responses(body(tools=[TOOL], tool_choice=choice)).internal.chat["tool_choice"]
            == choice
        )
    for choice in ("auto", "none"):
        chat = translate_responses(
            body(tool_choice=choice, parallel_tool_calls=False)
        ).internal.chat
        assert "tool_choice" not in chat
        assert "parallel_tool_calls" not in chat
    assert (
        "parallel_tool_calls"
        not in translate_responses(body(tools=[TOOL], parallel_tool_calls=True)).internal.chat
    )


def test_fields_without_effect_are_accepted_and_said_dropped():
    request = translate_responses(
        body(
            service_tier="flex",
            stream_options={"include_obfuscation": False},
            max_tool_calls=3,
            prompt_cache_retention="24h",
            context_management=[{"type": "compaction", "compact_threshold": 1000}],
            truncation="auto",
            background=False,
            top_logprobs=0,
            include=[
                "reasoning.encrypted_content",
                "message.input_image.image_url",
                "web_search_call.action.sources",
            ],
        )
    )
    assert set(request.internal.dropped) == set(DROPPED_FIELDS)
    assert request.echo["truncation"] == "disabled"  # (what the edge does for auto too)
    assert request.echo["max_tool_calls"] == 3
    assert request.include[0] == "reasoning.encrypted_content"
    assert request.internal.chat == {
        "model": "qwen3",
        "messages": [{"role": "user", "content": "Hi"}],
    }


def test_null_fields_are_absent_fields():
    nulls = dict.fromkeys(
        ("instructions", "tools", "tool_choice", "reasoning", "text", "metadata", "store", "user"),
        None,
    )
    request = translate_responses(body(**nulls, conversation=None, prompt=None))
    assert request.internal.chat == {
        "model": "qwen3",
        "messages": [{"role": "user", "content": "Hi"}],
    }
    assert request.echo == {}
    assert request.store is True


def test_history_comes_first_and_the_previous_instructions_are_not_carried_over():
    previous = translate_responses(body(instructions="Old rules.", input="What is 2+2?"))
    answered = render_response(
        Answer(
            "chatcmpl-1",
            "4",
            "Add them.",
            (ToolCall("call_c", "calc", '{"x":"2+2"}'),),
            Finish("tool_calls", None, TokenUsage(5, 3)),
        ),
        response_id="resp_1",
        created_at=1,
        model="qwen3",
        echo=previous.echo,
        estimated_input_tokens=5,
    )
    history = [*previous.input_items, *output_items(answered)]
    request = translate_responses(
        body(
            instructions="New rules.",
            previous_response_id="resp_1",
            input=[{"type": "function_call_output", "call_id": "call_c", "output": "4"}],
        ),
        history,
    )
    assert request.internal.chat["messages"] == [
        {"role": "system", "content": "New rules."},
        {"role": "user", "content": "What is 2+2?"},
        {
            "role": "assistant",
            "content": "4",
            "reasoning_content": "Add them.",
            "tool_calls": [
                {
                    "id": "call_c",
                    "type": "function",
                    "function": {"name": "calc", "arguments": '{"x":"2+2"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_c", "content": "4"},
    ]
    assert request.input_items == (
        {"type": "function_call_output", "call_id": "call_c", "output": "4"},
    )


def test_a_continued_response_may_have_empty_input_but_a_conversation_may_not_be_empty():
    history = [{"type": "message", "role": "user", "content": "Hi"}]
    request = translate_responses(body(input=[], previous_response_id="resp_1"), history)
    assert request.internal.chat["messages"] == [{"role": "user", "content": "Hi"}]
    assert request.input_items == ()
    assert refused(body(input=[])).param == "input"
    assert refused(body(input=[], previous_response_id="resp_1")).param == "input"


def test_a_message_without_type_is_normalised_for_the_store():
    request = translate_responses(body(input=[{"role": "user", "content": "Hi"}]))
    assert request.input_items == ({"role": "user", "content": "Hi", "type": "message"},)


def test_an_error_in_the_history_names_it():
    error = refused(body(previous_response_id="r"), [{"type": "web_search_call", "id": "ws"}])
    assert error.param == "history[0].type"


ITEM = {"type": "message", "role": "user"}
REFUSALS: dict[str, tuple[dict[str, Any], str, str]] = {
    "item reference": (
        body(input=[{"role": "user", "content": "a"}, {"type": "item_reference", "id": "msg_1"}]),
        "input[1].type",
        "previous_response_id",
    ),
    "image by file id": (
        body(
            input=[{**ITEM, "content": [text("a"), {"type": "input_image", "file_id": "file-9"}]}]
        ),
        "input[0].content[1].file_id",
        "'file-9' names a file stored at OpenAI",
    ),
    "image not a URL": (
        body(input=[{**ITEM, "content": [{"type": "input_image", "image_url": "c:/a.png"}]}]),
        "input[0].content[0].image_url",
        "not an http(s) or data: URL",
    ),
    "file part": (
        body(input=[{**ITEM, "content": [{"type": "input_file", "file_id": "f"}]}]),
        "input[0].content[0].type",
        "'input_file'",
    ),
    "audio part": (
        body(input=[{**ITEM, "content": [{"type": "input_audio"}]}]),
        "input[0].content[0].type",
        "audio is not translated",
    ),
    "image in a system message": (
        body(
            input=[
                {**ITEM, "role": "system", "content": [{"type": "input_image", "image_url": PNG}]}
            ]
        ),
        "input[0].content[0].type",
        "'input_image'",
    ),
    "a built-in tool's item": (
        body(input=[{"type": "local_shell_call", "id": "x"}]),
        "input[0].type",
        "'local_shell_call' is not an item the edge translates",
    ),
    "an item without type": (body(input=[{"content": "x"}]), "input[0].type", "must be a string"),
    "role tool": (
        body(input=[{**ITEM, "role": "tool", "content": "x"}]),
        "input[0].role",
        "'tool'",
    ),
    "a call without call_id": (
        body(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]),
        "input[0].call_id",
        "non-empty string",
    ),
    "an output that is a number": (
        body(input=[{"type": "function_call_output", "call_id": "c", "output": 3}]),
        "input[0].output",
        "must be a string or an array",
    ),
    "a corrupt seal": (
        body(input=[reasoning(encrypted_content="iop-edge.r1.%%%")]),
        "input[0].encrypted_content",
        "the edge's seal",
    ),
    "web search tool": (
        body(tools=[TOOL, {"type": "web_search_preview"}]),
        "tools[1].type",
        "'web_search_preview' is a built-in tool",
    ),
    "custom tool": (
        body(tools=[{"type": "custom", "name": "apply_patch"}]),
        "tools[0].type",
        "'custom' (tool 'apply_patch') is a free-form tool",
    ),
    "tool without name": (body(tools=[{"type": "function"}]), "tools[0].name", "non-empty"),
    "built-in tool choice": (
        body(tools=[TOOL], tool_choice={"type": "file_search"}),
        "tool_choice.type",
        "'file_search' is not translated",
    ),
    "tool choice of an unknown function": (
        body(tools=[TOOL], tool_choice={"type": "function", "name": "nope"}),
        "tool_choice.name",
        "'nope' is not the name of a function in tools",
    ),
    "required without tools": (body(tool_choice="required"), "tool_choice", "no tools"),
    "an unknown tool choice": (body(tool_choice="any"), "tool_choice", "'any' is not one of"),
    "background": (body(background=True), "background", "no background responses"),
    "conversation": (body(conversation="conv_1"), "conversation", "keeps no conversations"),
    "prompt": (body(prompt={"id": "pmpt_1"}), "prompt", "prompt template"),
    "an unknown field": (body(modalities=["text"]), "modalities", "never silently dropped"),
    "log probabilities": (
        body(include=["message.output_text.logprobs"]),
        "include[0]",
        "no log probabilities",
    ),
    "an unknown include": (
        body(include=["everything"]),
        "include[0]",
        "'everything' is not one of",
    ),
    "top logprobs": (body(top_logprobs=5), "top_logprobs", "no log probabilities"),
    "an unknown effort": (body(reasoning={"effort": "huge"}), "reasoning.effort", "'huge'"),
    "an unknown summary": (body(reasoning={"summary": "long"}), "reasoning.summary", "'long'"),
    "an unknown format": (
        body(text={"format": {"type": "yaml"}}),
        "text.format.type",
        "'yaml' is not one of",
    ),
    "a schema without name": (
        body(text={"format": {"type": "json_schema", "schema": {}}}),
        "text.format.name",
        "non-empty string",
    ),
    "no output tokens": (body(max_output_tokens=0), "max_output_tokens", "positive integer"),
    "a temperature as text": (body(temperature="hot"), "temperature", "non-negative number"),
    "an unknown truncation": (body(truncation="smart"), "truncation", "'smart'"),
    "metadata not strings": (body(metadata={"n": 1}), "metadata.n", "must be a string"),
    "stream not a boolean": (body(stream="yes"), "stream", "must be a boolean"),
    "no model": ({"input": "x"}, "model", "non-empty string"),
    "input an object": (body(input={"role": "user"}), "input", "must be a string or"),
}


@pytest.mark.parametrize(("request_body", "param", "says"), REFUSALS.values(), ids=REFUSALS.keys())
def test_every_refusal_names_the_path_the_value_and_the_rule(request_body, param, says):
    error = refused(request_body)
    assert error.param == param
    assert str(error).startswith(f"{param}: ")
    assert says in str(error)

"""``/v1/messages`` translated, with the official ``anthropic`` SDK against a running edge: tool
use and thinking both ways (the answer's blocks, their stream, and what the upstream gets when
the client sends them back), the reasoning fields, images, and a request in Claude Code's own
shape — checked on what reached the fake upstream."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_ollama import FakeOllama, fake_thinking
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers.api import anthropic_client, edge_doc, running_edge
from tests.helpers.claude_code import PNG, expected_chat, turn_with_history

ASK = "What is the weather in Paris?"
QUESTION: Any = [{"role": "user", "content": ASK}]
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": WEATHER_SCHEMA,
}
ARGS = '{"city": "Paris", "days": 3}'
ARGS_COMPACT = '{"city":"Paris","days":3}'
THOUGHT = "The user wants the weather. I should call the tool."


def _without_ids(blocks: list[Any]) -> list[dict[str, Any]]:
    """The blocks as dicts, a tool_use block's id left out (each answer has its own)."""
    dumped = [block.model_dump() for block in blocks]
    for block in dumped:
        if block["type"] == "tool_use":
            block.pop("id")
    return dumped


async def _streamed(
    client: anthropic.AsyncAnthropic, **fields: Any
) -> tuple[anthropic.types.Message, list[Any]]:
    """The final message of a streamed request and its content_block_delta deltas, in order."""
    deltas: list[Any] = []
    async with client.messages.stream(**fields) as stream:
        async for event in stream:
            if event.type == "content_block_delta":
                deltas.append(event.delta)
        final = await stream.get_final_message()
    return final, deltas


# -- tool use ---------------------------------------------------------------------------------


async def test_openai_compat_tool_use_round_trip(fake_oa: FakeOpenAI, fake_ol: FakeOllama) -> None:
    """The model calls the tool: a tool_use block with the parsed input and the upstream's call
    id (stop_reason tool_use); streamed, its input_json_delta pieces accumulate to the same
    input and get_final_message() equals the whole answer; the client's tool_result goes
    upstream as a tool message answering that id, after the assistant's tool call."""
    fake_oa.behavior = FakeBehavior(reply="Let me check.", tool_call=f"get_weather:{ARGS}")
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        fields: Any = {"model": "chat-oa", "max_tokens": 64, "messages": QUESTION}
        whole = await c.messages.create(**fields, tools=[WEATHER])
        streamed, deltas = await _streamed(c, **fields, tools=[WEATHER])
        sent_tools = fake_oa.requests[-1].json["tools"]
        fake_oa.behavior = FakeBehavior(reply="It is sunny in Paris.")
        [text, call] = whole.content
        assert call.type == "tool_use"
        follow_up: Any = [
            *QUESTION,
            {"role": "assistant", "content": whole.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}],
            },
        ]
        answer = await c.messages.create(
            model="chat-oa", max_tokens=64, messages=follow_up, tools=[WEATHER]
        )
    assert whole.stop_reason == streamed.stop_reason == "tool_use"
    assert text.type == "text"
    assert text.text == "Let me check."
    assert (call.name, call.input) == ("get_weather", {"city": "Paris", "days": 3})
    assert call.id == "call_fake1"  # the upstream's own id, kept
    assert _without_ids(streamed.content) == _without_ids(whole.content)
    pieces = [d.partial_json for d in deltas if d.type == "input_json_delta"]
    assert len(pieces) >= 2
    assert json.loads("".join(pieces)) == call.input
    assert sent_tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": WEATHER_SCHEMA,
            },
        }
    ]
    assert fake_oa.requests[-1].json["messages"] == [
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_fake1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGS_COMPACT},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_fake1", "content": "sunny"},
    ]
    assert answer.content[0].type == "text"
    assert answer.content[0].text == "It is sunny in Paris."
    assert answer.stop_reason == "end_turn"


async def test_thinking_text_and_a_tool_call_stream_as_three_blocks_in_order(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """Each block opens, streams and closes under its own index before the next opens; the
    stream's final message (its usage too) is the whole answer."""
    fake_oa.behavior = FakeBehavior(
        thinking=THOUGHT, reply="Let me check.", tool_call="get_weather"
    )
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        fields: Any = {
            "model": "chat-oa",
            "max_tokens": 2048,
            "messages": QUESTION,
            "tools": [WEATHER],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        }
        whole = await c.messages.create(**fields)
        seen: list[tuple[str, int]] = []
        async with c.messages.stream(**fields) as stream:
            async for event in stream:
                if event.type in ("content_block_start", "content_block_stop"):
                    seen.append((event.type.removeprefix("content_block_"), event.index))
                elif event.type == "content_block_delta":
                    seen.append(("delta", event.index))
            streamed = await stream.get_final_message()
    assert [b.type for b in whole.content] == ["thinking", "text", "tool_use"]
    assert whole.content[2].input == {}
    order = [kind for kind, _ in seen if kind != "delta"]
    assert order == ["start", "stop"] * 3
    assert [index for _, index in seen] == sorted(index for _, index in seen)
    assert {index for _, index in seen} == {0, 1, 2}
    assert _without_ids(streamed.content) == _without_ids(whole.content)
    assert streamed.usage.model_dump() == whole.usage.model_dump()
    assert streamed.stop_reason == whole.stop_reason == "tool_use"


async def test_ollama_tool_use_round_trip(fake_oa: FakeOpenAI, fake_ol: FakeOllama) -> None:
    """The fake Ollama model calls the first tool with its first required parameter set to
    the prompt; the tool_result goes back as Ollama's tool message (``tool_name``), and the
    model answers from it."""
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        fields: Any = {"model": "chat-ol", "max_tokens": 64, "messages": QUESTION}
        whole = await c.messages.create(**fields, tools=[WEATHER])
        streamed, deltas = await _streamed(c, **fields, tools=[WEATHER])
        sent_tools = fake_ol.requests[-1].json["tools"]
        [call] = whole.content
        assert call.type == "tool_use"
        follow_up: Any = [
            *QUESTION,
            {"role": "assistant", "content": whole.content},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call.id,
                        "content": [{"type": "text", "text": "sunny"}],
                    }
                ],
            },
        ]
        answer = await c.messages.create(
            model="chat-ol", max_tokens=64, messages=follow_up, tools=[WEATHER]
        )
    assert whole.stop_reason == streamed.stop_reason == "tool_use"
    assert (call.name, call.input) == ("get_weather", {"city": ASK})
    assert call.id
    assert _without_ids(streamed.content) == _without_ids(whole.content)
    pieces = [d.partial_json for d in deltas if d.type == "input_json_delta"]
    assert json.loads("".join(pieces)) == call.input
    assert sent_tools[0]["function"]["name"] == "get_weather"
    assert fake_ol.requests[-1].json["messages"] == [
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": ASK}}}],
        },
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    assert answer.content[0].type == "text"
    assert answer.content[0].text == "the tool said: sunny"


async def test_a_cli_provider_cannot_call_tools_a_400_naming_tools(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        with pytest.raises(anthropic.BadRequestError) as info:
            await c.messages.create(
                model="chat-cli", max_tokens=64, messages=QUESTION, tools=[WEATHER]
            )
    error = info.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert "tools" in error["message"]


# -- thinking ---------------------------------------------------------------------------------


async def test_openai_compat_thinking_round_trip(fake_oa: FakeOpenAI, fake_ol: FakeOllama) -> None:
    """The budget goes upstream as ``thinking_token_budget``; the upstream's reasoning comes back
    as a signed thinking block (streamed as thinking_delta, then signature_delta); sent back in
    history it goes upstream as the turn's ``reasoning_content``, never as its text."""
    fake_oa.behavior = FakeBehavior(thinking=THOUGHT, reply="Hello!")
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        fields: Any = {"model": "chat-oa", "max_tokens": 2048, "messages": QUESTION}
        whole = await c.messages.create(**fields, thinking=thinking)
        streamed, deltas = await _streamed(c, **fields, thinking=thinking)
        budgets = [r.json.get("thinking_token_budget") for r in fake_oa.requests]
        fake_oa.behavior = FakeBehavior(reply="Fine.")
        history: Any = [
            *QUESTION,
            {"role": "assistant", "content": whole.content},
            {"role": "user", "content": "And tomorrow?"},
        ]
        await c.messages.create(model="chat-oa", max_tokens=2048, messages=history)
    assert budgets == [1024, 1024]
    [thought, text] = whole.content
    assert thought.type == "thinking"
    assert thought.thinking == THOUGHT
    assert thought.signature.startswith("iop-edge.")
    assert text.type == "text"
    assert text.text == "Hello!"
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in whole.content]
    kinds = [d.type for d in deltas]
    assert kinds.index("signature_delta") == kinds.count("thinking_delta") >= 2
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == THOUGHT
    assistant = fake_oa.requests[-1].json["messages"][1]
    assert assistant == {"role": "assistant", "content": "Hello!", "reasoning_content": THOUGHT}


async def test_ollama_thinking_round_trip(fake_oa: FakeOpenAI, fake_ol: FakeOllama) -> None:
    """Thinking enabled is Ollama's ``think: true``; its ``thinking`` comes back as a thinking
    block (and thinking_delta); sent back, it is the turn's ``thinking``, not its content."""
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        fields: Any = {"model": "chat-ol", "max_tokens": 2048, "messages": QUESTION}
        whole = await c.messages.create(**fields, thinking=thinking)
        streamed, deltas = await _streamed(c, **fields, thinking=thinking)
        thinks = [r.json.get("think") for r in fake_ol.requests]
        history: Any = [
            *QUESTION,
            {"role": "assistant", "content": whole.content},
            {"role": "user", "content": "And tomorrow?"},
        ]
        await c.messages.create(model="chat-ol", max_tokens=2048, messages=history)
    assert thinks == [True, True]
    [thought, text] = whole.content
    assert thought.type == "thinking"
    assert thought.thinking == fake_thinking(ASK)
    assert thought.signature
    assert text.type == "text"
    assert text.text == ASK
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in whole.content]
    streamed_thought = "".join(d.thinking for d in deltas if d.type == "thinking_delta")
    assert streamed_thought == fake_thinking(ASK)
    assistant = fake_ol.requests[-1].json["messages"][1]
    assert assistant == {"role": "assistant", "content": ASK, "thinking": fake_thinking(ASK)}


@pytest.mark.parametrize(
    ("thinking", "budget"),
    [
        ({"type": "enabled", "budget_tokens": 1024}, 1024),
        ({"type": "disabled"}, 0),
        ({"type": "adaptive"}, 256),  # the group's default_thinking_token_budget
        (None, 256),
    ],
)
async def test_the_thinking_request_is_the_groups_thinking_token_budget(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, thinking: Any, budget: int
) -> None:
    doc = edge_doc(fake_oa, fake_ol)
    doc["models"][0]["default_thinking_token_budget"] = 256
    extra: Any = {} if thinking is None else {"thinking": thinking}
    async with running_edge(doc) as edge, anthropic_client(edge) as c:
        await c.messages.create(model="chat-oa", max_tokens=2048, messages=QUESTION, **extra)
    assert fake_oa.requests[-1].json["thinking_token_budget"] == budget


@pytest.mark.parametrize(
    ("effort", "sent"), [("low", "low"), ("medium", "medium"), ("high", "high"), ("max", "high")]
)
async def test_output_config_effort_is_reasoning_effort(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, effort: Any, sent: str
) -> None:
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        await c.messages.create(
            model="chat-oa", max_tokens=64, messages=QUESTION, output_config={"effort": effort}
        )
        await c.messages.create(
            model="chat-ol", max_tokens=64, messages=QUESTION, output_config={"effort": effort}
        )
    assert fake_oa.requests[-1].json["reasoning_effort"] == sent
    assert fake_ol.requests[-1].json["think"] == sent


async def test_thinking_disabled_turns_ollama_thinking_off(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        answer = await c.messages.create(
            model="chat-ol", max_tokens=64, messages=QUESTION, thinking={"type": "disabled"}
        )
    assert fake_ol.requests[-1].json["think"] is False
    assert [b.type for b in answer.content] == ["text"]


# -- images -----------------------------------------------------------------------------------


async def test_images_base64_and_url_reach_openai_compat_as_image_url_parts(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    url = "https://images.example/cat.png"
    content: Any = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": url}},
        {"type": "text", "text": "What is in these?"},
    ]
    async with running_edge(edge_doc(fake_oa, fake_ol)) as edge, anthropic_client(edge) as c:
        answer = await c.messages.create(
            model="chat-oa", max_tokens=64, messages=[{"role": "user", "content": content}]
        )
    assert fake_oa.requests[-1].json["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "What is in these?"},
            ],
        }
    ]
    assert answer.content[0].type == "text"


# -- Claude Code ------------------------------------------------------------------------------


async def test_a_claude_code_request_is_served_translated(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """Claude Code's third turn (tests/helpers/claude_code.py), sent as Claude Code sends it —
    its model name an alias, the beta header, streamed: the upstream gets the chat body without
    the billing header or any cache_control, ``metadata.user_id`` as ``user``, the thinking in
    history as reasoning, the budget as ``thinking_token_budget``; neither the client's key
    nor the Anthropic headers go upstream; the client gets a whole Message."""
    body = turn_with_history()
    doc = edge_doc(fake_oa, fake_ol)
    doc["models"][0].update(aliases=[body["model"]], context_window_tokens=200_000)
    del body["stream"]
    temperature = body.pop("temperature")
    betas: Any = ["interleaved-thinking-2025-05-14", "context-management-2025-06-27"]
    async with (
        running_edge(doc) as edge,
        anthropic_client(edge) as c,
        c.beta.messages.stream(**body, betas=betas, extra_body={"temperature": temperature}) as s,
    ):
        final = await s.get_final_message()
    sent = fake_oa.requests[-1]
    assert sent.json == {**expected_chat(), "model": "fake-model", "thinking_token_budget": 31999}
    encoded = json.dumps(sent.json)
    assert "cache_control" not in encoded
    assert "x-anthropic-billing-header" not in encoded
    for header in ("x-api-key", "Authorization", "anthropic-beta", "anthropic-version"):
        assert header not in sent.headers
    assert final.model == body["model"]
    assert final.stop_reason == "end_turn"
    assert final.content[0].type == "text"
    assert final.content[0].text == "It is in dist/ instead."

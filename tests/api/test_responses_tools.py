"""``/v1/responses`` translated, with the official ``openai`` SDK against a running edge: function
calling and reasoning both ways — the answer's items, their stream, and what the upstream gets
when the client sends them back, explicitly or through ``previous_response_id`` — and a request
in Codex's own shape, turn after turn; checked on what reached the fake upstreams."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_ollama import FakeOllama, fake_thinking
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import codex
from tests.helpers.api import edge_client, edge_doc
from tests.helpers.responses import check_responses_grammar, read_events, without_parsed

ASK = "What is the weather in Paris?"
QUESTION: Any = [{"type": "message", "role": "user", "content": ASK}]
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": WEATHER_SCHEMA,
    "strict": False,
}
ARGS = '{"city": "Paris", "days": 3}'
THOUGHT = "The user wants the weather. I should call the tool."


def without_ids(items: list[Any], *also: str) -> list[dict[str, Any]]:
    """The items as dicts without their ``id`` (and the fields ``also`` names)."""
    dumped = [without_parsed(item.model_dump()) for item in items]
    return [{k: v for k, v in item.items() if k not in {"id", *also}} for item in dumped]


async def streamed(client: openai.AsyncOpenAI, **fields: Any) -> tuple[Any, list[tuple[str, str]]]:
    """The final response of a streamed request and its delta events (type, delta), in order."""
    deltas: list[tuple[str, str]] = []
    async with client.responses.stream(**fields) as stream:
        async for event in stream:
            if event.type.endswith(".delta"):
                delta: Any = event
                deltas.append((delta.type, delta.delta))
        final = await stream.get_final_response()
    return final, deltas


def returned(response: Any) -> Any:
    """A response's output items as a client sends them back: the SDK's own objects, which it
    serialises (its types name the input items apart, hence ``Any``)."""
    return response.output


def sent_messages(fake: FakeOpenAI | FakeOllama) -> list[dict[str, Any]]:
    """The chat messages of the last request the fake upstream got."""
    messages: list[dict[str, Any]] = fake.requests[-1].json["messages"]
    return messages


# -- function calling -------------------------------------------------------------------------


async def test_openai_compat_function_calling_round_trip(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """The model calls the tool: a ``function_call`` item with the upstream's ``call_id`` and
    its arguments as the upstream gave them; streamed, the argument deltas accumulate to the
    same arguments and the final response equals the whole one. The client's
    ``function_call_output`` goes upstream as a ``tool`` message answering that id, after the
    assistant's call — the same whether the client continues with ``previous_response_id`` or
    sends the items itself."""
    fake_oa.behavior = FakeBehavior(reply="Let me check.", tool_call=f"get_weather:{ARGS}")
    async with edge_client(edge_doc(fake_oa, fake_ol)) as (_, c):
        whole = await c.responses.create(model="chat-oa", input=QUESTION, tools=[WEATHER])
        final, deltas = await streamed(c, model="chat-oa", input=QUESTION, tools=[WEATHER])
        sent_tools = fake_oa.requests[-1].json["tools"]
        fake_oa.behavior = FakeBehavior(reply="It is sunny in Paris.")
        message, call = whole.output
        assert call.type == "function_call"
        output: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        continued = await c.responses.create(
            model="chat-oa", previous_response_id=whole.id, input=[output], tools=[WEATHER]
        )
        by_id = sent_messages(fake_oa)
        explicit = await c.responses.create(
            model="chat-oa", input=[*QUESTION, *returned(whole), output], tools=[WEATHER]
        )
        by_items = sent_messages(fake_oa)
    assert message.type == "message"
    assert whole.output_text == "Let me check."
    assert (call.name, call.arguments, call.call_id) == ("get_weather", ARGS, "call_fake1")
    assert call.status == "completed"
    said, called = without_ids(whole.output)
    # (the upstream's call id of the streamed answer: the fake numbers them per request)
    assert without_ids(final.output) == [said, {**called, "call_id": "call_fake2"}]
    pieces = [d for kind, d in deltas if kind == "response.function_call_arguments.delta"]
    assert len(pieces) >= 2
    assert "".join(pieces) == ARGS
    assert json.loads(final.output[1].arguments) == {"city": "Paris", "days": 3}
    assert sent_tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": WEATHER_SCHEMA,
                "strict": False,
            },
        }
    ]
    expected = [
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_fake1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGS},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_fake1", "content": "sunny"},
    ]
    assert by_id == expected
    assert by_items == expected
    assert continued.output_text == explicit.output_text == "It is sunny in Paris."
    assert continued.previous_response_id == whole.id


async def test_the_argument_deltas_stream_as_the_upstream_sends_them(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """The raw stream: the call's item opens with empty arguments, each of the upstream's
    fragments is one ``response.function_call_arguments.delta`` as it comes, then ``.done``
    with the whole arguments; the grammar holds."""
    fake_oa.behavior = FakeBehavior(reply="", tool_call=f"get_weather:{ARGS}")
    async with (
        edge_client(edge_doc(fake_oa, fake_ol)) as (_, c),
        c.responses.with_streaming_response.create(
            model="chat-oa", input=QUESTION, tools=[WEATHER], stream=True
        ) as answer,
    ):
        raw = b"".join([chunk async for chunk in answer.iter_bytes()])
    events = read_events(raw)
    check_responses_grammar(events)
    names = [name for name, _ in events]
    assert names[2:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = events[2][1]["item"]
    assert (added["type"], added["arguments"], added["call_id"]) == (
        "function_call",
        "",
        "call_fake1",
    )
    half = len(ARGS) // 2  # (the fake sends the arguments in two fragments)
    assert [events[3][1]["delta"], events[4][1]["delta"]] == [ARGS[:half], ARGS[half:]]
    assert events[5][1]["arguments"] == ARGS


async def test_ollama_function_calling_round_trip(fake_oa: FakeOpenAI, fake_ol: FakeOllama) -> None:
    """The fake Ollama model calls the first tool with its first required parameter set to the
    prompt; the ``function_call_output`` goes back as Ollama's tool message (``tool_name``) —
    through ``previous_response_id`` and sent explicitly alike — and the model answers from
    it."""
    async with edge_client(edge_doc(fake_oa, fake_ol)) as (_, c):
        whole = await c.responses.create(model="chat-ol", input=QUESTION, tools=[WEATHER])
        final, deltas = await streamed(c, model="chat-ol", input=QUESTION, tools=[WEATHER])
        [call] = whole.output
        assert call.type == "function_call"
        output: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        continued = await c.responses.create(
            model="chat-ol", previous_response_id=whole.id, input=[output], tools=[WEATHER]
        )
        by_id = sent_messages(fake_ol)
        explicit = await c.responses.create(
            model="chat-ol", input=[*QUESTION, *returned(whole), output], tools=[WEATHER]
        )
        by_items = sent_messages(fake_ol)
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": ASK})
    assert call.call_id
    assert without_ids(final.output, "call_id") == without_ids(whole.output, "call_id")
    pieces = [d for kind, d in deltas if kind == "response.function_call_arguments.delta"]
    assert json.loads("".join(pieces)) == {"city": ASK}
    expected = [
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": ASK}}}],
        },
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    assert by_id == expected
    assert by_items == expected
    assert continued.output_text == explicit.output_text == "the tool said: sunny"


async def test_a_cli_provider_cannot_call_tools_a_400_naming_tools(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with edge_client(edge_doc(fake_oa, fake_ol)) as (_, c):
        with pytest.raises(openai.BadRequestError) as info:
            await c.responses.create(model="chat-cli", input=QUESTION, tools=[WEATHER])
    assert (info.value.param, info.value.code) == ("tools", "unsupported_parameter")
    assert "'tools': it cannot call tools" in info.value.message
    assert fake_oa.total_requests == fake_ol.total_requests == 0


# -- reasoning --------------------------------------------------------------------------------


async def test_openai_compat_reasoning_round_trip(fake_oa: FakeOpenAI, fake_ol: FakeOllama) -> None:
    """The upstream's ``reasoning_content`` is a ``reasoning`` item (its text as
    ``reasoning_text``) before the message, streamed as ``response.reasoning_text.delta``; sent
    back — explicitly or through ``previous_response_id`` — it goes upstream as the turn's
    ``reasoning_content``, never as text."""
    fake_oa.behavior = FakeBehavior(thinking=THOUGHT, reply="Hello!")
    async with edge_client(edge_doc(fake_oa, fake_ol)) as (_, c):
        whole = await c.responses.create(model="chat-oa", input=QUESTION)
        final, deltas = await streamed(c, model="chat-oa", input=QUESTION)
        fake_oa.behavior = FakeBehavior(reply="Fine.")
        more: Any = {"type": "message", "role": "user", "content": "And tomorrow?"}
        await c.responses.create(model="chat-oa", input=[*QUESTION, *returned(whole), more])
        by_items = sent_messages(fake_oa)
        await c.responses.create(model="chat-oa", previous_response_id=whole.id, input=[more])
        by_id = sent_messages(fake_oa)
    thought, message = whole.output
    assert thought.type == "reasoning"
    assert thought.content is not None
    assert [(p.type, p.text) for p in thought.content] == [("reasoning_text", THOUGHT)]
    assert thought.summary == []
    assert whole.output_text == "Hello!"
    assert message.type == "message"
    assert without_ids(final.output) == without_ids(whole.output)
    reasoning = [d for kind, d in deltas if kind == "response.reasoning_text.delta"]
    assert len(reasoning) >= 2
    assert "".join(reasoning) == THOUGHT
    assert whole.usage is not None
    assert whole.usage.output_tokens_details.reasoning_tokens == 0  # (the fake reports none)
    expected = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": "Hello!", "reasoning_content": THOUGHT},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert by_items == expected
    assert by_id == expected


async def test_ollama_reasoning_round_trip(fake_oa: FakeOpenAI, fake_ol: FakeOllama) -> None:
    """``reasoning.effort`` turns Ollama's ``think`` on; its ``thinking`` is a reasoning item;
    sent back, it is the turn's ``thinking``, not its content."""
    reasoning: Any = {"effort": "medium"}
    async with edge_client(edge_doc(fake_oa, fake_ol)) as (_, c):
        whole = await c.responses.create(model="chat-ol", input=QUESTION, reasoning=reasoning)
        final, deltas = await streamed(c, model="chat-ol", input=QUESTION, reasoning=reasoning)
        thinks = [r.json.get("think") for r in fake_ol.requests]
        more: Any = {"type": "message", "role": "user", "content": "And tomorrow?"}
        await c.responses.create(model="chat-ol", input=[*QUESTION, *returned(whole), more])
        by_items = sent_messages(fake_ol)
        await c.responses.create(model="chat-ol", previous_response_id=whole.id, input=[more])
        by_id = sent_messages(fake_ol)
    assert thinks == ["medium", "medium"]
    thought, message = whole.output
    assert thought.type == "reasoning"
    assert thought.content is not None
    assert [p.text for p in thought.content] == [fake_thinking(ASK)]
    assert message.type == "message"
    assert whole.output_text == ASK
    assert without_ids(final.output) == without_ids(whole.output)
    streamed_thought = "".join(d for kind, d in deltas if kind == "response.reasoning_text.delta")
    assert streamed_thought == fake_thinking(ASK)
    expected = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": ASK, "thinking": fake_thinking(ASK)},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert by_items == expected
    assert by_id == expected


# -- Codex ------------------------------------------------------------------------------------


async def test_a_codex_conversation_is_served_translated_turn_after_turn(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """Codex's first turn (tests/helpers/codex.py: its model an alias, ``store: false``,
    streamed, ``include`` the encrypted reasoning, its function tools, a reasoning summary
    asked for): the upstream gets the chat body — the instructions and the developer message
    as one system prompt, the tools, the effort; the stream is a Response with a reasoning
    item that carries ``encrypted_content`` and a ``shell`` call. Its second turn sends the
    reasoning back as Codex does (summary and encrypted content, no text) with the call and
    its output: the upstream gets the reasoning as the call's ``reasoning_content`` and the
    output as a ``tool`` message. Nothing is stored."""
    doc = edge_doc(fake_oa, fake_ol)
    doc["models"][0].update(aliases=[codex.MODEL], context_window_tokens=200_000)
    fake_oa.behavior = FakeBehavior(
        thinking=THOUGHT, reply="", tool_call='shell:{"command": ["ls", "-S"]}'
    )
    first = codex.request(codex.context())
    async with edge_client(doc) as (_, c):
        events = [event async for event in await c.responses.create(**first)]
        sent_first = fake_oa.requests[-1].json
        done = events[-1]
        assert done.type == "response.completed"
        response = done.response
        fake_oa.behavior = FakeBehavior(reply="big.py is the largest.")
        call = response.output[-1]
        assert call.type == "function_call"
        second = codex.request(
            [
                *codex.context(),
                *[codex.sent_back(item.model_dump()) for item in response.output],
                {"type": "function_call_output", "call_id": call.call_id, "output": "big.py\n"},
            ]
        )
        answer = [event async for event in await c.responses.create(**second)][-1]
        sent_second = fake_oa.requests[-1].json
        with pytest.raises(openai.NotFoundError):
            await c.responses.retrieve(response.id)
    system = {"role": "system", "content": f"{codex.INSTRUCTIONS}\n\n{codex.PERMISSIONS}"}
    opening = [
        system,
        {"role": "user", "content": codex.ENVIRONMENT},
        {"role": "user", "content": codex.TASK},
    ]
    assert sent_first["messages"] == opening
    assert sent_first["model"] == "fake-model"
    assert sent_first["reasoning_effort"] == "medium"
    assert sent_first["parallel_tool_calls"] is False
    assert sent_first["prompt_cache_key"] == codex.CONVERSATION
    assert [t["function"]["name"] for t in sent_first["tools"]] == [
        "shell",
        "update_plan",
        "view_image",
    ]
    assert sent_first["stream"] is True
    assert response.model == codex.MODEL
    assert response.store is False
    thought, call = response.output
    assert thought.type == "reasoning"
    assert thought.encrypted_content
    assert (call.name, call.arguments) == ("shell", '{"command": ["ls", "-S"]}')
    assert sent_second["messages"] == [
        *opening,
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": THOUGHT,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "shell", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "big.py\n"},
    ]
    assert answer.type == "response.completed"
    assert answer.response.output_text == "big.py is the largest."


async def test_a_codex_turn_with_history_reaches_the_upstream_as_its_chat_messages(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    """A later Codex turn (OpenAI's sealed reasoning, a summary, calls, an image a tool
    returned): the upstream gets :func:`codex.expected_chat_messages`; the stream follows the
    grammar."""
    doc = edge_doc(fake_oa, fake_ol)
    doc["models"][0].update(aliases=[codex.MODEL], context_window_tokens=200_000)
    body = codex.turn_with_history()
    async with (
        edge_client(doc) as (_, c),
        c.responses.with_streaming_response.create(**body) as answer,
    ):
        raw = b"".join([chunk async for chunk in answer.iter_bytes()])
    events = read_events(raw)
    check_responses_grammar(events)
    assert events[-1][0] == "response.completed"
    assert fake_oa.requests[-1].json["messages"] == codex.expected_chat_messages()

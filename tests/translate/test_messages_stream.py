"""Answers rendered as the Anthropic Messages event stream (messages_stream)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iop_edge.translate.chat_events import decode_completion
from iop_edge.translate.events import (
    Failure,
    Finish,
    ReasoningDelta,
    Start,
    TextDelta,
    TokenUsage,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)
from iop_edge.translate.messages_reply import render_message, thinking_signature
from iop_edge.translate.messages_stream import (
    PING,
    MessagesStreamTranslator,
    MessageStreamRenderer,
    ping,
)
from iop_edge.translate.sse import SseReader
from tests.helpers.translate import Call, Plan, check_grammar, completion, frames

Events = list[tuple[str, dict[str, Any]]]


def parse(raw: bytes) -> Events:
    """The stream's bytes read back as (event name, data) pairs."""
    messages = SseReader().feed(raw)
    assert all(m.event is not None for m in messages)
    return [(str(m.event), orjson.loads(m.data)) for m in messages]


def accumulate(events: Events) -> dict[str, Any]:
    """The Message a client builds from the events (as the SDKs do)."""
    message = dict(events[0][1]["message"])
    message["content"] = []
    message["usage"] = dict(message["usage"])
    partial: dict[int, str] = {}
    for name, payload in events[1:]:
        if name == "content_block_start":
            message["content"].append(dict(payload["content_block"]))
        elif name == "content_block_delta":
            block = message["content"][payload["index"]]
            delta = payload["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                partial[payload["index"]] = (
                    partial.get(payload["index"], "") + delta["partial_json"]
                )
        elif name == "content_block_stop" and payload["index"] in partial:
            message["content"][payload["index"]]["input"] = json.loads(partial[payload["index"]])
        elif name == "message_delta":
            message.update(payload["delta"])
            message["usage"].update(payload["usage"])
    return message


def stream_of(plan: Plan, *, estimate: int = 7, stops: tuple[str, ...] = ()) -> bytes:
    translator = MessagesStreamTranslator(
        model="claude-x", estimated_input_tokens=estimate, stop_sequences=stops
    )
    return translator.feed(frames(plan)) + translator.end()


def whole_of(plan: Plan, *, estimate: int = 7, stops: tuple[str, ...] = ()) -> dict[str, Any]:
    return render_message(
        decode_completion(completion(plan)),
        model="claude-x",
        estimated_input_tokens=estimate,
        stop_sequences=stops,
    )


def test_a_text_answer_event_for_event():
    plan = Plan(
        (("text", "Hel"), ("text", "lo")), usage={"prompt_tokens": 11, "completion_tokens": 2}
    )
    assert parse(stream_of(plan)) == [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_test1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-x",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 7, "output_tokens": 0},
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hel"},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "lo"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"input_tokens": 11, "output_tokens": 2},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def test_reasoning_then_a_tool_call_streams_thinking_signature_and_partial_json():
    plan = Plan(
        (("reasoning", "think"), Call("call_1", "Read", ('{"path"', ':"a"}'))),
        finish="tool_calls",
    )
    events = parse(stream_of(plan))
    check_grammar(events)
    assert [
        (n, p.get("index"), p.get("delta", p.get("content_block"))) for n, p in events[1:-2]
    ] == [
        ("content_block_start", 0, {"type": "thinking", "thinking": "", "signature": ""}),
        ("content_block_delta", 0, {"type": "thinking_delta", "thinking": "think"}),
        (
            "content_block_delta",
            0,
            {"type": "signature_delta", "signature": thinking_signature("think")},
        ),
        ("content_block_stop", 0, None),
        (
            "content_block_start",
            1,
            {"type": "tool_use", "id": "call_1", "name": "Read", "input": {}},
        ),
        ("content_block_delta", 1, {"type": "input_json_delta", "partial_json": '{"path"'}),
        ("content_block_delta", 1, {"type": "input_json_delta", "partial_json": ':"a"}'}),
        ("content_block_stop", 1, None),
    ]
    # No usage reported: message_start's estimate stands, the output is estimated (17 bytes).
    assert events[-2][1]["usage"] == {"output_tokens": 5}
    assert accumulate(events) == whole_of(plan)


def test_a_failure_after_the_first_event_ends_with_an_error_event_never_message_stop():
    translator = MessagesStreamTranslator(model="m", estimated_input_tokens=1)
    head = frames(Plan((("text", "partial answer"),)))
    head = head[: head.index(b"data: ", len(b"data: ") * 3)]  # (role and text chunks only)
    out = translator.feed(head) + translator.fail(
        "upstream_timeout", "The provider did not answer in time."
    )
    events = parse(out)
    check_grammar(events)
    assert events[-1] == (
        "error",
        {
            "type": "error",
            "error": {"type": "timeout_error", "message": "The provider did not answer in time."},
        },
    )
    assert "message_stop" not in [name for name, _ in events]
    assert translator.done
    assert translator.end() == b""


def test_an_upstream_stream_that_ends_without_finishing_is_an_api_error_event():
    translator = MessagesStreamTranslator(model="m", estimated_input_tokens=1)
    out = translator.feed(
        b'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
    )
    events = parse(out + translator.end())
    check_grammar(events)
    assert events[-1][1]["error"] == {
        "type": "api_error",
        "message": "The upstream's answer broke off: the stream ended without a finish_reason.",
    }


def test_the_shell_may_start_the_message_early_and_its_id_stands():
    renderer = MessageStreamRenderer(model="m", estimated_input_tokens=3)
    early = renderer.start("msg_req42")
    assert renderer.started
    events = early + renderer.render_all(
        [
            Start("chatcmpl-other"),
            TextDelta("a"),
            ToolCallStart(0, "", "f"),
            ToolCallEnd(0, "{}"),
            Finish("tool_calls", None, TokenUsage(5, 1)),
        ]
    )
    check_grammar(events)
    assert events[0][1]["message"]["id"] == "msg_req42"
    assert events[4][1]["content_block"]["id"] == "toolu_req42_0"
    assert renderer.render(TextDelta("late")) == []


def test_a_stop_sequence_and_length_finishes():
    plan = Plan(
        (("text", "x"),), stop_reason="END", usage={"prompt_tokens": 1, "completion_tokens": 1}
    )
    events = parse(stream_of(plan, stops=("END",)))
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    events = parse(stream_of(Plan((("text", "x"),), finish="length")))
    assert events[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


def test_arguments_of_a_call_that_is_not_open_are_a_bug_not_output():
    renderer = MessageStreamRenderer(model="m", estimated_input_tokens=1)
    with pytest.raises(ValueError, match="tool call 0, which is not open"):
        renderer.render_all([Start("a"), ReasoningDelta("r"), ToolCallDelta(0, "{}")])


def test_a_failure_event_renders_as_the_error_for_its_code():
    renderer = MessageStreamRenderer(model="m", estimated_input_tokens=1)
    events = renderer.render_all([Start("a"), Failure("queue_full", "full")])
    assert events[-1] == (
        "error",
        {"type": "error", "error": {"type": "overloaded_error", "message": "full"}},
    )


def test_ping():
    assert ping() == PING
    assert parse(PING) == [("ping", {"type": "ping"})]


# -- property: any answer, however its frames are cut ------------------------------------------

_json_objects = st.dictionaries(
    st.text(max_size=4),
    st.one_of(st.integers(-1000, 1000), st.text(max_size=6), st.booleans(), st.none()),
    max_size=3,
)


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    pieces: list[Any] = []
    for position in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["text", "reasoning", "call"]))
        if kind == "call":
            text = orjson.dumps(draw(_json_objects)).decode() if draw(st.booleans()) else ""
            cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=4)))
            fragments = tuple(
                text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)
            )
            call_id = f"call_{position}" if draw(st.booleans()) else ""
            pieces.append(Call(call_id, draw(st.sampled_from(["Read", "Bash"])), fragments))
        else:
            pieces.append((kind, draw(st.text(max_size=8))))
    usage = draw(
        st.one_of(
            st.none(),
            st.builds(
                lambda p, c, cached: {
                    "prompt_tokens": p,
                    "completion_tokens": c,
                    **(
                        {"prompt_tokens_details": {"cached_tokens": cached}}
                        if cached is not None
                        else {}
                    ),
                },
                st.integers(0, 500),
                st.integers(0, 500),
                st.one_of(st.none(), st.integers(0, 500)),
            ),
        )
    )
    finish = draw(st.sampled_from(["stop", "length", "tool_calls", "content_filter"]))
    stop = draw(st.sampled_from([None, "END", "OTHER"]))
    return Plan(tuple(pieces), finish, usage, stop)


def _canonical(plan: Plan) -> bool:
    """Reasoning, then text, then calls (the order of a whole Message's blocks)."""
    order = {"reasoning": 0, "text": 1}
    ranks = [
        2 if isinstance(p, Call) else order[p[0]]
        for p in plan.pieces
        if isinstance(p, Call) or p[1]
    ]
    return ranks == sorted(ranks)


@given(plan=plans(), cuts=st.lists(st.integers(0, 10_000), max_size=5))
def test_any_answer_streams_grammar_valid_events_that_add_up_to_the_whole_message(plan, cuts):
    raw = frames(plan)
    translator = MessagesStreamTranslator(
        model="claude-x", estimated_input_tokens=7, stop_sequences=("END",)
    )
    out = b""
    for start, end in zip([0, *sorted(cuts)], [*sorted(cuts), len(raw)], strict=True):
        out += translator.feed(raw[start:end])
    out += translator.end()
    events = parse(out)
    check_grammar(events)
    streamed = accumulate(events)
    whole = whole_of(plan, stops=("END",))

    def joined(message: dict[str, Any], kind: str, key: str) -> str:
        return "".join(b[key] for b in message["content"] if b["type"] == kind)

    assert joined(streamed, "text", "text") == joined(whole, "text", "text")
    assert joined(streamed, "thinking", "thinking") == joined(whole, "thinking", "thinking")
    tools = [b for b in streamed["content"] if b["type"] == "tool_use"]
    assert tools == [b for b in whole["content"] if b["type"] == "tool_use"]
    for key in ("id", "model", "stop_reason", "stop_sequence", "usage"):
        assert streamed[key] == whole[key], key
    if _canonical(plan):
        assert streamed == whole


@given(plan=plans(), keep=st.integers(0, 10_000))
def test_a_stream_cut_short_ends_with_an_error_event_and_stays_grammar_valid(plan, keep):
    raw = frames(plan)
    raw = raw[: min(keep, len(raw) - len(b"data: [DONE]\n\n") - 1)]
    translator = MessagesStreamTranslator(model="m", estimated_input_tokens=1)
    out = translator.feed(raw)
    started = translator.renderer.started
    assert not translator.done  # (no [DONE], no end: the answer is not over)
    out += translator.fail("upstream_error", "The provider failed.")
    events = parse(out)
    if started:
        check_grammar(events)
    else:  # (nothing sent yet: the shell answers with an error status instead)
        assert [name for name, _ in events] == ["error"]
    assert events[-1][1]["error"] == {"type": "api_error", "message": "The provider failed."}

"""Chat answers decoded into the internal form (iop_edge.translate.chat_events)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from iop_edge.errors import AdapterError
from iop_edge.translate.chat_events import ChatStreamDecoder, decode_completion, read_usage
from iop_edge.translate.events import (
    Answer,
    AnswerBuilder,
    AnswerEvent,
    Failure,
    Finish,
    ReasoningDelta,
    Start,
    TextDelta,
    TokenUsage,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)
from tests.helpers.translate import Call, Plan, chunks, completion, frames


def decode(items: list[dict[str, Any]], *, done: bool = True) -> list[AnswerEvent]:
    decoder = ChatStreamDecoder()
    events: list[AnswerEvent] = []
    for item in items:
        events += decoder.feed(item)
    return events + (decoder.end() if done else [])


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "chatcmpl-x", "choices": choices, **extra}


def test_text_and_reasoning_deltas_in_order_then_the_finish_with_the_last_chunks_usage():
    events = decode(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"reasoning_content": "think"}),
            chunk({"reasoning": " more"}),  # (newer vLLM's field name)
            chunk({"content": "Hi"}),
            chunk({}, "stop"),
            chunk(
                None,
                usage={
                    "prompt_tokens": 10,
                    "completion_tokens": 4,
                    "prompt_tokens_details": {"cached_tokens": 6},
                    "completion_tokens_details": {"reasoning_tokens": 2},
                },
            ),
        ]
    )
    assert events == [
        Start("chatcmpl-x"),
        ReasoningDelta("think"),
        ReasoningDelta(" more"),
        TextDelta("Hi"),
        Finish("stop", None, TokenUsage(10, 4, 6, 2)),
    ]


def test_tool_call_deltas_are_grouped_by_index_and_each_call_ends_with_its_whole_arguments():
    events = decode(
        [
            chunk({"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "a"}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x":'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
            chunk(
                {
                    "tool_calls": [
                        {"index": 1, "id": "c1", "function": {"name": "b", "arguments": "{}"}}
                    ]
                }
            ),
            chunk({}, "tool_calls"),
        ]
    )
    assert events == [
        Start("chatcmpl-x"),
        ToolCallStart(0, "c0", "a"),
        ToolCallDelta(0, '{"x":'),
        ToolCallDelta(0, "1}"),
        ToolCallEnd(0, '{"x":1}'),
        ToolCallStart(1, "c1", "b"),
        ToolCallDelta(1, "{}"),
        ToolCallEnd(1, "{}"),
        Finish("tool_calls", None, None),
    ]


def test_fragments_before_the_name_wait_for_it_and_items_without_index_follow_the_id():
    events = decode(
        [
            chunk({"tool_calls": [{"id": "c0", "function": {"arguments": '{"a"'}}]}),
            chunk({"tool_calls": [{"function": {"name": "f", "arguments": ":1}"}}]}),
            chunk({"tool_calls": [{"id": "c1", "function": {"name": "g"}}]}),
            chunk({}, "tool_calls"),
        ]
    )
    assert events[1:] == [
        ToolCallStart(0, "c0", "f"),
        ToolCallDelta(0, '{"a":1}'),  # (what waited, and the item that named it, at once)
        ToolCallEnd(0, '{"a":1}'),
        ToolCallStart(1, "c1", "g"),
        ToolCallEnd(1, "{}"),  # (no arguments at all: the empty object)
        Finish("tool_calls", None, None),
    ]


def test_text_after_a_tool_call_closes_it_first():
    events = decode(
        [
            chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f"}}]}),
            chunk({"content": "done"}),
            chunk({}, "tool_calls"),
        ]
    )
    assert events[1:] == [
        ToolCallStart(0, "c", "f"),
        ToolCallEnd(0, "{}"),
        TextDelta("done"),
        Finish("tool_calls", None, None),
    ]


@pytest.mark.parametrize(
    ("items", "why"),
    [
        (
            [
                chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f"}}]}),
                chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g"}}]}),
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
            ],
            "tool call 0 resumed after a later call or text began",
        ),
        (
            [
                chunk(
                    {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "[1]"}}]}
                ),
                chunk({}, "tool_calls"),
            ],
            "tool call 0 ('f') has arguments that are not a JSON object: [1]",
        ),
        (
            [
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
                chunk({}, "stop"),
            ],
            "tool call 0 has no function name",
        ),
        ([chunk({"content": "cut"})], "the stream ended without a finish_reason"),
        ([chunk({"content": "x"}, "abort")], "the upstream ended the answer with 'abort'"),
        (
            [chunk(None, error={"message": "boom"})],
            "the upstream reported an error: {'message': 'boom'}",
        ),
    ],
)
def test_what_breaks_an_answer_is_a_failure_and_nothing_follows_it(items, why):
    events = decode(items)
    assert events[-1] == Failure("upstream_error", f"The upstream's answer broke off: {why}.")
    assert [e for e in events if isinstance(e, Finish)] == []


def test_finish_reasons_are_normalised_and_the_answer_decides_tool_calls():
    def reason(raw: str, with_call: bool) -> str:
        delta = {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f"}}]}
        events = decode([chunk(delta if with_call else {"content": "x"}, raw)])
        finish = events[-1]
        assert isinstance(finish, Finish)
        return finish.reason

    assert reason("stop", False) == "stop"
    assert reason("length", False) == "length"
    assert reason("content_filter", False) == "content_filter"
    assert reason("eos_token", False) == "stop"  # (TGI)
    assert reason("something_new", False) == "stop"
    assert reason("tool_calls", False) == "stop"
    assert reason("stop", True) == "tool_calls"
    assert reason("function_call", True) == "tool_calls"
    assert reason("length", True) == "length"


def test_vllms_stop_reason_names_the_stop_sequence():
    events = decode(
        [
            {
                "id": "c",
                "choices": [
                    {"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}
                ],
            }
        ]
    )
    assert events[-1] == Finish("stop", "END", None)


def test_frames_decode_across_any_cut_and_done_ends_the_answer():
    plan = Plan(
        (("text", "héllo"), ("text", " world")), usage={"prompt_tokens": 3, "completion_tokens": 2}
    )
    raw = frames(plan)
    for cut in range(len(raw)):
        decoder = ChatStreamDecoder()
        events = decoder.feed_frames(raw[:cut]) + decoder.feed_frames(raw[cut:])
        assert decoder.done
        assert events == [
            Start("chatcmpl-test1"),
            TextDelta("héllo"),
            TextDelta(" world"),
            Finish("stop", None, TokenUsage(3, 2)),
        ]
        assert decoder.end() == []


def test_a_frame_that_is_not_a_json_object_fails_the_answer():
    decoder = ChatStreamDecoder()
    events = decoder.feed_frames(b'data: {"id":"a","choices":[]}\n\ndata: [1]\n\n')
    assert events == [
        Start("a"),
        Failure(
            "upstream_error",
            "The upstream's answer broke off: a stream event is not a JSON object: b'[1]'.",
        ),
    ]
    assert decoder.feed_frames(b"data: [DONE]\n\n") == []


def test_a_completion_decodes_to_the_answer_its_stream_adds_up_to():
    plan = Plan(
        (
            ("reasoning", "hmm"),
            ("text", "Let me look."),
            Call("call_1", "read", ('{"path":', '"a.py"}')),
            Call("", "list", ()),
        ),
        finish="tool_calls",
        usage={"prompt_tokens": 9, "completion_tokens": 7},
    )
    whole = decode_completion(orjson.dumps(completion(plan)))
    assert whole == Answer(
        "chatcmpl-test1",
        "Let me look.",
        "hmm",
        (ToolCall("call_1", "read", '{"path":"a.py"}'), ToolCall("", "list", "{}")),
        Finish("tool_calls", None, TokenUsage(9, 7)),
    )
    builder = AnswerBuilder()
    for event in decode(chunks(plan)):
        builder.add(event)
    assert builder.answer() == whole


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"not json", "it is not JSON"),
        ({"choices": []}, "it has no choices[0].message"),
        (
            {
                "choices": [
                    {"message": {"tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}}
                ]
            },
            "tool call 0 ('f') has arguments that are not a JSON object: {",
        ),
        (
            {"choices": [{"message": {"tool_calls": [{"function": {}}]}}]},
            "tool call 0 has no function name",
        ),
        (
            {"choices": [{"message": {"content": "x"}, "finish_reason": "error"}]},
            "the upstream ended",
        ),
    ],
)
def test_an_unusable_completion_is_an_upstream_error_outside_the_providers_health(body, why):
    with pytest.raises(AdapterError) as caught:
        decode_completion(body if isinstance(body, bytes) else orjson.dumps(body))
    assert caught.value.code == "upstream_error"
    assert caught.value.failure is None
    assert why in str(caught.value)


def test_read_usage_takes_counts_and_ignores_what_is_not_one():
    assert read_usage(None) is None
    assert read_usage({"total_tokens": 3}) is None
    assert read_usage({"prompt_tokens": 2, "completion_tokens": True}) == TokenUsage(2, None)


def test_answer_builder_refuses_an_unfinished_or_failed_stream():
    builder = AnswerBuilder()
    builder.add(TextDelta("x"))
    with pytest.raises(ValueError, match="has not finished"):
        builder.answer()
    builder.add(Failure("upstream_timeout", "late"))
    with pytest.raises(ValueError, match="late"):
        builder.answer()


def test_frames_framed_otherwise_decode_as_exactly_framed_ones():
    """The adapters' exact framing is split at once; any other SSE framing (CRLF, no space
    after ``data:``, comments, a data field over two lines) goes through the general reader,
    with the same events."""
    plan = Plan((("text", "a"), ("text", "b")), usage={"prompt_tokens": 1, "completion_tokens": 2})
    exact = frames(plan)
    other = (
        exact.replace(b"data: ", b"data:")
        .replace(b"\n\n", b"\r\n\r\n")
        .replace(b"data:[DONE]", b": ping\r\ndata:[DONE]")
    )
    assert other != exact
    assert ChatStreamDecoder().feed_frames(other) == ChatStreamDecoder().feed_frames(exact)

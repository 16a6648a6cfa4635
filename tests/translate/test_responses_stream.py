"""Answers rendered as the OpenAI Responses event stream (responses_stream)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iop_edge.translate.chat_events import ChatStreamDecoder, decode_completion
from iop_edge.translate.events import (
    AnswerBuilder,
    Failure,
    Finish,
    ReasoningDelta,
    Start,
    TextDelta,
    TokenUsage,
)
from iop_edge.translate.responses_reply import render_response, seal_reasoning
from iop_edge.translate.responses_stream import ResponsesStreamRenderer, ResponsesStreamTranslator
from tests.helpers.responses import check_responses_grammar, read_events
from tests.helpers.translate import Call, Plan, completion, frames

ECHO: dict[str, Any] = {"instructions": "Be brief.", "store": False, "tool_choice": "auto"}
FIELDS: dict[str, Any] = {
    "response_id": "resp_7f3a",
    "created_at": 1_700_000_000,
    "model": "qwen3-coder",
    "echo": ECHO,
    "estimated_input_tokens": 11,
}
USAGE = {"prompt_tokens": 30, "completion_tokens": 9}
PLANS = {
    "text": Plan((("text", "Hello"), ("text", ", world"), ("text", "!")), usage=USAGE),
    "reasoning, text and calls": Plan(
        (
            ("reasoning", "They want a file. "),
            ("reasoning", "Read it."),
            ("text", "Reading."),
            Call("call_a", "read", ('{"pa', 'th": "a.', 'py"}')),
            Call("", "list", ()),
        ),
        finish="tool_calls",
        usage={**USAGE, "prompt_tokens_details": {"cached_tokens": 20}},
    ),
    "calls only": Plan(
        (Call("call_1", "shell", ('{"command":', ' ["ls"]}')),), finish="tool_calls", usage=USAGE
    ),
    "cut at the token limit": Plan((("text", "This is cu"),), finish="length", usage=USAGE),
    "no usage reported": Plan((("reasoning", "hm"), ("text", "héllo"))),
    "refused": Plan((), finish="content_filter", usage=USAGE),
}


def stream_of(plan: Plan, *, step: int = 0, **fields: Any) -> bytes:
    """The plan's frames through a translator, whole (``step`` 0) or cut every ``step`` bytes."""
    translator = ResponsesStreamTranslator(**{**FIELDS, **fields})
    raw = frames(plan)
    if not step:
        return translator.feed(raw) + translator.end()
    out = b"".join(translator.feed(raw[i : i + step]) for i in range(0, len(raw), step))
    return out + translator.end()


def whole_of(plan: Plan, **fields: Any) -> dict[str, Any]:
    return render_response(
        decode_completion(orjson.dumps(completion(plan))), **{**FIELDS, **fields}
    )


@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
def test_every_stream_follows_the_grammar_and_ends_with_the_whole_response(plan):
    """The key rule: a streamed answer's last Response is the non-streamed rendering."""
    events = read_events(stream_of(plan))
    check_responses_grammar(events)
    assert events[-1][1]["response"] == whole_of(plan)


@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
def test_the_stream_equals_the_answer_builders_rendering_of_the_same_events(plan):
    decoder = ChatStreamDecoder()
    events = decoder.feed_frames(frames(plan)) + decoder.end()
    builder = AnswerBuilder()
    renderer = ResponsesStreamRenderer(**FIELDS)
    for event in events:
        builder.add(event)
        renderer.render(event)
    assert renderer.response == render_response(builder.answer(), **FIELDS)
    assert renderer.failure is None


@given(st.integers(min_value=1, max_value=97))
def test_bytes_cut_anywhere_give_the_same_stream(step):
    plan = PLANS["reasoning, text and calls"]
    assert stream_of(plan, step=step) == stream_of(plan)


def test_what_a_client_adds_up_from_the_deltas_is_what_the_done_events_say():
    events = read_events(stream_of(PLANS["reasoning, text and calls"]))
    deltas: dict[str, str] = {}
    done: dict[str, str] = {}
    for name, payload in events:
        if name.endswith(".delta"):
            deltas[payload["item_id"]] = deltas.get(payload["item_id"], "") + payload["delta"]
        elif name in ("response.output_text.done", "response.reasoning_text.done"):
            done[payload["item_id"]] = payload["text"]
        elif name == "response.function_call_arguments.done":
            done[payload["item_id"]] = payload["arguments"]
    assert deltas == {
        "rs_7f3a_0": "They want a file. Read it.",
        "msg_7f3a_1": "Reading.",
        "fc_7f3a_2": '{"path": "a.py"}',
    }
    # (a call whose arguments never streamed is done with "{}")
    assert done == {**deltas, "fc_7f3a_3": "{}"}


def test_each_item_is_announced_in_progress_and_done_whole():
    events = read_events(stream_of(PLANS["reasoning, text and calls"]))
    added = [p["item"] for n, p in events if n == "response.output_item.added"]
    assert added == [
        {"id": "rs_7f3a_0", "type": "reasoning", "summary": [], "content": []},
        {
            "id": "msg_7f3a_1",
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        },
        {
            "id": "fc_7f3a_2",
            "type": "function_call",
            "status": "in_progress",
            "call_id": "call_a",
            "name": "read",
            "arguments": "",
        },
        {
            "id": "fc_7f3a_3",
            "type": "function_call",
            "status": "in_progress",
            "call_id": "call_7f3a_1",
            "name": "list",
            "arguments": "",
        },
    ]
    parts = [(p["item_id"], p["part"]) for n, p in events if n == "response.content_part.added"]
    assert parts == [
        ("rs_7f3a_0", {"type": "reasoning_text", "text": ""}),
        ("msg_7f3a_1", {"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
    ]
    text_delta = next(p for n, p in events if n == "response.output_text.delta")
    assert text_delta == {
        "type": "response.output_text.delta",
        "item_id": "msg_7f3a_1",
        "output_index": 1,
        "content_index": 0,
        "logprobs": [],
        "delta": "Reading.",
        "sequence_number": text_delta["sequence_number"],
    }


def test_a_cut_answer_ends_with_response_incomplete_and_its_message_incomplete():
    events = read_events(stream_of(PLANS["cut at the token limit"]))
    name, payload = events[-1]
    assert name == "response.incomplete"
    response = payload["response"]
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"
    item_done = [p["item"] for n, p in events if n == "response.output_item.done"]
    assert item_done[0]["status"] == "incomplete"


def test_the_in_progress_response_echoes_the_request_and_the_final_one_has_the_usage():
    events = read_events(stream_of(PLANS["reasoning, text and calls"]))
    created = events[0][1]["response"]
    assert (created["id"], created["created_at"], created["model"]) == (
        "resp_7f3a",
        1_700_000_000,
        "qwen3-coder",
    )
    assert (created["instructions"], created["store"], created["usage"]) == (
        "Be brief.",
        False,
        None,
    )
    assert events[-1][1]["response"]["usage"] == {
        "input_tokens": 30,
        "input_tokens_details": {"cached_tokens": 20},
        "output_tokens": 9,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 39,
    }


def test_a_failure_after_the_first_event_ends_with_response_failed_never_completed():
    translator = ResponsesStreamTranslator(**FIELDS)
    raw = frames(PLANS["text"])
    cut = raw.index(b"\n\n", raw.index(b", world")) + 2
    body = translator.feed(raw[:cut])
    body += translator.fail("upstream_timeout", "The provider 'gpu-1' timed out.")
    events = read_events(body)
    check_responses_grammar(events)
    name, payload = events[-1]
    assert name == "response.failed"
    assert not any(n == "response.completed" for n, _ in events)
    failed = payload["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "The provider 'gpu-1' timed out."}
    # (the open message, as it stood: not closed, as OpenAI leaves it)
    assert failed["output"] == [
        {
            "id": "msg_7f3a_0",
            "type": "message",
            "status": "incomplete",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "Hello, world", "annotations": [], "logprobs": []}
            ],
        }
    ]
    assert translator.failure == Failure("upstream_timeout", "The provider 'gpu-1' timed out.")
    assert translator.response == failed
    assert translator.done
    assert translator.feed(raw[cut:]) == b""
    assert translator.end() == b""
    assert translator.fail("upstream_error", "again") == b""


def test_an_upstream_answer_that_breaks_the_rules_fails_the_stream():
    plan = Plan((Call("call_1", "read", ('{"path": ',)),), finish="tool_calls")
    translator = ResponsesStreamTranslator(**FIELDS)
    events = read_events(translator.feed(frames(plan)) + translator.end())
    check_responses_grammar(events)
    assert events[-1][0] == "response.failed"
    assert translator.failure is not None
    assert translator.failure.code == "upstream_error"
    assert "not a JSON object" in events[-1][1]["response"]["error"]["message"]


def test_a_failure_before_any_event_is_still_a_well_formed_stream():
    translator = ResponsesStreamTranslator(**FIELDS)
    events = read_events(translator.fail("rate_limit_exceeded", "Slow down."))
    check_responses_grammar(events)
    assert [name for name, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    assert events[-1][1]["response"]["error"]["code"] == "rate_limit_exceeded"


def test_start_sends_the_head_once_before_the_answer():
    translator = ResponsesStreamTranslator(**FIELDS)
    head = translator.start()
    assert [name for name, _ in read_events(head)] == ["response.created", "response.in_progress"]
    assert translator.start() == b""
    events = read_events(head + translator.feed(frames(PLANS["text"])) + translator.end())
    check_responses_grammar(events)
    assert events[-1][1]["response"] == whole_of(PLANS["text"])


def test_interleaved_text_and_reasoning_get_an_item_per_run_in_their_order():
    renderer = ResponsesStreamRenderer(**FIELDS)
    body = b"".join(
        renderer.render(event)
        for event in (
            Start("chatcmpl-1"),
            TextDelta("a"),
            ReasoningDelta("b"),
            TextDelta("c"),
            Finish("stop", None, TokenUsage(1, 3)),
        )
    )
    events = read_events(body)
    check_responses_grammar(events)
    output = events[-1][1]["response"]["output"]
    assert [(item["id"], item["type"]) for item in output] == [
        ("msg_7f3a_0", "message"),
        ("rs_7f3a_1", "reasoning"),
        ("msg_7f3a_2", "message"),
    ]


def test_reasoning_is_sealed_in_its_done_item_when_the_request_includes_it():
    plan = PLANS["reasoning, text and calls"]
    include = ("reasoning.encrypted_content",)
    events = read_events(stream_of(plan, include=include))
    added = next(p["item"] for n, p in events if n == "response.output_item.added")
    done = next(p["item"] for n, p in events if n == "response.output_item.done")
    assert "encrypted_content" not in added
    assert done["encrypted_content"] == seal_reasoning("They want a file. Read it.")
    assert events[-1][1]["response"] == whole_of(plan, include=include)
    assert "encrypted_content" not in read_events(stream_of(plan))[-1][1]["response"]["output"][0]


def test_the_fast_path_and_the_general_reader_write_the_same_bytes():
    """A batch of exactly framed frames is split at once; the same bytes with CRLF line ends
    go through the general SSE reader: the stream must not differ."""
    plan = PLANS["reasoning, text and calls"]
    crlf = frames(plan).replace(b"\n", b"\r\n")
    translator = ResponsesStreamTranslator(**FIELDS)
    assert translator.feed(crlf) + translator.end() == stream_of(plan)

"""The translations read by the official ``anthropic`` SDK itself, over real HTTP.

A tiny server on 127.0.0.1 (:class:`~tests.helpers.canned_server.CannedServer`) answers with
the bytes the translation renders — a Messages event stream as ``text/event-stream``, a Message
as JSON, an error object with its status — and the SDK parses them as it parses Anthropic's API:
the streamed answer's ``get_final_message()`` must equal the non-streamed Message, a failure
after the first event must raise, and each error status must raise the SDK's class for it. The
server also keeps what the SDK sends, so the request translation is checked on the SDK's own
serialisation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import orjson
import pytest

from iop_edge.translate.anthropic_errors import ANTHROPIC_ERRORS, error_body
from iop_edge.translate.chat_events import decode_completion
from iop_edge.translate.messages_reply import message_body
from iop_edge.translate.messages_request import translate_request
from iop_edge.translate.messages_stream import PING, MessagesStreamTranslator
from tests.helpers import claude_code
from tests.helpers.canned_server import CannedServer
from tests.helpers.translate import Call, Plan, completion, frames

MODEL = "claude-sonnet-4-5"
ASK: dict[str, Any] = {
    "model": MODEL,
    "max_tokens": 1024,
    "messages": [{"role": "user", "content": "Hello"}],
}


@pytest.fixture
def server() -> Iterator[CannedServer]:
    canned = CannedServer()
    yield canned
    canned.close()


@pytest.fixture
def client(server: CannedServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0) as sdk:
        yield sdk


def streamed_bytes(plan: Plan, estimate: int = 9) -> bytes:
    translator = MessagesStreamTranslator(model=MODEL, estimated_input_tokens=estimate)
    raw = frames(plan)
    out = PING  # (as the shell sends while it waits: the SDK skips it)
    for start in range(0, len(raw), 7):  # (the adapter's bytes, cut anywhere)
        out += translator.feed(raw[start : start + 7])
    return out + translator.end()


def whole_bytes(plan: Plan, estimate: int = 9) -> bytes:
    answer = decode_completion(orjson.dumps(completion(plan)))
    return message_body(answer, model=MODEL, estimated_input_tokens=estimate)


USAGE = {"prompt_tokens": 20, "completion_tokens": 8}
PLANS = {
    "plain text": Plan((("text", "Hello"), ("text", ", world"), ("text", "!")), usage=USAGE),
    "tool use with arguments over many chunks": Plan(
        (
            ("text", "Let me read it."),
            Call("call_abc", "Read", ('{"file', '_path":', ' "/repo/', 'a.py", "li', 'mit": 20}')),
        ),
        finish="tool_calls",
        usage=USAGE,
    ),
    "two parallel tool calls": Plan(
        (
            Call("call_1", "Read", ('{"file_path":', ' "a.py"}')),
            Call("", "Bash", ('{"command": "ls -la"', "}")),
        ),
        finish="tool_calls",
        usage={**USAGE, "prompt_tokens_details": {"cached_tokens": 12}},
    ),
    "reasoning then text": Plan(
        (("reasoning", "The user greets. "), ("reasoning", "Greet back."), ("text", "Hi!")),
        usage=USAGE,
    ),
    "max_tokens finish": Plan((("text", "This answer is cut"),), finish="length", usage=USAGE),
    "no usage reported": Plan((("text", "estimated"),)),
}


@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
def test_the_sdks_final_streamed_message_equals_the_non_streamed_message(server, client, plan):
    server.answer(whole_bytes(plan))
    created = client.messages.create(**ASK)
    server.answer(streamed_bytes(plan), content_type="text/event-stream")
    with client.messages.stream(**ASK) as stream:
        final = stream.get_final_message()
    # (the stream sets stop_details, which a Message body leaves out, to None)
    assert final.to_dict(exclude_none=True) == created.to_dict(exclude_none=True)
    assert created.model == MODEL
    assert created.id == "msg_test1"


def test_what_the_sdk_reads_is_what_the_upstream_said(server, client):
    server.answer(
        streamed_bytes(PLANS["tool use with arguments over many chunks"]),
        content_type="text/event-stream",
    )
    with client.messages.stream(**ASK) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [block.type for block in final.content] == ["text", "tool_use"]
    text, call = final.content
    assert text.type == "text"
    assert text.text == "Let me read it."
    assert call.type == "tool_use"
    assert (call.id, call.name, call.input) == (
        "call_abc",
        "Read",
        {"file_path": "/repo/a.py", "limit": 20},
    )
    assert (final.usage.input_tokens, final.usage.output_tokens) == (20, 8)

    server.answer(
        streamed_bytes(PLANS["two parallel tool calls"]), content_type="text/event-stream"
    )
    with client.messages.stream(**ASK) as stream:
        final = stream.get_final_message()
    assert [(b.id, b.input) for b in final.content if b.type == "tool_use"] == [
        ("call_1", {"file_path": "a.py"}),
        ("toolu_test1_1", {"command": "ls -la"}),
    ]
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens) == (8, 12)

    server.answer(streamed_bytes(PLANS["reasoning then text"]), content_type="text/event-stream")
    with client.messages.stream(**ASK) as stream:
        thinking = [e.thinking for e in stream if e.type == "thinking"]
        final = stream.get_final_message()
    assert thinking == ["The user greets. ", "Greet back."]
    assert final.content[0].type == "thinking"
    assert final.content[0].signature.startswith("iop-edge.")
    assert final.stop_reason == "end_turn"

    server.answer(streamed_bytes(PLANS["max_tokens finish"]), content_type="text/event-stream")
    with client.messages.stream(**ASK) as stream:
        assert stream.get_final_message().stop_reason == "max_tokens"


def test_a_failure_after_the_first_event_makes_the_sdk_raise_not_return_a_message(server, client):
    translator = MessagesStreamTranslator(model=MODEL, estimated_input_tokens=9)
    raw = frames(Plan((("text", "The answer is"),)))
    body = translator.feed(raw[: raw.index(b"\n\n", raw.index(b"The answer")) + 2])
    body += translator.fail("upstream_error", "The provider 'gpu-1' failed.")
    server.answer(body, content_type="text/event-stream")
    seen: list[str] = []

    def read_all(stream: anthropic.MessageStreamManager) -> None:
        with stream as events:
            seen.extend(event.type for event in events)

    with pytest.raises(anthropic.APIStatusError) as caught:
        read_all(client.messages.stream(**ASK))
    assert "message_start" in seen
    assert "text" in seen
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "api_error", "message": "The provider 'gpu-1' failed."},
    }


EXCEPTION_OF_STATUS = {
    400: anthropic.BadRequestError,
    401: anthropic.AuthenticationError,
    403: anthropic.PermissionDeniedError,
    404: anthropic.NotFoundError,
    405: anthropic.APIStatusError,
    413: anthropic.ContentTooLargeError,
    429: anthropic.RateLimitError,
    499: anthropic.ClientClosedRequestError,
    500: anthropic.InternalServerError,
    504: anthropic.GatewayTimeoutError,
    529: anthropic.OverloadedError,
}


@pytest.mark.parametrize("code", sorted(ANTHROPIC_ERRORS))
def test_every_error_of_the_table_raises_the_sdks_class_for_it(server, client, code):
    status, body = error_body(code, f"refused: {code}")
    server.answer(body, status=status)
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(**ASK)
    assert type(caught.value) is EXCEPTION_OF_STATUS[status]
    assert caught.value.status_code == status
    assert caught.value.body == {
        "type": "error",
        "error": {"type": ANTHROPIC_ERRORS[code][0], "message": f"refused: {code}"},
    }


def test_the_sdks_own_request_with_history_translates_to_the_expected_chat_body(server, client):
    """Claude Code's turn as the SDK serialises it (its typed params, its JSON)."""
    turn = claude_code.turn_with_history()
    del turn["stream"]  # (the SDK's stream() sets it)
    # (not parameters of this SDK version: sent as Claude Code sends them, in the body)
    extra = {name: turn.pop(name) for name in ("context_management", "temperature")}
    server.answer(streamed_bytes(PLANS["plain text"]), content_type="text/event-stream")
    with client.messages.stream(**turn, extra_body=extra) as stream:
        assert stream.get_final_message().content[0].type == "text"
    sent = server.requests[-1]
    assert sent["system"][0]["text"].startswith("x-anthropic-billing-header:")
    request = translate_request(sent)
    assert request.chat == claude_code.expected_chat()
    assert request.dropped == ("context_management",)

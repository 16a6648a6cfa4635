"""Readers and checkers of OpenAI Responses streams, for the translation and surface tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from iop_edge.translate.sse import SseReader

Events = list[tuple[str, dict[str, Any]]]

_TERMINAL = ("response.completed", "response.incomplete", "response.failed")
_DELTA_OF = {
    "message": "response.output_text.delta",
    "reasoning": "response.reasoning_text.delta",
    "function_call": "response.function_call_arguments.delta",
}
_CLOSING_OF = {
    "message": [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ],
    "reasoning": [
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ],
    "function_call": ["response.function_call_arguments.done", "response.output_item.done"],
}


def read_events(raw: bytes) -> Events:
    """A stream's bytes read back as (event name, data) pairs; every event must be named."""
    messages = SseReader().feed(raw)
    assert all(m.event is not None for m in messages), "an event without a name"
    return [(str(m.event), orjson.loads(m.data)) for m in messages]


def check_responses_grammar(events: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """Assert that ``events`` follow the Responses stream grammar (responses_stream's
    docstring): ``sequence_number`` 0, 1, 2…; ``type`` the event's name; created and
    in_progress first, with an in-progress Response of no output; items opened at output
    indexes 0, 1, 2…, each with its content part (messages and reasoning), deltas of its kind
    only while it is open, and its closing events in order before the next opens; one terminal
    event last (completed or incomplete with no item open and the items' final forms; failed
    with an error)."""
    assert events, "no events"
    for number, (name, payload) in enumerate(events):
        assert payload["type"] == name
        assert payload["sequence_number"] == number, f"event {number} ({name}) is misnumbered"
    assert [name for name, _ in events[:2]] == ["response.created", "response.in_progress"]
    for _, payload in events[:2]:
        assert payload["response"]["status"] == "in_progress"
        assert payload["response"]["output"] == []
    done_items: list[dict[str, Any]] = []
    open_item: dict[str, Any] | None = None
    closing: list[str] = []
    for position, (name, payload) in enumerate(events[2:], start=2):
        if name in _TERMINAL:
            assert position == len(events) - 1, f"{name} is not the last event"
            response = payload["response"]
            if name == "response.failed":
                assert response["status"] == "failed"
                assert set(response["error"]) == {"code", "message"}
                return
            assert open_item is None, f"{name} with an item open"
            assert not closing, f"{name} while closing an item"
            assert response["status"] == name.removeprefix("response.")
            assert response["output"] == done_items
            assert response["error"] is None
            assert type(response["usage"]["total_tokens"]) is int
            return
        if closing:
            assert name == closing.pop(0), f"event {position} ({name}) while closing an item"
            if name == "response.output_item.done":
                assert open_item is not None
                assert payload["output_index"] == open_item["index"]
                assert payload["item"]["id"] == open_item["id"]
                assert payload["item"]["type"] == open_item["kind"]
                done_items.append(payload["item"])
                open_item = None
            continue
        if name == "response.output_item.added":
            assert open_item is None, "an item opens before the last one is done"
            assert payload["output_index"] == len(done_items)
            item = payload["item"]
            open_item = {"index": len(done_items), "id": item["id"], "kind": item["type"]}
            if item["type"] != "function_call":
                assert item["content"] == []
                assert events[position + 1][0] == "response.content_part.added"
            continue
        assert open_item is not None, f"event {position} ({name}) with no item open"
        assert payload["item_id"] == open_item["id"]
        assert payload["output_index"] == open_item["index"]
        if name == "response.content_part.added":
            assert payload["content_index"] == 0
        elif name == _DELTA_OF[open_item["kind"]]:
            assert isinstance(payload["delta"], str)
            assert payload["delta"], "an empty delta"
        elif name == _CLOSING_OF[open_item["kind"]][0]:
            closing = _CLOSING_OF[open_item["kind"]][1:]
        else:
            raise AssertionError(f"event {position} ({name}) in a {open_item['kind']} item")
    raise AssertionError("the stream ended without a terminal event")


def without_parsed(value: Any) -> Any:
    """A dumped ``ParsedResponse`` without what the SDK's parsing adds (``parsed``,
    ``parsed_arguments``), to compare with a plain ``Response``."""
    if isinstance(value, dict):
        return {
            k: without_parsed(v)
            for k, v in value.items()
            if k not in ("parsed", "parsed_arguments")
        }
    if isinstance(value, list):
        return [without_parsed(v) for v in value]
    return value

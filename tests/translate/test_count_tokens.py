"""The estimate of /v1/messages/count_tokens (count_tokens)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iop_edge.api.bodies import estimate_input_tokens
from iop_edge.errors import RequestError
from iop_edge.translate.count_tokens import (
    IMAGE_TOKENS,
    count_input_tokens,
    estimate_chat_tokens,
)
from tests.helpers import claude_code

_text = st.text(max_size=30)
_parts = st.lists(st.builds(lambda t: {"type": "text", "text": t}, _text), max_size=3)
_calls = st.lists(
    st.builds(
        lambda n, a: {"id": "c", "type": "function", "function": {"name": n, "arguments": a}},
        _text,
        _text,
    ),
    max_size=2,
)
_messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "user", "assistant", "tool"]),
            "content": st.one_of(_text, _parts),
        },
        optional={"name": _text, "tool_calls": _calls},
    ),
    min_size=1,
    max_size=5,
)
_tools = st.lists(
    st.builds(
        lambda n, d: {
            "type": "function",
            "function": {"name": n, "description": d, "parameters": {}},
        },
        _text,
        _text,
    ),
    max_size=3,
)


@given(messages=_messages, tools=_tools)
def test_admission_estimates_a_chat_body_with_the_same_formula(messages, tools):
    """One formula: a Messages request is classed and checked at admission exactly as
    count_tokens counts it."""
    chat: dict[str, Any] = {"model": "m", "messages": messages}
    if tools:
        chat["tools"] = tools
    assert estimate_chat_tokens(chat) == estimate_input_tokens(chat, "chat/completions")


def test_an_image_counts_toward_the_admission_estimate_of_a_chat_request():
    """Before, an image counted as nothing at admission: a request of many images could take
    a general slot and pass the context check."""
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    chat = {"model": "m", "messages": [{"role": "user", "content": [image, image]}]}
    assert estimate_input_tokens(chat, "chat/completions") == 2 * IMAGE_TOKENS + 3


def test_images_count_a_fixed_figure_and_reasoning_counts_as_text():
    chat = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64," + "A" * 4000},
                    },
                    {"type": "text", "text": "abcd"},
                ],
            },
            {"role": "assistant", "content": "", "reasoning_content": "x" * 8},
        ]
    }
    assert estimate_chat_tokens(chat) == IMAGE_TOKENS + 3 + 2 * 3  # ceil(12 / 4) + 2 messages


def counted(**fields: Any) -> int:
    return count_input_tokens(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_system_tools_tool_calls_and_results_all_count():
    base = counted()
    assert counted(system="s" * 400) == base + 100 + 3  # (a system message)
    assert counted(tools=claude_code.TOOLS[:1]) > base + 50
    history = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"k": "v" * 40}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r" * 80}],
        },
    ]
    assert counted(messages=history) > base + 10 + 20


def test_claude_codes_turn_counts_its_image_and_needs_no_max_tokens():
    request = claude_code.turn_with_history()
    del request["max_tokens"]
    assert count_input_tokens(request) > IMAGE_TOKENS


def test_a_request_that_cannot_be_translated_cannot_be_counted():
    with pytest.raises(RequestError, match="server tool"):
        counted(tools=[{"type": "web_search_20250305", "name": "web_search"}])

"""Request bodies: validation, token estimate, generation policy, context window (SPEC §6)."""

from __future__ import annotations

from typing import Any

import pytest

from iop_edge.api.bodies import (
    apply_generation_policy,
    estimate_input_tokens,
    prepare,
)
from iop_edge.api.catalog import ModelEntry
from iop_edge.api.chat import parse_body
from iop_edge.errors import RequestError


def model(
    *,
    context_window_tokens: int = 1000,
    default_max_tokens: int | None = None,
    min_max_tokens: int | None = None,
    default_thinking_token_budget: int | None = None,
) -> ModelEntry:
    """Model group "m" with the given generation policy (none by default)."""
    return ModelEntry(
        id="m",
        display_name=None,
        context_window_tokens=context_window_tokens,
        default_max_tokens=default_max_tokens,
        min_max_tokens=min_max_tokens,
        default_thinking_token_budget=default_thinking_token_budget,
        targets={},
        serves_completions=True,
    )


def chat(*contents: str, **extra: Any) -> dict[str, Any]:
    """A chat body for model "m": one user message per content, plus ``extra`` fields."""
    return {"model": "m", "messages": [{"role": "user", "content": c} for c in contents], **extra}


def test_token_estimate_is_a_quarter_of_the_utf8_bytes_plus_3_per_message_and_1600_per_image():
    assert estimate_input_tokens(chat("abcd" * 10), "chat/completions") == 10 + 3
    assert estimate_input_tokens(chat("a"), "chat/completions") == 1 + 3
    # Korean: 3 bytes per syllable → 0.75 token per character
    assert estimate_input_tokens(chat("가나다라"), "chat/completions") == 3 + 3
    parts = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "abcdefgh"},
                    {"type": "image_url", "image_url": {"url": "x"}},
                ],
            }
        ],
    }
    assert estimate_input_tokens(parts, "chat/completions") == 2 + 3 + 1600
    assert estimate_input_tokens({"prompt": ["abcd", "efgh"]}, "completions") == 2


def test_token_estimate_counts_each_token_id_of_a_prompt_as_one_token():
    """Issue 10: a token-id prompt used to count as 0 (a long context in a general slot)."""
    assert estimate_input_tokens({"prompt": [1, 2, 3]}, "completions") == 3
    assert estimate_input_tokens({"prompt": [[1, 2], [3]]}, "completions") == 3
    assert estimate_input_tokens({"prompt": list(range(150_000))}, "completions") == 150_000
    assert estimate_input_tokens({"prompt": ["abcd", [1, 2]]}, "completions") == 1 + 2
    assert estimate_input_tokens({"prompt": "abcd" * 3}, "completions") == 3


def test_a_token_id_prompt_over_the_threshold_is_long_context():
    body = {"model": "m", "prompt": list(range(2000))}
    prepared = prepare(body, "completions", model(context_window_tokens=10_000), threshold=1000)
    assert (prepared.estimated_input_tokens, prepared.long_context) == (2000, True)
    with pytest.raises(RequestError) as caught:
        prepare({"model": "m", "prompt": [list(range(600))] * 2}, "completions", model(), 100)
    assert caught.value.code == "context_length_exceeded"


def test_token_estimate_counts_legacy_function_call_arguments():
    """Issue 10: ``function_call.arguments`` of a legacy assistant message used to be ignored."""
    arguments = '{"city": "' + "x" * 390 + '"}'
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "function_call": {"name": "get_weather", "arguments": arguments},
            },
            {"role": "function", "name": "get_weather", "content": "sunny"},
        ],
    }
    text = len("weather?") + len(arguments) + len("get_weather") + len("sunny")
    assert estimate_input_tokens(body, "chat/completions") == -(-text // 4) + 3 * 3


def test_token_estimate_is_monotone_in_text_length():
    estimates = [estimate_input_tokens(chat("x" * n), "chat/completions") for n in range(200)]
    assert estimates == sorted(estimates)


def test_default_max_tokens_applies_when_the_request_sets_none():
    body = chat("hi")
    assert apply_generation_policy(body, model(default_max_tokens=256)) == 256
    assert body["max_tokens"] == 256
    body = chat("hi", max_completion_tokens=50)
    assert apply_generation_policy(body, model(default_max_tokens=256)) == 50
    assert "max_tokens" not in body


def test_min_max_tokens_is_a_floor_in_the_field_the_request_used():
    body = chat("hi", max_completion_tokens=4)
    assert apply_generation_policy(body, model(min_max_tokens=16)) == 16
    assert body["max_completion_tokens"] == 16
    body = chat("hi", max_tokens=64)
    assert apply_generation_policy(body, model(min_max_tokens=16)) == 64


def test_default_thinking_token_budget_applies_when_the_request_sets_none():
    body = chat("hi")
    apply_generation_policy(body, model(default_thinking_token_budget=2048))
    assert body["thinking_token_budget"] == 2048
    body = chat("hi", thinking_token_budget=10)
    apply_generation_policy(body, model(default_thinking_token_budget=2048))
    assert body["thinking_token_budget"] == 10


def test_input_plus_max_tokens_over_the_context_window_is_context_length_exceeded():
    prepare(chat("x" * 3988), "chat/completions", model(), 100_000)  # 997 + 3 = 1000: fits
    with pytest.raises(RequestError) as info:
        prepare(chat("x" * 3988, max_tokens=1), "chat/completions", model(), 100_000)
    assert (info.value.status, info.value.code) == (400, "context_length_exceeded")
    assert "maximum context length is 1000 tokens" in str(info.value)


def test_long_context_when_the_estimate_exceeds_the_threshold():
    assert not prepare(chat("x" * 40), "chat/completions", model(), 13).long_context
    assert prepare(chat("x" * 44), "chat/completions", model(), 13).long_context


def test_embeddings_input_is_checked_and_estimated_like_a_prompt():
    """Issue 15: /v1/embeddings takes a string, strings, token ids or token-id lists; the
    estimate counts text by bytes and a token id as one token; no generation policy."""
    body = parse_body(b'{"model":"m","input":["abcd","efgh"],"stream":false}', "embeddings")
    assert estimate_input_tokens(body, "embeddings") == 2
    assert estimate_input_tokens({"input": [[1, 2, 3], [4]]}, "embeddings") == 4
    prepared = prepare(body, "embeddings", None, threshold=1)
    assert (prepared.stream, prepared.max_tokens, prepared.long_context) == (False, None, True)
    assert "max_tokens" not in prepared.body
    for bad in (b'{"model":"m"}', b'{"model":"m","input":[]}', b'{"model":"m","input":[1,"a"]}'):
        with pytest.raises(RequestError) as caught:
            parse_body(bad, "embeddings")
        assert caught.value.param == "input"

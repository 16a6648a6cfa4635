"""A built-in tool (web search, code interpreter...) runs on the upstream's side: a provider that
speaks Responses itself gets it untouched; a model without one answers the translation's 400,
before admission."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers.api import TOKEN, edge_doc, running_edge

WEB_SEARCH: Any = [{"type": "web_search"}]


def native(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its openai_compat adapter serving Responses natively."""
    doc["nodes"][0]["adapters"][0]["native_apis"] = ["responses"]
    return doc


async def test_a_builtin_tool_goes_untouched_to_a_provider_that_speaks_responses(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with (
        running_edge(native(edge_doc(fake_oa, fake_ol))) as edge,
        openai.AsyncOpenAI(base_url=edge.openai_url, api_key=TOKEN, max_retries=0) as client,
    ):
        answer = await client.responses.create(model="chat-oa", input="hi", tools=WEB_SEARCH)
    [sent] = fake_oa.requests
    assert sent.path == "/v1/responses"
    assert sent.json["tools"] == WEB_SEARCH
    assert answer.model == "chat-oa"


async def test_without_one_it_is_a_400_naming_the_tool_and_nothing_goes_upstream(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama
) -> None:
    async with (
        running_edge(edge_doc(fake_oa, fake_ol)) as edge,
        openai.AsyncOpenAI(base_url=edge.openai_url, api_key=TOKEN, max_retries=0) as client,
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(model="chat-oa", input="hi", tools=WEB_SEARCH)
    assert refused.value.param == "tools[0].type"
    assert "web_search" in refused.value.message
    assert not fake_oa.requests

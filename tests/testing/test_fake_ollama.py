"""The fake Ollama speaks Ollama's HTTP API: exact NDJSON shape, options, errors and faults."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from iop_edge.testing.fake_behavior import BEHAVIOR_HEADER, FakeBehavior
from iop_edge.testing.fake_ollama import FakeOllama

CHUNK_KEYS = {"model", "created_at", "message", "done"}
FINAL_KEYS = CHUNK_KEYS | {
    "done_reason",
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
}
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "why is the sky blue"},
]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOllama]:
    async with FakeOllama() as server:
        yield server


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as http:
        yield http


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": MESSAGES, **extra}


async def read_lines(response: aiohttp.ClientResponse, into: list[bytes]) -> None:
    """Append every line of a response body to ``into`` as it arrives."""
    async for line in response.content:
        into.append(line)


async def post_chat(
    session: aiohttp.ClientSession, fake: FakeOllama, body: dict[str, Any], behavior: str = ""
) -> tuple[aiohttp.ClientResponse, list[bytes]]:
    headers = {BEHAVIOR_HEADER: behavior} if behavior else {}
    async with session.post(f"{fake.base_url}/api/chat", json=body, headers=headers) as response:
        lines = [line async for line in response.content]
    return response, lines


async def test_chat_streams_ndjson_by_default(
    fake: FakeOllama, session: aiohttp.ClientSession
) -> None:
    """Without `stream`, /api/chat streams NDJSON chunks, then a `done: true` line with counts."""
    response, lines = await post_chat(session, fake, chat_body())

    assert response.status == 200
    assert response.headers["Content-Type"] == "application/x-ndjson"
    assert all(line.endswith(b"\n") for line in lines)
    objects = [json.loads(line) for line in lines]
    *chunks, final = objects
    for chunk in chunks:
        assert set(chunk) == CHUNK_KEYS
        assert chunk["model"] == "fake-model"
        assert chunk["done"] is False
        assert chunk["message"]["role"] == "assistant"
        assert chunk["created_at"].endswith("Z")
    assert "".join(chunk["message"]["content"] for chunk in chunks) == "why is the sky blue"
    assert len(chunks) == 5
    assert set(final) == FINAL_KEYS
    assert final["done"] is True
    assert final["done_reason"] == "stop"
    assert final["message"] == {"role": "assistant", "content": ""}
    assert (final["prompt_eval_count"], final["eval_count"]) == (7, 5)
    assert all(isinstance(final[key], int) for key in FINAL_KEYS if key.endswith("duration"))


async def test_chat_without_streaming_is_one_object(
    fake: FakeOllama, session: aiohttp.ClientSession
) -> None:
    """`stream: false` answers one JSON object with the whole message and the counts."""
    async with session.post(f"{fake.base_url}/api/chat", json=chat_body(stream=False)) as response:
        assert response.headers["Content-Type"].startswith("application/json")
        reply = await response.json()
    assert set(reply) == FINAL_KEYS
    assert reply["message"] == {"role": "assistant", "content": "why is the sky blue"}
    assert (reply["done"], reply["done_reason"]) == (True, "stop")
    assert (reply["prompt_eval_count"], reply["eval_count"]) == (7, 5)


async def test_options_are_recorded_and_num_predict_and_stop_apply(
    fake: FakeOllama, session: aiohttp.ClientSession
) -> None:
    """`options` arrive as sent; `num_predict` caps the chunks (`length`); `stop` cuts the text."""
    options = {"num_predict": 2, "temperature": 0.2, "top_p": 0.9, "stop": ["\n"], "num_ctx": 8192}
    _, lines = await post_chat(session, fake, chat_body(options=options))
    final = json.loads(lines[-1])
    assert (final["eval_count"], final["done_reason"]) == (2, "length")
    assert fake.requests[-1].json["options"] == options

    fake.behavior = FakeBehavior(reply="line one\nline two")
    body = chat_body(stream=False, options={"stop": ["\n"]})
    async with session.post(f"{fake.base_url}/api/chat", json=body) as response:
        reply = await response.json()
    assert reply["message"]["content"] == "line one"
    assert reply["done_reason"] == "stop"


async def test_tags_version_and_root(fake: FakeOllama, session: aiohttp.ClientSession) -> None:
    """`/api/tags` lists models in Ollama's shape; `/api/version` and `/` answer like Ollama."""
    async with session.get(f"{fake.base_url}/api/tags") as response:
        tags = await response.json()
    [model] = tags["models"]
    assert (model["name"], model["model"]) == ("fake-model:latest", "fake-model:latest")
    assert {"modified_at", "size", "digest", "details"} <= set(model)
    async with session.get(f"{fake.base_url}/api/version") as response:
        assert "version" in await response.json()
    async with session.get(f"{fake.base_url}/") as response:
        assert await response.text() == "Ollama is running"


async def test_listing_behavior_fails_the_tags_list(
    fake: FakeOllama, session: aiohttp.ClientSession
) -> None:
    """`listing` is what `GET /api/tags` gets: a health check can fail on a live server."""
    fake.listing = FakeBehavior(status=500)
    async with session.get(f"{fake.base_url}/api/tags") as response:
        assert response.status == 500
        assert "error" in await response.json()
    fake.listing = FakeBehavior()
    async with session.get(f"{fake.base_url}/api/tags") as response:
        assert response.status == 200


async def test_strict_models_and_errors_use_ollama_error_shape(
    session: aiohttp.ClientSession,
) -> None:
    """Unknown model is 404 `{"error"}`; `m` matches `m:latest`; a missing model is 400."""
    async with FakeOllama(strict_models=True) as fake:
        response, lines = await post_chat(session, fake, chat_body(model="other", stream=False))
        assert response.status == 404
        assert json.loads(b"".join(lines)) == {
            "error": 'model "other" not found, try pulling it first'
        }
        response, _ = await post_chat(session, fake, chat_body(stream=False))
        assert response.status == 200
        response, lines = await post_chat(session, fake, {"messages": MESSAGES})
        assert response.status == 400
        assert json.loads(b"".join(lines)) == {"error": "model is required"}


async def test_status_behavior_answers_ollama_error(
    fake: FakeOllama, session: aiohttp.ClientSession
) -> None:
    """`status=500` (by header) answers 500 `{"error": message}`."""
    response, lines = await post_chat(
        session, fake, chat_body(), behavior="status=500&error_message=gpu%20fell%20off"
    )
    assert response.status == 500
    assert json.loads(b"".join(lines)) == {"error": "gpu fell off"}


async def test_error_fault_mid_stream_is_an_error_line(
    fake: FakeOllama, session: aiohttp.ClientSession
) -> None:
    """`fault=error&fault_after=2`: two chunks, then Ollama's `{"error": ...}` line, then EOF."""
    _, lines = await post_chat(session, fake, chat_body(), behavior="fault=error&fault_after=2")
    objects = [json.loads(line) for line in lines]
    assert [obj.get("done") for obj in objects[:2]] == [False, False]
    assert objects[2] == {"error": FakeBehavior().error_message}
    assert len(objects) == 3


async def test_directive_in_message_reaches_the_fake(
    fake: FakeOllama, session: aiohttp.ClientSession
) -> None:
    """A `[[fake:...]]` directive in the user message selects the behaviour and is not echoed."""
    body = {
        "model": "fake-model",
        "stream": False,
        "messages": [{"role": "user", "content": "hello [[fake:chunks=2]] world"}],
    }
    async with session.post(f"{fake.base_url}/api/chat", json=body) as response:
        reply = await response.json()
    assert reply["message"]["content"] == "hello  world"
    assert reply["eval_count"] == 2


async def test_reset_after_one_line_truncates_the_stream(
    fake: FakeOllama, session: aiohttp.ClientSession
) -> None:
    """`fault=reset&fault_after=1`: one NDJSON line arrives, then the body ends early."""
    received: list[bytes] = []
    async with session.post(
        f"{fake.base_url}/api/chat",
        json=chat_body(),
        headers={BEHAVIOR_HEADER: "fault=reset&fault_after=1"},
    ) as response:
        with pytest.raises(aiohttp.ClientPayloadError):
            await read_lines(response, received)
    assert [json.loads(line)["message"]["content"] for line in received] == ["why "]


async def test_malformed_line(fake: FakeOllama, session: aiohttp.ClientSession) -> None:
    """`fault=malformed&fault_after=1`: the second line is not JSON."""
    _, lines = await post_chat(session, fake, chat_body(), behavior="fault=malformed&fault_after=1")
    assert len(lines) == 2
    json.loads(lines[0])
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[1])


async def test_stall_counts_in_flight_until_client_leaves(
    fake: FakeOllama, session: aiohttp.ClientSession
) -> None:
    """A stalled stream stays in flight; the client leaving cancels it on the fake."""
    async with session.post(
        f"{fake.base_url}/api/chat",
        json=chat_body(),
        headers={BEHAVIOR_HEADER: "fault=stall&fault_after=1"},
    ) as response:
        assert json.loads(await response.content.readline())["done"] is False
        assert (fake.in_flight, fake.max_in_flight) == (1, 1)
        response.close()
    async with asyncio.timeout(5):
        await fake.wait_idle()
    assert (fake.cancelled, fake.completed) == (1, 0)

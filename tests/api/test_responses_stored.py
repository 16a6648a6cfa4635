"""The stored responses of ``/v1/responses`` through a running edge, with the official ``openai``
SDK (issue 28, "State"): ``GET /v1/responses/{id}`` answers what the client got, ``DELETE``
forgets it, a response is visible to its own principal only (any other gets the same 404, never
403), ``store: false`` keeps nothing, a response expires ``ttl_ms`` after it was stored (on the
edge's injected clock), the store holds at most ``max_items`` (least recently used out first;
a live reload lowering it shrinks the store at once), and the metrics listener reports it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import Edge, dump, edge_on, rename_save
from tests.helpers.api import TOKENS, principals_doc
from tests.helpers.responses import read_events

ASK = "hello through the edge"
NOT_STORED = "created before the edge last restarted (the store is kept in memory)"


def store_doc(fake: FakeOpenAI, **bounds: int) -> dict[str, Any]:
    """Model ``chat`` on ``fake``; principals ``app-a`` and ``app-b`` (:data:`TOKENS`); the
    store's ``bounds`` (``openai.responses_store``); a metrics listener."""
    doc = principals_doc(fake, capacity=2)
    if bounds:
        doc["openai"]["responses_store"] = bounds
    return doc


def sdk(edge: Edge, app: str = "app-a") -> openai.AsyncOpenAI:
    """An SDK client of ``edge`` holding ``app``'s token (no retries)."""
    return openai.AsyncOpenAI(base_url=edge.daemon.openai_url, api_key=TOKENS[app], max_retries=0)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as upstream:
        yield upstream


async def held(client: openai.AsyncOpenAI, *ids: str) -> list[str]:
    """Which of ``ids`` the edge still answers ``GET`` for (each a use of it, in order)."""
    found = []
    for response_id in ids:
        try:
            await client.responses.retrieve(response_id)
        except openai.NotFoundError:
            continue
        found.append(response_id)
    return found


async def stored_metrics(edge: Edge) -> tuple[float, float, float]:
    """``iop_edge_responses_stored`` and the evictions (lru, expired) the metrics listener
    reports."""
    metrics = await edge.metrics()
    evicted = "iop_edge_responses_evicted_total[('reason', '{}')]"
    return (
        metrics["iop_edge_responses_stored"],
        metrics[evicted.format("lru")],
        metrics[evicted.format("expired")],
    )


# -- GET and DELETE ---------------------------------------------------------------------------


async def test_get_answers_the_response_as_the_client_got_it(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """Byte for byte for a whole response; the Response of ``response.completed`` for a
    streamed one; the SDK reads both as what it first got."""
    async with edge_on(tmp_path, store_doc(fake)) as edge, sdk(edge) as c:
        created = await c.responses.with_raw_response.create(model="chat", input=ASK)
        whole_raw = created.content
        whole = created.parse()
        got = await c.responses.with_raw_response.retrieve(whole.id)
        got_raw = got.content
        async with c.responses.with_streaming_response.create(
            model="chat", input=ASK, stream=True
        ) as answer:
            stream_raw = b"".join([chunk async for chunk in answer.iter_bytes()])
        name, last = read_events(stream_raw)[-1]
        completed = last["response"]
        streamed_got = await c.responses.with_raw_response.retrieve(completed["id"])
        streamed_raw = streamed_got.content
        retrieved = await c.responses.retrieve(whole.id)
    assert got.status_code == 200
    assert got_raw == whole_raw
    assert retrieved.model_dump() == whole.model_dump()
    assert retrieved.output_text == ASK
    assert name == "response.completed"
    assert orjson.loads(streamed_raw) == completed
    assert completed["status"] == "completed"
    assert completed["id"] != whole.id


async def test_delete_forgets_a_response_and_get_then_says_it_is_not_stored(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    async with edge_on(tmp_path, store_doc(fake)) as edge, sdk(edge) as c:
        whole = await c.responses.create(model="chat", input=ASK)
        deleted = await c.responses.with_raw_response.delete(whole.id)
        deleted_body = orjson.loads(deleted.content)
        with pytest.raises(openai.NotFoundError) as got:
            await c.responses.retrieve(whole.id)
        with pytest.raises(openai.NotFoundError) as again:
            await c.responses.delete(whole.id)
        with pytest.raises(openai.NotFoundError) as continued:
            await c.responses.create(model="chat", input=ASK, previous_response_id=whole.id)
    assert deleted_body == {"id": whole.id, "object": "response.deleted", "deleted": True}
    for info in (got, again, continued):
        assert info.value.code == "response_not_found"
        assert f"No response with id '{whole.id}'" in info.value.message
        assert NOT_STORED in info.value.message
    assert got.value.param is None
    assert continued.value.param == "previous_response_id"
    assert fake.total_requests == 1  # (the refused continuation never went upstream)


async def test_another_principal_gets_404_never_403_and_changes_nothing(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """app-b cannot read, delete or continue app-a's response: each is the 404 an unknown id
    gets; app-a's response is still there afterwards, and app-a can continue it."""
    async with edge_on(tmp_path, store_doc(fake)) as edge, sdk(edge) as a, sdk(edge, "app-b") as b:
        mine = await a.responses.create(model="chat", input=ASK)
        with pytest.raises(openai.NotFoundError) as read:
            await b.responses.retrieve(mine.id)
        with pytest.raises(openai.NotFoundError) as deleted:
            await b.responses.delete(mine.id)
        with pytest.raises(openai.NotFoundError) as continued:
            await b.responses.create(model="chat", input="more", previous_response_id=mine.id)
        with pytest.raises(openai.NotFoundError) as unknown:
            await b.responses.retrieve("resp_unknown")
        still = await a.responses.retrieve(mine.id)
        onward = await a.responses.create(model="chat", input="more", previous_response_id=mine.id)
    for info in (read, deleted, continued):
        assert info.value.status_code == 404
        assert info.value.code == "response_not_found"
        assert info.value.message == unknown.value.message.replace("resp_unknown", mine.id)
    assert still.id == mine.id
    assert onward.previous_response_id == mine.id
    assert fake.requests[-1].json["messages"] == [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": ASK},
        {"role": "user", "content": "more"},
    ]


async def test_instructions_are_not_carried_over_by_previous_response_id(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """As OpenAI has it: each request says its own instructions; the stored conversation is
    the items only."""
    async with edge_on(tmp_path, store_doc(fake)) as edge, sdk(edge) as c:
        first = await c.responses.create(model="chat", input=ASK, instructions="Be brief.")
        await c.responses.create(model="chat", input="more", previous_response_id=first.id)
        without = fake.requests[-1].json["messages"]
        await c.responses.create(
            model="chat", input="more", previous_response_id=first.id, instructions="Be kind."
        )
        own = fake.requests[-1].json["messages"]
    history = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": ASK},
        {"role": "user", "content": "more"},
    ]
    assert without == history
    assert own == [{"role": "system", "content": "Be kind."}, *history]


async def test_store_false_keeps_nothing(tmp_path: Path, fake: FakeOpenAI) -> None:
    async with edge_on(tmp_path, store_doc(fake)) as edge, sdk(edge) as c:
        whole = await c.responses.create(model="chat", input=ASK, store=False)
        async with c.responses.stream(model="chat", input=ASK, store=False) as stream:
            streamed = await stream.get_final_response()
        with pytest.raises(openai.NotFoundError) as continued:
            await c.responses.create(model="chat", input=ASK, previous_response_id=whole.id)
        kept = await held(c, whole.id, streamed.id)
        stored, _, _ = await stored_metrics(edge)
    assert whole.model_dump()["store"] is streamed.model_dump()["store"] is False
    assert kept == []
    assert continued.value.param == "previous_response_id"
    assert stored == 0


async def test_an_incomplete_response_is_stored_and_continues(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """A response cut by ``max_output_tokens`` is finished (``incomplete``), not failed: it is
    stored, streamed or not, and the next turn continues it with its text so far."""
    long = " ".join(f"w{i}" for i in range(20))
    async with edge_on(tmp_path, store_doc(fake)) as edge, sdk(edge) as c:
        whole = await c.responses.create(model="chat", input=long, max_output_tokens=3)
        async with c.responses.with_streaming_response.create(
            model="chat", input=long, max_output_tokens=3, stream=True
        ) as answer:
            events = read_events(b"".join([chunk async for chunk in answer.iter_bytes()]))
        streamed_id = events[-1][1]["response"]["id"]
        got = await c.responses.retrieve(streamed_id)
        await c.responses.create(model="chat", input="go on", previous_response_id=whole.id)
    assert whole.status == "incomplete"
    assert events[-1][0] == "response.incomplete"
    assert (got.status, got.output_text) == ("incomplete", "w0 w1 w2 ")
    assert fake.requests[-1].json["messages"] == [
        {"role": "user", "content": long},
        {"role": "assistant", "content": "w0 w1 w2 "},
        {"role": "user", "content": "go on"},
    ]


# -- the bounds -------------------------------------------------------------------------------


async def test_a_response_expires_ttl_ms_after_it_was_stored(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """ttl_ms 60000 on the edge's clock: a use does not extend it; at 60 s it is gone, for
    GET and for previous_response_id alike, and counted as expired."""
    clock = FakeClock(1000.0)
    doc = store_doc(fake, ttl_ms=60_000)
    async with edge_on(tmp_path, doc, clock=clock) as edge, sdk(edge) as c:
        first = await c.responses.create(model="chat", input=ASK)
        clock.advance(30.0)
        second = await c.responses.create(model="chat", input=ASK)
        clock.advance_to(1059.999)
        before = await held(c, first.id, second.id)
        clock.advance_to(1060.0)
        after = await held(c, first.id, second.id)
        with pytest.raises(openai.NotFoundError):
            await c.responses.create(model="chat", input=ASK, previous_response_id=first.id)
        continued = await c.responses.create(
            model="chat", input="more", previous_response_id=second.id
        )
        metrics = await stored_metrics(edge)
    assert before == [first.id, second.id]
    assert after == [second.id]
    assert continued.status == "completed"
    assert metrics == (2, 0, 1)  # second and continued held; first expired


async def test_the_store_holds_max_items_least_recently_used_out_first(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """max_items 2: the third response evicts the least recently used (a GET counts as a
    use, so the second goes, not the first)."""
    async with edge_on(tmp_path, store_doc(fake, max_items=2)) as edge, sdk(edge) as c:
        first = await c.responses.create(model="chat", input=ASK)
        second = await c.responses.create(model="chat", input=ASK)
        await c.responses.retrieve(first.id)
        third = await c.responses.create(model="chat", input=ASK)
        kept = await held(c, first.id, second.id, third.id)
        metrics = await stored_metrics(edge)
    assert kept == [first.id, third.id]
    assert metrics == (2, 1, 0)


async def test_a_live_reload_lowering_max_items_shrinks_the_store_at_once(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    doc = store_doc(fake, max_items=3)
    async with edge_on(tmp_path, doc) as edge, sdk(edge) as c:
        ids = [(await c.responses.create(model="chat", input=ASK)).id for _ in range(3)]
        assert await stored_metrics(edge) == (3, 0, 0)
        doc["openai"]["responses_store"] = {"max_items": 1}
        rename_save(edge.path, dump(doc))
        record = await edge.next_record()
        metrics = await stored_metrics(edge)
        kept = await held(c, *ids)
        more = [(await c.responses.create(model="chat", input=ASK)).id for _ in range(2)]
        kept_after = await held(c, *more)
    assert record.result.result == "applied"
    assert [(e.path, e.change_class, e.applied) for e in record.result.report] == [
        ("openai.responses_store.max_items", "live", True)
    ]
    assert metrics == (1, 2, 0)  # shrunk before any new request came
    assert kept == [ids[-1]]
    assert kept_after == [more[-1]]

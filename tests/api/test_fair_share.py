"""Fair sharing of the pool among principals (SPEC §5.2), end to end: the ``openai`` SDK with
two principals' tokens against a real daemon, a fake upstream that holds each request until the
test lets it go, one slot. A freed slot goes to the principal whose turn it is, not to whoever
queued first: app B does not wait behind app A's whole backlog.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import edge_on, wait_for
from tests.helpers.api import TOKENS, principals_doc


async def test_a_freed_slot_goes_to_the_principal_whose_turn_it_is(tmp_path: Path) -> None:
    """A holds the slot and queues 4 more; B asks once. Oldest first would serve B sixth; by
    fair share it is served third (its start tag ties A's oldest waiting request, which is
    older), and A's backlog goes on after it."""
    fake = FakeOpenAI(behavior=FakeBehavior(hold=True))
    async with fake, edge_on(tmp_path, principals_doc(fake)) as edge:
        clients = {
            ref: openai.AsyncOpenAI(base_url=edge.daemon.openai_url, api_key=raw, max_retries=0)
            for ref, raw in TOKENS.items()
        }

        async def ask(ref: str, text: str) -> None:
            await clients[ref].chat.completions.create(
                model="chat", messages=[{"role": "user", "content": text}]
            )

        scheduler = edge.daemon.scheduler

        async def queued(depth: int) -> None:
            await wait_for(lambda: scheduler.statistics().queue_depth == depth)

        tasks = [asyncio.create_task(ask("app-a", "a1"))]
        await fake.wait_requests(1)
        for n in range(2, 6):
            tasks.append(asyncio.create_task(ask("app-a", f"a{n}")))
            await queued(n - 1)
        tasks.append(asyncio.create_task(ask("app-b", "b1")))
        await queued(5)
        for served in range(2, 7):
            fake.release()
            await fake.wait_requests(served)
        fake.release()
        await asyncio.gather(*tasks)
        for client in clients.values():
            await client.close()
        order = [r.json["messages"][-1]["content"] for r in fake.requests]
        stats = scheduler.statistics()
    assert order == ["a1", "a2", "b1", "a3", "a4", "a5"]
    assert (stats.in_flight, stats.queue_depth, stats.released) == (0, 0, 6)


async def test_an_allow_list_hides_other_models_exactly_as_unknown_ones(tmp_path: Path) -> None:
    """app-a may use only ``chat``: ``echo`` answers 404 ``model_not_found`` with the same
    message as a model that does not exist, and ``/v1/models`` lists only ``chat``."""
    async with FakeOpenAI() as fake:
        doc = principals_doc(fake)
        doc["provider_pool"]["principals"] = [{"ref": "app-a", "models": ["chat"]}]
        async with edge_on(tmp_path, doc) as edge:
            url = edge.daemon.openai_url
            a = openai.AsyncOpenAI(base_url=url, api_key=TOKENS["app-a"], max_retries=0)
            b = openai.AsyncOpenAI(base_url=url, api_key=TOKENS["app-b"], max_retries=0)
            listed = {m.id async for m in a.models.list()}
            everything = {m.id async for m in b.models.list()}
            await a.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "x"}]
            )
            errors = []
            for model in ("echo", "no-such-model"):
                try:
                    await a.chat.completions.create(
                        model=model, messages=[{"role": "user", "content": "x"}]
                    )
                except openai.NotFoundError as exc:
                    errors.append((exc.code, str(exc).replace(model, "M")))
            try:
                await a.models.retrieve("echo")
            except openai.NotFoundError as exc:
                retrieved = exc.code
            await b.chat.completions.create(
                model="echo", messages=[{"role": "user", "content": "x"}]
            )
            await a.close()
            await b.close()
    assert (listed, everything) == ({"chat"}, {"chat", "echo"})
    assert errors[0] == errors[1]
    assert errors[0][0] == "model_not_found"
    assert retrieved == "model_not_found"


async def test_a_principal_over_its_rate_gets_429_with_the_seconds_to_wait(tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        doc = principals_doc(fake)
        doc["provider_pool"]["principals"] = [{"ref": "app-b", "max_requests_per_minute": 1}]
        async with edge_on(tmp_path, doc) as edge:
            b = openai.AsyncOpenAI(
                base_url=edge.daemon.openai_url, api_key=TOKENS["app-b"], max_retries=0
            )
            messages: Any = [{"role": "user", "content": "x"}]
            await b.chat.completions.create(model="chat", messages=messages)
            try:
                await b.chat.completions.create(model="chat", messages=messages)
            except openai.RateLimitError as exc:
                refused = exc
            await b.close()
            metrics = await edge.metrics()
    assert refused.code == "rate_limit_exceeded"
    assert refused.response.headers["Retry-After"] == "60"
    assert metrics["iop_edge_admission_rejected_total[('reason', 'rate_limit_exceeded')]"] == 1

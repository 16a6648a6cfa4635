"""Per-principal weights and caps end to end (SPEC §5.2): the ``openai`` SDK with two apps'
tokens against a real daemon, a fake upstream that holds each request until the test lets it
go. Weights 3:1, ``max_in_flight`` (and raising it live), ``max_queued`` (and raising it
live), ``fair_share: none`` reproducing the arrival order, and what ``/admin/status``, the
metrics and ``iop-edge status`` show per principal.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import yaml

from iop_edge.cli import format_status
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.reload_storm import dump
from tests.helpers import Edge, edge_on, wait_for
from tests.helpers.api import TOKENS, principals_doc


class Apps:
    """One SDK client per app; each request's prompt names it, so the fake's log is the
    order in which the edge served them."""

    def __init__(self, edge: Edge) -> None:
        self.edge = edge
        self.clients = {
            ref: openai.AsyncOpenAI(base_url=edge.daemon.openai_url, api_key=raw, max_retries=0)
            for ref, raw in TOKENS.items()
        }
        self.tasks: list[asyncio.Task[Any]] = []

    def ask(self, ref: str, text: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(
            self.clients[ref].chat.completions.create(
                model="chat", messages=[{"role": "user", "content": text}]
            )
        )
        self.tasks.append(task)
        return task

    async def queued(self, depth: int) -> None:
        scheduler = self.edge.daemon.scheduler
        await wait_for(lambda: scheduler.statistics().queue_depth == depth)

    def principal(self, ref: str) -> Any:
        stats = self.edge.daemon.scheduler.statistics()
        return next(p for p in stats.principals if p.principal == ref)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()  # (those still held by the fake)
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for client in self.clients.values():
            await client.close()


@contextlib.asynccontextmanager
async def held_edge(
    tmp_path: Path, capacity: int = 1, **pool: Any
) -> AsyncIterator[tuple[FakeOpenAI, Edge, Apps]]:
    """An edge whose one provider (``capacity`` slots) holds every request until the test
    releases it; ``pool`` goes into provider_pool."""
    async with FakeOpenAI(behavior=FakeBehavior(hold=True)) as fake:
        doc = principals_doc(fake, capacity)
        doc["provider_pool"].update(pool)
        async with edge_on(tmp_path, doc) as edge:
            apps = Apps(edge)
            try:
                yield fake, edge, apps
            finally:
                await apps.close()


def served(fake: FakeOpenAI) -> list[str]:
    return [r.json["messages"][-1]["content"] for r in fake.requests]


async def serve_all(fake: FakeOpenAI, total: int) -> None:
    """Let the held requests go one at a time, each after the next one reached the fake (one
    slot: one held request at a time)."""
    for n in range(1, total + 1):
        await fake.wait_requests(n)
        fake.release()


async def rewrite(edge: Edge, change: dict[str, Any]) -> None:
    """Save the config with ``change`` merged into provider_pool; wait for it to apply."""
    current = yaml.safe_load(edge.path.read_text())
    current["provider_pool"].update(change)
    edge.path.write_text(dump(current))
    record = await edge.next_record()
    assert record.result.result == "applied", record.result


async def test_weights_3_to_1_share_the_freed_slots_3_to_1(tmp_path: Path) -> None:
    weights = [{"ref": "app-a", "weight": 3}, {"ref": "app-b", "weight": 1}]
    async with held_edge(tmp_path, principals=weights, max_queue=16) as (fake, _, apps):
        apps.ask("app-b", "b0")
        await fake.wait_requests(1)
        for n in range(1, 7):
            apps.ask("app-a", f"a{n}")
            await apps.queued(2 * n - 1)
            apps.ask("app-b", f"b{n}")
            await apps.queued(2 * n)
        await serve_all(fake, 9)
        first_eight = served(fake)[1:9]
    assert sum(name.startswith("a") for name in first_eight) == 6
    assert sum(name.startswith("b") for name in first_eight) == 2


async def test_max_in_flight_skips_not_refuses_and_a_raised_cap_dispatches_at_once(
    tmp_path: Path,
) -> None:
    """Three slots; app-a may hold one. Its second request waits although slots are free,
    app-b takes one; raising app-a's cap live sends its waiting request to the third at
    once."""
    capped = [{"ref": "app-a", "max_in_flight": 1}]
    async with held_edge(tmp_path, 3, principals=capped) as (fake, edge, apps):
        apps.ask("app-a", "a1")
        await fake.wait_requests(1)
        apps.ask("app-a", "a2")
        await apps.queued(1)
        apps.ask("app-b", "b1")
        await fake.wait_requests(2)
        a = apps.principal("app-a")
        assert (a.in_flight, a.queued, a.max_in_flight) == (1, 1, 1)
        metrics = await edge.metrics()
        assert metrics["iop_edge_principal_in_flight[('principal', 'app-a')]"] == 1
        assert metrics["iop_edge_principal_queued[('principal', 'app-a')]"] == 1
        assert metrics["iop_edge_principal_in_flight[('principal', 'app-b')]"] == 1
        await rewrite(edge, {"principals": [{"ref": "app-a", "max_in_flight": 2}]})
        await fake.wait_requests(3)
        order = served(fake)
    assert order == ["a1", "b1", "a2"]


async def test_max_queued_refuses_429_principal_queue_full_and_status_counts_it(
    tmp_path: Path,
) -> None:
    limited = [{"ref": "app-a", "max_queued": 1, "max_in_flight": 3}]
    async with held_edge(tmp_path, principals=limited) as (fake, edge, apps):
        apps.ask("app-a", "a1")
        await fake.wait_requests(1)
        apps.ask("app-a", "a2")
        await apps.queued(1)
        try:
            await apps.ask("app-a", "a3")
        except openai.RateLimitError as exc:
            refused = exc
        apps.ask("app-b", "b1")  # another principal still queues
        await apps.queued(2)
        metrics = await edge.metrics()
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{edge.daemon.console_url}/admin/status") as response,
        ):
            status = await response.json()
        await rewrite(edge, {"principals": [{"ref": "app-a", "max_queued": 2}]})
        apps.ask("app-a", "a4")  # room again under the raised max_queued
        await apps.queued(3)
    assert refused.code == "principal_queue_full"
    assert int(refused.response.headers["Retry-After"]) >= 1
    assert metrics["iop_edge_admission_rejected_total[('reason', 'principal_queue_full')]"] == 1
    row = next(p for p in status["principals"] if p["principal"] == "app-a")
    assert row == {
        "principal": "app-a",
        "weight": 1.0,
        "max_in_flight": 3,
        "max_queued": 1,
        "max_requests_per_minute": None,
        "in_flight": 1,
        "queued": 1,
        "rejected": {"principal_queue_full": 1},
        "in_flight_elsewhere": 0,
    }
    shown = format_status(status)
    assert "principal app-a: rejected principal_queue_full 1" in shown
    assert any(line.split()[:4] == ["app-a", "1", "1", "1"] for line in shown.splitlines())


async def test_fair_share_none_serves_in_arrival_order(tmp_path: Path) -> None:
    async with held_edge(tmp_path, fair_share="none") as (fake, _, apps):
        apps.ask("app-a", "a1")
        await fake.wait_requests(1)
        for n in range(2, 6):
            apps.ask("app-a", f"a{n}")
            await apps.queued(n - 1)
        apps.ask("app-b", "b1")
        await apps.queued(5)
        await serve_all(fake, 6)
        order = served(fake)
    assert order == ["a1", "a2", "a3", "a4", "a5", "b1"]


async def test_a_model_route_is_admitted_with_its_capacity_and_its_principals_caps(
    tmp_path: Path,
) -> None:
    """A route of capacity 1 queues its second request; the route's request counts toward
    app-a's max_in_flight (a ``chat`` request of app-a then waits); raising the route's
    capacity live dispatches its waiting request at once."""
    async with FakeOpenAI(behavior=FakeBehavior(hold=True)) as fake:
        doc = principals_doc(fake, 3)
        doc["openai"]["model_routes"] = [
            {"model": "legacy", "adapter": "oa", "target": "fake-model", "capacity": 1}
        ]
        doc["provider_pool"]["principals"] = [{"ref": "app-a", "max_in_flight": 1}]
        async with edge_on(tmp_path, doc) as edge:
            apps = Apps(edge)
            try:

                def ask(ref: str, model: str, text: str) -> None:
                    apps.tasks.append(
                        asyncio.create_task(
                            apps.clients[ref].chat.completions.create(
                                model=model, messages=[{"role": "user", "content": text}]
                            )
                        )
                    )

                ask("app-a", "legacy", "a-route")
                await fake.wait_requests(1)
                ask("app-a", "chat", "a-chat")  # app-a is at its cap: waits, chat slots free
                await apps.queued(1)
                ask("app-b", "legacy", "b-route")  # the route is full: waits
                await apps.queued(2)
                stats = edge.daemon.scheduler.statistics()
                route = next(p for p in stats.providers if p.provider_id == "route:legacy")
                assert (route.in_flight, route.capacity) == (1, 1)
                current = yaml.safe_load(edge.path.read_text())
                current["openai"]["model_routes"][0]["capacity"] = 2
                edge.path.write_text(dump(current))
                record = await edge.next_record()
                assert record.result.result == "applied"
                assert [(e.path, e.change_class, e.applied) for e in record.result.report] == [
                    ("openai.model_routes[legacy].capacity", "live", True)
                ]
                await fake.wait_requests(2)
                order = served(fake)
                assert apps.principal("app-a").queued == 1
            finally:
                await apps.close()
    assert order == ["a-route", "b-route"]

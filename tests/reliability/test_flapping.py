"""A provider that goes down and comes back, again and again, under load (issue 12, SPEC §5.1).

Model ``chat`` has two providers: ``up`` (always there) and ``flappy``, a
:class:`~iop_edge.testing.flapping.FlappingUpstream` the test stops and starts again on the same
port. Two clients keep asking through the ``openai`` SDK. The daemon runs on a
:class:`~iop_edge.testing.clock.FakeClock`, so an ejection lasts until the test moves time:
each step waits on what the edge shows (``statistics()``, log lines), never on a duration.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from iop_edge.pool import ProviderStatistics
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import doc_for, edge_on, wait_for
from tests.helpers.reliability import FlappingUpstream

EJECT_MS = 1000
PROBE_INTERVAL_MS = 250
FAILURE_THRESHOLD = 2
CYCLES = 3


def flapping_doc(steady: FakeOpenAI, flapping_url: str) -> dict[str, Any]:
    """``chat`` on ``up`` (``steady``) and ``flappy`` (``flapping_url``); failover on, health
    tuned so that a probe is due a quarter of a second after an ejection."""
    doc = doc_for(
        steady,
        capacity=4,
        provider_pool={
            "max_queue": 8,
            "queue_timeout_ms": 30000,
            "failover": {"max_attempts": 2},
            "health": {
                "failure_threshold": FAILURE_THRESHOLD,
                "eject_ms": EJECT_MS,
                "probe_interval_ms": PROBE_INTERVAL_MS,
            },
        },
    )
    node = doc["nodes"][0]
    node["adapters"].append({"name": "ob", "type": "openai_compat", "base_url": flapping_url})
    node["providers"].append(
        {
            "id": "flappy",
            "type": "openai_compat",
            "category": "api",
            "adapter": "ob",
            "models": ["fake-model"],
            "capacity": 4,
        }
    )
    next(m for m in doc["models"] if m["id"] == "chat")["providers"].append("flappy")
    return doc


class ClientLoad:
    """``workers`` SDK clients asking ``chat`` back to back (every other request streamed),
    each answer checked against its prompt; every exception or wrong answer is a failure."""

    def __init__(self, client: openai.AsyncOpenAI, workers: int) -> None:
        self.client = client
        self.ok = 0
        self.failures: list[str] = []
        self.sent = 0
        self.workers = [asyncio.create_task(self.worker()) for _ in range(workers)]

    async def worker(self) -> None:
        while True:
            n = self.sent
            self.sent += 1
            prompt = f"flap request {n}"
            messages: Any = [{"role": "user", "content": prompt}]
            try:
                if n % 2:
                    stream = await self.client.chat.completions.create(
                        model="chat", messages=messages, stream=True
                    )
                    text = "".join([c.choices[0].delta.content or "" async for c in stream])
                else:
                    reply = await self.client.chat.completions.create(
                        model="chat", messages=messages
                    )
                    text = reply.choices[0].message.content or ""
            except openai.APIError as exc:
                self.failures.append(f"{n}: {type(exc).__name__}: {exc}")
                continue
            if text == prompt:
                self.ok += 1
            else:
                self.failures.append(f"{n}: answered {text!r}")

    async def more(self, count: int) -> None:
        """Return once ``count`` more requests have been answered."""
        target = self.ok + count
        await wait_for(lambda: self.ok >= target or bool(self.failures))

    async def stop(self) -> None:
        for task in self.workers:
            task.cancel()
        await asyncio.gather(*self.workers, return_exceptions=True)


@pytest.fixture
async def flappy() -> AsyncIterator[FlappingUpstream]:
    async with FlappingUpstream() as upstream:
        yield upstream


def logged(log_stream: io.StringIO, event: str) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in log_stream.getvalue().splitlines()
        if f'"event":"{event}"' in line
    ]


async def test_a_flapping_provider_is_ejected_when_down_and_serves_when_up_with_no_failure(
    tmp_path: Path, fake_oa: FakeOpenAI, flappy: FlappingUpstream, log_stream: io.StringIO
) -> None:
    """SPEC §5.1, issue 12: a provider that flaps while another is healthy costs clients
    nothing (its failed attempts fail over before the first byte); each down phase ejects it
    (for ``eject_ms``: the doubling was reset by the requests it served since), and it then
    gets no request; each up phase brings it back by the first probe, ``probe_interval_ms``
    after the ejection, and it serves again."""
    clock = FakeClock()
    doc = flapping_doc(fake_oa, flappy.base_url)
    async with (
        edge_on(tmp_path, doc, clock=clock) as edge,
        openai.AsyncOpenAI(base_url=edge.daemon.openai_url, api_key="x", max_retries=0) as client,
    ):
        scheduler = edge.daemon.scheduler

        def flapping() -> ProviderStatistics:
            stats = scheduler.statistics()
            return next(p for p in stats.providers if p.provider_id == "flappy")

        async def flappy_served(fake: FakeOpenAI) -> None:
            """Two answers came from ``fake`` and the edge has recorded them (nothing left in
            flight on it): the successes reset its doubling before the next stop."""
            await fake.wait_until(lambda: fake.completed >= 2)
            await wait_for(lambda: flapping().in_flight == 0)

        load = ClientLoad(client, workers=2)
        try:
            assert flappy.fake is not None
            await flappy_served(flappy.fake)
            for cycle in range(1, CYCLES + 1):
                ejected_at = clock.now()
                await flappy.down()
                await wait_for(lambda: flapping().health == "unhealthy")
                stats = flapping()
                assert (stats.ejections, stats.ejected_until) == (cycle, ejected_at + 1.0)
                # Attempts already dispatched to it fail over; once none is left, no request
                # goes there while it is ejected: the failover count stands still.
                await wait_for(lambda: flapping().in_flight == 0)
                failovers = scheduler.statistics().failovers
                await load.more(8)
                assert (scheduler.statistics().failovers, flapping().in_flight) == (failovers, 0)
                assert (flapping().probes_ok, flapping().probes_failed) == (cycle - 1, 0)

                fake = await flappy.up()
                clock.advance(PROBE_INTERVAL_MS / 1000)  # the first probe is due
                await wait_for(lambda: flapping().health == "healthy")
                assert (flapping().probes_ok, flapping().probes_failed) == (cycle, 0)
                assert flapping().ejected_until is None
                await flappy_served(fake)
        finally:
            await load.stop()

    assert load.failures == []
    assert load.ok > 0
    ejected = logged(log_stream, "provider_ejected")
    recovered = logged(log_stream, "provider_recovered")
    assert [(e["provider"], e["consecutive_failures"], e["ejected_for_s"]) for e in ejected] == [
        ("flappy", FAILURE_THRESHOLD, EJECT_MS / 1000)
    ] * CYCLES
    assert [(e["provider"], e["via"]) for e in recovered] == [("flappy", "probe")] * CYCLES

"""A request whose lease the shared store no longer holds is stopped (the edge could not renew
it in time and the store let it go): before the client's first byte it is a 503 that says why,
after it the stream ends with the error event — never a request running that the store no
longer counts. A real daemon, the openai SDK, a real ``redis-server``; the daemon's clock is a
FakeClock, so the renewal that finds the lease gone happens when the test moves it."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
import redis.asyncio as redis
from openai.types.chat import ChatCompletionMessageParam

from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import doc_for, wait_for
from tests.helpers.api import edge_client

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


def shared(fake: FakeOpenAI, store: str) -> dict[str, object]:
    doc = doc_for(fake, capacity=1)
    doc["provider_pool"]["shared"] = {"store": store, "lease_ttl_ms": 3000}
    return doc


async def forget_every_lease(url: str) -> None:
    """What the store does with a lease nobody renewed within its ttl."""
    client = redis.Redis.from_url(url)
    try:
        await client.flushall()
    finally:
        await client.aclose()


async def renew_until(clock: FakeClock, done: asyncio.Future[Any]) -> None:
    """Move the clock a renewal period (ttl / 3) at a time until ``done``."""
    async with asyncio.timeout(10):
        while not done.done():
            clock.advance(1.0)
            await asyncio.sleep(0.01)


async def test_a_lost_lease_before_the_first_byte_is_a_503_that_says_why(redis_url: str) -> None:
    clock = FakeClock(100.0)
    async with (
        FakeOpenAI(behavior=FakeBehavior(hold=True)) as fake,
        edge_client(shared(fake, redis_url), clock=clock) as (edge, client),
    ):
        asking = asyncio.ensure_future(client.chat.completions.create(model="chat", messages=HELLO))
        await fake.wait_in_flight(1)
        await forget_every_lease(redis_url)
        await renew_until(clock, asking)
        with pytest.raises(openai.InternalServerError) as info:
            await asking
        assert info.value.status_code == 503
        assert "no longer counts this request's lease" in str(info.value)
        await wait_for(lambda: fake.in_flight == 0)  # the upstream call was stopped
        gate = edge.scheduler.gate
        assert gate is not None
        assert gate.statistics().lost == 1
        assert edge.scheduler.statistics().in_flight == 0


async def test_a_lost_lease_mid_stream_ends_the_stream_with_the_error_event(
    redis_url: str,
) -> None:
    clock = FakeClock(100.0)
    behavior = FakeBehavior(chunks=8, fault="stall", fault_after=3)
    async with (
        FakeOpenAI(behavior=behavior) as fake,
        edge_client(shared(fake, redis_url), clock=clock) as (edge, client),
    ):
        stream = await client.chat.completions.create(model="chat", messages=HELLO, stream=True)
        assert isinstance(stream, openai.AsyncStream)
        chunks = aiter(stream)
        first = await anext(chunks)
        assert first.choices
        await forget_every_lease(redis_url)

        async def rest() -> None:
            async for _ in chunks:
                pass

        reading = asyncio.ensure_future(rest())
        await renew_until(clock, reading)
        with pytest.raises(openai.APIError) as info:
            await reading
        assert "no longer counts this request's lease" in str(info.value)
        await wait_for(lambda: fake.in_flight == 0)
        assert edge.scheduler.statistics().in_flight == 0

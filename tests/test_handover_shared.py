"""``iop-edge restart`` of an edge whose pool is shared with other edges (issue: several edges,
one pool): the old process's leases stay in the store, renewed and released by it until its
last request ends, and the new process counts them as held elsewhere — never twice, never
lost. Real processes, a real ``redis-server``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as redis

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import BOUND, doc_for
from tests.helpers.service import JSON, served, status, successor_stopped, write_config

ALONE = "--no-parent"


def shared_doc(fake: FakeOpenAI, store: str) -> dict[str, Any]:
    doc = doc_for(fake, capacity=2)
    doc["provider_pool"].update(
        max_queue=256, queue_timeout_ms=60000, shared={"store": store, "lease_ttl_ms": 3000}
    )
    return doc


async def leases_in(url: str) -> tuple[int, int]:
    """The store's leases on the provider, and its members."""
    store = redis.Redis.from_url(url)
    try:
        return await store.zcard("iop-edge:lease:local/up"), await store.zcard("iop-edge:members")
    finally:
        await store.aclose()


async def ask(session: aiohttp.ClientSession, url: str, text: str, *, stream: bool) -> int:
    body = {"model": "chat", "messages": [{"role": "user", "content": text}], "stream": stream}
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            answer = await response.text()
            return response.status if not stream or "data: [DONE]" in answer else 0
    except aiohttp.ClientError:
        return 0


async def test_a_restart_keeps_the_shared_capacity_exact_and_every_lease_counted_once(
    tmp_path: Path, redis_url: str
) -> None:
    """Capacity 2 in the store, streams of 0.4 s in flight and more queued when ``POST
    /admin/restart`` hands over: the upstream never sees more than 2 at once, nothing fails,
    and once both processes are done the store holds no lease and one member."""
    behavior = FakeBehavior(latency=0.05, chunk_delay=0.02, chunks=20)
    async with FakeOpenAI(behavior=behavior) as fake:
        config = write_config(tmp_path, shared_doc(fake, redis_url))
        new_pid: list[int] = []
        with served(config, ALONE) as old, successor_stopped(new_pid):
            listening = old.wait_event("listening")
            url, console = listening["openai"], listening["console"]
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=BOUND)) as s:
                before = [
                    asyncio.create_task(ask(s, url, f"before {n}", stream=n % 2 == 0))
                    for n in range(12)
                ]
                await fake.wait_requests(2)
                held = await leases_in(redis_url)
                async with s.post(console + "/admin/restart", headers=JSON) as response:
                    result = await response.json()
                new_pid.append(result["pid"])
                after = [
                    asyncio.create_task(ask(s, url, f"after {n}", stream=n % 2 == 1))
                    for n in range(12)
                ]
                outcomes = await asyncio.gather(*before, *after)
                taken = await status(console)
            await asyncio.to_thread(old.process.wait, BOUND)
            leases, members = await leases_in(redis_url)
    assert result["result"] == "handed_over"
    assert taken["pid"] == result["pid"]
    assert outcomes == [200] * 24
    assert fake.max_in_flight <= 2
    assert held == (2, 1)  # the store counted the two in flight
    assert leases == 0  # every lease of both processes released
    assert members == 1  # the old process left; the new one is the member

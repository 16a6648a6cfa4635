"""Several edges, one pool, with real processes: three ``iop-edge serve`` sharing one real
``redis-server`` (each test its own, as some kill it), one model whose one provider
(capacity :data:`CAPACITY`) is a fake OpenAI-compatible upstream that counts the requests it
serves at once and keeps the peak (``max_in_flight``).

- thousands of mixed streaming and plain requests spread over the edges, one edge SIGKILLed
  mid-run: the upstream never serves more than the capacity; every request on the survivors
  succeeds, those on the dead edge fail on their connection; the dead edge's slots are used
  again within ``lease_ttl_ms`` + 1 s;
- the store killed mid-run and started again: the cap holds throughout (each edge holds at
  most ``floor(4 / 3)`` = 1 while it is down), every request succeeds, and the edges go back
  to the whole shared capacity on their own;
- a principal's ``max_in_flight`` and ``max_requests_per_minute`` are exact across the edges;
- ``on_store_down: reject``: 503 ``store_unavailable`` while the store is down, service again
  once it is back.

Lease TTL :data:`TTL_MS`: renewals every 0.5 s, a resync every 375 ms while requests wait.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Final

import aiohttp
import pytest

from iop_edge.shared.store import SharedStore
from iop_edge.testing.edge_process import EdgeProcess, log_events, wait_for_log
from iop_edge.testing.fake_openai import FakeBehavior, FakeOpenAI
from iop_edge.testing.redis_server import RedisServer
from tests.helpers import BOUND
from tests.helpers.remote_e2e import wait_status
from tests.helpers.shared_pool import CAPACITY, Load, Outcome, ask, serving_edges, shared_doc

TTL_MS: Final = 1500
"""``provider_pool.shared.lease_ttl_ms`` of every test here."""

LATENCY: Final = 0.01
"""The upstream's time to its answer's head: every request holds its slot that long at least,
so the edges contend for the capacity."""

PROVIDER: Final = "local/up"


@pytest.fixture
def store() -> Iterator[RedisServer]:
    """This test's own ``redis-server`` (it may kill it)."""
    with RedisServer(password=secrets.token_hex(8)) as server:
        yield server


@pytest.fixture
async def upstream() -> AsyncIterator[FakeOpenAI]:
    """The one upstream: a 10 ms head, the answer in three chunks."""
    async with FakeOpenAI(behavior=FakeBehavior(latency=LATENCY, chunks=3)) as fake:
        yield fake


async def store_held(store: RedisServer, *principals: str) -> tuple[int, dict[str, int]]:
    """The provider's leases the store holds now (expired ones dropped), and ``principals``'
    in-flight leases."""
    client = SharedStore(store.url, instance_id="test-reader")
    await client.connect()
    try:
        view = await client.view([PROVIDER], principals)
    finally:
        await client.aclose()
    return view.providers[PROVIDER].held, dict(view.principals)


def failed(outcomes: list[Outcome]) -> Counter[tuple[int | None, str | None, str | None]]:
    """The outcomes that are not a whole answer, counted by (status, code, error)."""
    return Counter((o.status, o.code, o.error) for o in outcomes if not o.ok)


async def in_split(edge: EdgeProcess) -> None:
    """Wait until ``edge`` holds no more than its static split of the provider (1)."""
    await wait_status(edge, lambda s: s["providers"][0]["in_flight"] <= CAPACITY // 3)


async def test_a_killed_edge_never_lets_the_upstream_past_the_capacity(
    tmp_path: Path, store: RedisServer, upstream: FakeOpenAI
) -> None:
    """Capacity 4 across three edges under thousands of mixed requests; one edge SIGKILLed
    while it holds two leases: the upstream never serves more than 4 at once, every request
    of the survivors succeeds, the dead edge's requests fail on their connection, and its two
    slots serve again once its leases expire (within ``lease_ttl_ms`` + 1 s)."""
    loop = asyncio.get_running_loop()
    doc = shared_doc(upstream, store.url, lease_ttl_ms=TTL_MS)
    async with serving_edges(tmp_path, doc, 3) as edges:
        doomed = edges[2]
        async with Load(edges, per_edge=6) as load:
            await load.more(1000)
            assert min(load.done(i) for i in range(3)) > 200  # (spread over the three)
            # The doomed edge's own load ends; then it holds exactly two requests upstream,
            # parked there, when it is killed.
            await load.stop_edge(2)
            before_kill = list(load.outcomes)
            async with aiohttp.ClientSession() as session:
                held = [
                    asyncio.create_task(
                        ask(session, doomed, 2, f"[[fake:hold=true]] held {n}", stream=n == 0)
                    )
                    for n in range(2)
                ]
                async with asyncio.timeout(BOUND):
                    await upstream.wait_until(
                        lambda: sum(r.behavior.hold for r in upstream.requests) == 2
                    )
                cancelled = upstream.cancelled
                doomed.process.kill()
                killed_at = loop.time()
                dead = await asyncio.gather(*held)
                refused = await ask(session, doomed, 2, "after the kill", stream=False)
            async with asyncio.timeout(BOUND):
                # The upstream saw the dead edge's connections go (its requests end there);
                # the survivors have two slots until the store lets the dead leases expire.
                await upstream.wait_until(lambda: upstream.cancelled >= cancelled + 2)
                await upstream.wait_until(lambda: upstream.in_flight == CAPACITY)
            reused_after = loop.time() - killed_at
            await load.more(1200)
            load.stop()
        survivors = [o for o in load.outcomes if o.edge != 2]
        assert failed(survivors) == Counter()
        streams = sum(o.stream for o in survivors)
        assert 0.4 < streams / len(survivors) < 0.6  # (streaming and plain in turn)
        assert len(load.outcomes) >= 2000
        assert failed(before_kill) == Counter()
        assert [o.status for o in [*dead, refused]] == [None, None, None]
        # The cap, contended (reached), never passed.
        assert upstream.max_in_flight == CAPACITY
        assert reused_after <= TTL_MS / 1000 + 1.0, f"reused after {reused_after:.3f} s"
        for edge in edges[:2]:
            assert log_events(edge, "shared_lease_lost") == []
        # Nothing is left held in the store: the survivors released theirs, the dead edge's
        # expired.
        assert await store_held(store) == (0, {})


async def test_the_store_killed_mid_run_keeps_the_cap_and_service_resumes(
    tmp_path: Path, store: RedisServer, upstream: FakeOpenAI
) -> None:
    """The store SIGKILLed under load: each edge falls back to its static split (1 of 4 among
    3 members), so the upstream serves at most 3 at once while the store is down, and every
    edge serves (the others' last known leases are reserved at most ``lease_ttl_ms``); every
    request succeeds; once the store is back (empty, same port) the edges write their leases
    back and use the whole capacity again, still never past it."""
    doc = shared_doc(upstream, store.url, lease_ttl_ms=TTL_MS)
    async with serving_edges(tmp_path, doc, 3) as edges:
        async with Load(edges, per_edge=4) as load:
            await load.more(300)
            await asyncio.to_thread(store.kill)
            for edge in edges:
                down = await wait_for_log(edge, "shared_store_down")
                assert (down["on_store_down"], down["members"]) == ("static_split", 3)
            await asyncio.gather(*(in_split(edge) for edge in edges))
            peak_before = upstream.max_in_flight
            upstream.clear()  # (the peak from now on: every edge within its split)
            served = [load.done(i) for i in range(3)]
            await load.until(lambda: all(load.done(i) >= served[i] + 30 for i in range(3)))
            peak_down = upstream.max_in_flight
            await asyncio.to_thread(store.restart)
            for edge in edges:
                back = await wait_for_log(edge, "shared_store_back")
                assert back["down_s"] > 0
            async with asyncio.timeout(BOUND):
                await upstream.wait_until(lambda: upstream.in_flight == CAPACITY)
            await load.more(300)
            load.stop()
        assert failed(load.outcomes) == Counter()
        assert peak_before <= CAPACITY
        assert peak_down <= 3
        assert upstream.max_in_flight == CAPACITY
        for edge in edges:
            assert log_events(edge, "shared_lease_lost") == []
        assert await store_held(store) == (0, {})


async def test_a_principals_limits_hold_across_the_edges(
    tmp_path: Path, store: RedisServer, upstream: FakeOpenAI
) -> None:
    """``max_in_flight: 2`` of one principal across three edges: the upstream never serves
    more than 2 of it at once (the provider could take 4). ``max_requests_per_minute: 6`` of
    another: of 18 requests sent at once over the three edges, exactly 6 are served and the
    other 12 get 429 ``rate_limit_exceeded`` with a ``Retry-After``."""
    tokens = {"app-capped": "iop_app-capped-token", "app-rated": "iop_app-rated-token"}
    doc = shared_doc(
        upstream,
        store.url,
        lease_ttl_ms=TTL_MS,
        tokens=tokens,
        principals=[
            {"ref": "app-capped", "max_in_flight": 2},
            {"ref": "app-rated", "max_requests_per_minute": 6},
        ],
    )
    async with serving_edges(tmp_path, doc, 3) as edges:
        async with Load(edges, per_edge=4, token=tokens["app-capped"]) as load:
            await load.more(300)
            load.stop()
        assert failed(load.outcomes) == Counter()
        assert upstream.max_in_flight == 2
        served = upstream.total_requests
        async with aiohttp.ClientSession() as session:
            burst = await asyncio.gather(
                *(
                    ask(session, edges[n % 3], n % 3, f"rated {n}", stream=n % 2 == 0,
                        token=tokens["app-rated"])
                    for n in range(18)
                )
            )  # fmt: skip
        assert Counter((o.ok, o.status, o.code) for o in burst) == {
            (True, 200, None): 6,
            (False, 429, "rate_limit_exceeded"): 12,
        }
        assert upstream.total_requests == served + 6
        waits = [float(o.retry_after) for o in burst if o.status == 429 if o.retry_after]
        assert len(waits) == 12
        assert all(0 < wait <= 10 for wait in waits)  # (one request each 10 s)
        assert await store_held(store, "app-capped") == (0, {"app-capped": 0})


async def test_reject_answers_store_unavailable_while_the_store_is_down(
    tmp_path: Path, store: RedisServer, upstream: FakeOpenAI
) -> None:
    """``on_store_down: reject``: with the store killed, every request gets 503
    ``store_unavailable`` in the OpenAI error envelope (the store's password never shown);
    once it is started again, the edges serve again."""
    doc = shared_doc(upstream, store.url, lease_ttl_ms=TTL_MS, on_store_down="reject")
    async with serving_edges(tmp_path, doc, 2) as edges, aiohttp.ClientSession() as session:

        async def round_trip(tag: str) -> list[Outcome]:
            return await asyncio.gather(
                *(
                    ask(session, edges[n % 2], n % 2, f"{tag} {n}", stream=n % 2 == 0)
                    for n in range(8)
                )
            )

        assert failed(await round_trip("before")) == Counter()
        await asyncio.to_thread(store.kill)
        served = upstream.total_requests
        refused = await round_trip("down")
        assert Counter((o.status, o.code) for o in refused) == {(503, "store_unavailable"): 8}
        assert upstream.total_requests == served
        url = edges[0].addresses["openai"] + "/v1/chat/completions"
        async with session.post(
            url, json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        ) as response:
            envelope = await response.json()
        assert response.status == 503
        assert set(envelope["error"]) == {"message", "type", "param", "code"}
        assert envelope["error"]["code"] == "store_unavailable"
        assert "on_store_down is reject" in envelope["error"]["message"]
        assert store.password is not None
        assert store.password not in envelope["error"]["message"]
        await asyncio.to_thread(store.restart)
        for edge in edges:
            await wait_for_log(edge, "shared_store_back")
        assert failed(await round_trip("back")) == Counter()
        for edge in edges:
            assert store.password not in "".join(edge.lines)

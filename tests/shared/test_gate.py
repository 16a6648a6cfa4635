"""Admission through the shared store's gate: several edges' schedulers in one process, each
with its own gate and instance id, against a real ``redis-server`` on 127.0.0.1.

The store's clock is the server's (lease expiry is real time), so these tests wait on events
(a lease granted, a waiter woken) with a bound, never for a fixed time; a FakeClock drives each
gate's renewal and resync loops, so nothing happens in the background unless a test moves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis.asyncio as redis

from iop_edge.admission import AdmissionScheduler, Lease
from iop_edge.errors import AdmissionError
from iop_edge.pool import PoolPolicy, ProviderPolicy, SharedPolicy
from iop_edge.shared.gate import SharedGate
from iop_edge.shared.store import SharedStore
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.redis_server import RedisServer

BOUND = 5.0  # seconds any awaited event may take before the test fails


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    """A server of this module's own: its tests kill and restart it."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def store_url(redis_url: str) -> str:
    return redis_url


def policy(
    capacity: int = 2,
    *,
    caps: dict[str, int] | None = None,
    per_minute: dict[str, int] | None = None,
    ttl_ms: int = 10_000,
    on_store_down: str = "static_split",
) -> PoolPolicy:
    provider = ProviderPolicy(
        node_id="n1",
        provider_id="gpu",
        capacity=capacity,
        long_context_capacity=capacity,
        priority=0,
        enabled=True,
    )
    return PoolPolicy(
        max_queue=1024,
        queue_timeout_ms=0,
        providers=(provider,),
        groups={"m": (provider.key,)},
        caps=caps or {},
        per_minute=per_minute or {},
        principals=tuple({*(caps or {}), *(per_minute or {})}),
        shared=SharedPolicy(ttl_ms, on_store_down),  # type: ignore[arg-type]
    )


class Edge:
    """One edge's admission with its gate (its own store client and instance id)."""

    def __init__(self, url: str, pool: PoolPolicy, name: str) -> None:
        self.clock = FakeClock()
        assert pool.shared is not None
        self.store = SharedStore(url, instance_id=name)
        self.gate = SharedGate(self.store, pool.shared, self.clock)
        self.admission = AdmissionScheduler(pool, clock=self.clock, gate=self.gate)

    def in_flight(self) -> int:
        return self.admission.statistics().in_flight


@contextlib.asynccontextmanager
async def edges(url: str, pool: PoolPolicy, n: int = 2) -> AsyncIterator[list[Edge]]:
    made = [Edge(url, pool, f"edge{i}") for i in range(n)]
    for edge in made:
        await edge.gate.start()
    # One renewal each, so that every edge has seen all the members (a static split's base).
    await until(
        lambda: all(e.gate.statistics().members == n for e in made), *(e.clock for e in made)
    )
    try:
        yield made
    finally:
        async with asyncio.timeout(BOUND):  # (a stop that hangs fails the test, never stalls it)
            for edge in made:
                await edge.admission.aclose()
                await edge.gate.aclose()


async def until(condition: Callable[[], bool], *clocks: FakeClock) -> None:
    """Wait until ``condition`` holds, moving ``clocks`` on by 0.1 s a step (the gates'
    loops run on them: renewals, resyncs)."""
    async with asyncio.timeout(BOUND):
        while not condition():
            for clock in clocks:
                clock.advance(0.1)
            await asyncio.sleep(0.001)


async def test_the_capacity_holds_across_edges_and_a_release_wakes_the_other_edge(
    store_url: str,
) -> None:
    async with edges(store_url, policy(capacity=2)) as (a, b):
        first = await a.admission.admit("m")
        second = await b.admission.admit("m")
        assert first.ticket is not None
        assert second.ticket is not None
        # Both edges see the provider full: the third request waits on edge a.
        third = asyncio.create_task(a.admission.admit("m"))
        await until(lambda: a.admission.queue_depth == 1 or third.done())
        assert not third.done()
        # A release on edge b, published by the store, frees edge a's waiter at once.
        second.release()
        lease = await asyncio.wait_for(third, BOUND)
        assert lease.ticket is not None
        gate = a.gate.statistics()
        assert gate.state == "up"
        assert gate.members == 2
        assert a.in_flight() + b.in_flight() == 2
        first.release()
        lease.release()
        await until(lambda: a.gate.statistics().providers[0].held == 0)


async def test_a_dispatch_the_store_refuses_waits_in_its_place(store_url: str) -> None:
    async with edges(store_url, policy(capacity=1)) as (a, b):
        held = await b.admission.admit("m")
        # Edge a has not heard of b's lease yet when it dispatches: the store refuses it,
        # and the request waits here (counted, in the statistics) until b releases.
        a.admission.set_elsewhere({("n1", "gpu"): (0, 0)}, {})
        waiting = asyncio.create_task(a.admission.admit("m"))
        await until(lambda: a.gate.statistics().refused == 1)
        assert not waiting.done()
        assert a.admission.queue_depth == 1
        shown = a.admission.statistics().providers[0]
        assert (shown.capacity, shown.held_elsewhere, shown.in_flight) == (1, 1, 0)
        held.release()
        lease = await asyncio.wait_for(waiting, BOUND)
        lease.release()


async def test_many_concurrent_requests_on_three_edges_never_pass_the_capacity(
    store_url: str,
) -> None:
    async with edges(store_url, policy(capacity=3), n=3) as trio:
        running = 0
        peak = 0

        async def one(edge: Edge) -> None:
            nonlocal running, peak
            lease = await edge.admission.admit("m")
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0)  # (another edge's request may start meanwhile)
            running -= 1
            lease.release()

        async with asyncio.timeout(30):
            await asyncio.gather(*(one(trio[i % 3]) for i in range(300)))
        assert peak <= 3  # (3 when the loop interleaves them; never more)
        await until(lambda: all(e.gate.statistics().leases == 0 for e in trio))


async def test_max_in_flight_of_a_principal_holds_across_edges(store_url: str) -> None:
    async with edges(store_url, policy(capacity=10, caps={"app": 2})) as (a, b):
        first = await a.admission.admit("m", principal="app")
        second = await b.admission.admit("m", principal="app")
        blocked = asyncio.create_task(a.admission.admit("m", principal="app"))
        other = await a.admission.admit("m", principal="other")  # nobody else is held back
        await until(lambda: a.admission.queue_depth == 1)
        assert not blocked.done()
        second.release()
        lease = await asyncio.wait_for(blocked, BOUND)
        for held in (first, lease, other):
            held.release()


async def test_max_requests_per_minute_holds_across_edges(store_url: str) -> None:
    async with edges(store_url, policy(capacity=10, per_minute={"app": 3})) as (a, b):
        leases: list[Lease] = []
        for edge in (a, b, a):
            leases.append(await edge.admission.admit("m", principal="app"))
        with pytest.raises(AdmissionError) as refused:
            await b.admission.admit("m", principal="app")
        assert refused.value.reason == "rate_limit_exceeded"
        assert refused.value.retry_after is not None
        assert 0 < refused.value.retry_after <= 20
        for lease in leases:
            lease.release()


async def test_a_cancelled_waiter_leaves_no_lease_in_the_store(store_url: str) -> None:
    async with edges(store_url, policy(capacity=1)) as (a, b):
        held = await a.admission.admit("m")
        waiting = asyncio.create_task(b.admission.admit("m"))
        await until(lambda: b.admission.queue_depth == 1)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        held.release()
        await until(lambda: a.gate.statistics().providers[0].held == 0)
        lease = await b.admission.admit("m")  # the slot is free for anyone
        lease.release()


async def test_the_store_down_splits_the_capacity_and_comes_back_without_a_burst(
    own_redis: RedisServer,
) -> None:
    redis_server = own_redis
    redis_server.flushall()
    async with edges(redis_server.url, policy(capacity=4, ttl_ms=3000)) as (a, b):
        held = [await a.admission.admit("m")]
        redis_server.kill()
        # The next dispatch finds the store gone: edge a keeps its lease and may hold its
        # split of 4 among the 2 members it saw, 2; edge b too — never more than 4 in all.
        held.append(await asyncio.wait_for(a.admission.admit("m"), BOUND))
        third = asyncio.create_task(a.admission.admit("m"))
        await until(lambda: a.admission.queue_depth == 1)
        assert a.gate.statistics().state == "down"
        b_leases = [await asyncio.wait_for(b.admission.admit("m"), BOUND) for _ in range(2)]
        assert b.admission.statistics().providers[0].held_elsewhere == 2
        assert a.in_flight() + b.in_flight() == 4
        # The store comes back (empty: it was killed): each edge writes its leases back at
        # its next renewal, and keeps its split one more period.
        redis_server.restart()
        await until(
            lambda: all(e.gate.statistics().state == "up" for e in (a, b)), a.clock, b.clock
        )
        # Every lease of both edges is in the store again, the ones taken in the split too.
        view = await a.store.view(["n1/gpu"], [])
        assert dict(view.providers["n1/gpu"].held_by) == {"edge0": 2, "edge1": 2}
        assert not third.done()
        b_leases[0].release()
        lease = await asyncio.wait_for(third, BOUND)
        for each in (*held, lease, b_leases[1]):
            each.release()


async def test_the_store_down_with_reject_answers_store_unavailable(
    own_redis: RedisServer,
) -> None:
    redis_server = own_redis
    redis_server.flushall()
    async with edges(redis_server.url, policy(on_store_down="reject"), n=1) as (a,):
        redis_server.kill()
        with pytest.raises(AdmissionError) as refused:
            await a.admission.admit("m")
        assert refused.value.reason == "store_unavailable"
        assert "on_store_down is reject" in str(refused.value)
        assert "127.0.0.1" in str(refused.value)
        redis_server.restart()
        await until(lambda: a.gate.statistics().state == "up", a.clock)
        (await a.admission.admit("m")).release()


async def test_a_lease_the_store_lost_stops_its_request(store_url: str) -> None:
    pool = policy(capacity=1, ttl_ms=1000)
    async with edges(store_url, pool, n=1) as (a,):
        holder_started = asyncio.Event()

        async def hold() -> str:
            lease = await a.admission.admit("m")
            holder_started.set()
            try:
                await asyncio.sleep(BOUND * 10)
            except asyncio.CancelledError:
                assert lease.lost is not None
                lease.release()
                return lease.lost
            raise AssertionError("the request was not stopped")

        task = asyncio.create_task(hold())
        await holder_started.wait()
        # Another client of the store removes the lease (as its expiry would): at the next
        # renewal the gate finds it missing and stops the request.
        raw = redis.Redis.from_url(store_url)
        try:
            await raw.flushall()
        finally:
            await raw.aclose()
        await until(task.done, a.clock)
        reason = task.result()
        assert "no longer counts" in reason
        assert a.gate.statistics().lost == 1


def test_the_policy_of_a_shared_pool_is_live(store_url: str) -> None:
    shared = dataclasses.replace(policy(), shared=SharedPolicy(20_000, "reject"))
    assert shared.shared is not None
    assert shared.shared.lease_ttl_ms == 20_000


async def test_a_model_routes_slots_stay_the_edges_own(store_url: str) -> None:
    route = ProviderPolicy(
        node_id="",
        provider_id="route:hosted",
        capacity=1,
        long_context_capacity=0,
        priority=0,
        enabled=True,
    )
    base = policy(capacity=1)
    pool = dataclasses.replace(
        base, providers=(*base.providers, route), groups={**base.groups, "r": (route.key,)}
    )
    async with edges(store_url, pool) as (a, b):
        on_a = await a.admission.admit("r")
        on_b = await b.admission.admit("r")  # each edge has the route's capacity to itself
        assert on_a.ticket is None
        assert on_b.ticket is None
        assert [p.provider_id for p in a.gate.statistics().providers] == ["gpu"]
        on_a.release()
        on_b.release()


async def test_an_edge_that_never_reached_the_store_admits_nothing_until_it_answers(
    own_redis: RedisServer,
) -> None:
    """Static split from the last membership seen: none seen, no share, no request upstream
    (it waits in the queue) until the store answers."""
    own_redis.kill()
    edge = Edge(own_redis.url, policy(capacity=4), "lonely")
    await edge.gate.start()
    try:
        assert edge.gate.statistics().state == "down"
        waiting = asyncio.create_task(edge.admission.admit("m"))
        await until(lambda: edge.admission.queue_depth == 1)
        assert edge.in_flight() == 0
        own_redis.restart()
        await until(waiting.done, edge.clock)
        lease = waiting.result()
        assert lease.ticket is not None
        lease.release()
    finally:
        async with asyncio.timeout(BOUND):
            await edge.admission.aclose()
            await edge.gate.aclose()


async def test_the_others_last_known_leases_are_reserved_only_until_they_would_expire(
    own_redis: RedisServer,
) -> None:
    """The store lost while edge c saw the other two hold the whole capacity: c reserves
    their leases as the store would have counted them, and no longer — once
    ``lease_ttl_ms`` has passed without the store, c holds its static split, floor(4 / 3),
    like every edge. (Before, c reserved them for the whole outage: found end to end, every
    edge saw the others' leases of a different moment, and none served at all.)"""
    redis_server = own_redis
    redis_server.flushall()
    async with edges(redis_server.url, policy(capacity=4, ttl_ms=3000), n=3) as (a, b, c):
        held = [await a.admission.admit("m") for _ in range(2)]
        held += [await b.admission.admit("m") for _ in range(2)]
        # Edge c's request is refused by the full store: it waits, the store's count known.
        waiting = asyncio.create_task(c.admission.admit("m"))
        await until(lambda: c.gate.statistics().refused == 1)
        redis_server.kill()
        await until(lambda: c.gate.statistics().state == "down", c.clock)
        for lease in held:  # (their releases wait for the store)
            lease.release()
        # Edges a and b may have held 4 until now: c's request waits while their leases
        # would still count in the store...
        c.clock.advance(2.9)
        for _ in range(10):
            await asyncio.sleep(0)
        assert not waiting.done()
        assert c.admission.statistics().providers[0].held_elsewhere == 4
        # ... and goes once they would have expired: c holds its split, 1.
        await until(waiting.done, c.clock)
        lease = waiting.result()
        assert c.admission.statistics().providers[0].held_elsewhere == 3
        lease.release()
        redis_server.restart()


async def test_a_freed_slot_goes_to_the_next_waiter_without_waiting_for_a_resync(
    store_url: str,
) -> None:
    """Capacity 1 handed from request to request, on one edge and across two: answers that
    cross on the way (a refusal answered after the release that freed the slot) never leave a
    waiter behind. The gates' clocks stand still, so no resync runs: a waiter left behind
    would wait for ever and fail the test."""
    async with edges(store_url, policy(capacity=1)) as (a, b):

        async def loop(edge: Edge, n: int) -> None:
            for _ in range(n):
                lease = await edge.admission.admit("m")
                await asyncio.sleep(0)
                lease.release()

        async with asyncio.timeout(20):
            await asyncio.gather(loop(a, 100), loop(a, 100), loop(b, 100))
        await until(lambda: a.gate.statistics().leases == b.gate.statistics().leases == 0)

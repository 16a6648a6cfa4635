"""The shared store's client (:mod:`iop_edge.shared.store`) against a real ``redis-server``:
every operation, the refusal order, expiry on a driven millisecond clock, releases published
and heard, rates equal to the in-process buckets, and the store failing (killed, stopped,
refusing) with the password hidden."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis

from iop_edge.errors import IopEdgeError, StoreUnavailable
from iop_edge.pool.rates import RateLimits
from iop_edge.shared.records import decode_released
from iop_edge.shared.store import (
    BATCH,
    LATENCY_BUCKETS,
    OPS,
    Grant,
    LeaseRef,
    ProviderView,
    Released,
    SharedStore,
    redact_store_url,
)
from iop_edge.testing.leaks import BOUND, wait_for
from iop_edge.testing.redis_server import RedisServer
from tests.helpers.upstreams import closed_port

P = "gpu-1/vllm"
Q = "gpu-2/ollama"
T0 = 1_700_000_000_000
TTL = 1000


class MsClock:
    """A clock of milliseconds the test moves (the scripts' ``now``)."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> MsClock:
    return MsClock()


@pytest.fixture
async def stores(redis_url: str, clock: MsClock) -> AsyncIterator[Callable[[str], SharedStore]]:
    """Clients of the session's store on the test's clock, one per instance id asked for."""
    made: dict[str, SharedStore] = {}

    def store(instance: str) -> SharedStore:
        if instance not in made:
            made[instance] = SharedStore(redis_url, instance_id=instance, now_ms=clock)
        return made[instance]

    yield store
    for each in made.values():
        await each.aclose()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client of the same server, to read the keys as they are."""
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        yield client


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A server of this test alone (killed, stopped or restarted by it)."""
    with RedisServer(password="hunter2-very-secret") as server:
        yield server


def lease(n: int, instance: str = "a", provider: str = P, **fields: Any) -> LeaseRef:
    return LeaseRef(f"{instance}:{n}", provider, **fields)


# -- acquire ---------------------------------------------------------------------------------


async def test_acquire_grants_up_to_capacity_and_refuses_the_next_with_provider(stores, raw):
    a = stores("a")
    grants = [await a.acquire(lease(n), capacity=2, ttl_ms=TTL) for n in range(3)]
    assert grants == [
        Grant(granted=True, refused=None, held=1, long_held=0, principal_held=0),
        Grant(granted=True, refused=None, held=2, long_held=0, principal_held=0),
        Grant(granted=False, refused="provider", held=2, long_held=0, principal_held=0),
    ]
    assert raw.zrange(f"iop-edge:lease:{P}", 0, -1, withscores=True) == [
        ("a:0", T0 + TTL),
        ("a:1", T0 + TTL),
    ]


async def test_every_answer_has_a_newer_version_and_the_askers_own_leases(stores):
    """The version orders answers about the counts (an edge applies none older than one it
    applied); ``mine`` counts the asker's own leases among them, exact at that version."""
    a, b = stores("a"), stores("b")
    first = await a.acquire(
        lease(1, long=True, principal="app"),
        capacity=4,
        long_capacity=2,
        principal_cap=3,
        ttl_ms=TTL,
    )
    other = await b.acquire(
        LeaseRef("b:1", P, principal="app"), capacity=4, principal_cap=3, ttl_ms=TTL
    )
    second = await a.acquire(lease(2, principal="app"), capacity=4, principal_cap=3, ttl_ms=TTL)
    assert first.version < other.version < second.version
    assert (first.mine, other.mine, second.mine) == ((1, 1, 1), (1, 0, 1), (2, 1, 2))
    released = await a.release(lease(1, long=True, principal="app"))
    assert released.version > second.version
    assert released.mine == (1, 0, 1)
    view = await a.view([P], ["app"])
    assert view.version > released.version
    assert view.providers[P].held_by == {"a": 1, "b": 1}
    assert view.providers[P].long_mine == 0
    assert view.principals_mine == {"app": 1}


async def test_the_refusal_order_is_provider_then_long_then_principal(stores, raw):
    """With several limits full, the first in the order provider, long, principal is named,
    and a refusal changes nothing."""
    a = stores("a")
    full = {"capacity": 2, "long_capacity": 1, "principal_cap": 1, "ttl_ms": TTL}
    assert (await a.acquire(lease(1, long=True, principal="app"), **full)).granted
    assert (await a.acquire(lease(2, principal="other"), **full)).granted
    # provider, long and principal all full
    refused = await a.acquire(lease(3, long=True, principal="app"), **full)
    assert refused == Grant(False, "provider", held=2, long_held=1, principal_held=1)
    # room for one more general lease: long and principal full
    room = {**full, "capacity": 3}
    refused = await a.acquire(lease(3, long=True, principal="app"), **room)
    assert refused == Grant(False, "long", held=2, long_held=1, principal_held=1)
    # a general lease of the same principal: the principal's cap
    refused = await a.acquire(lease(3, principal="app"), **room)
    assert refused == Grant(False, "principal", held=2, long_held=1, principal_held=1)
    # nothing was added by any refusal
    assert raw.zrange(f"iop-edge:lease:{P}", 0, -1) == ["a:1", "a:2"]
    assert raw.zrange(f"iop-edge:long:{P}", 0, -1) == ["a:1"]
    assert raw.zrange("iop-edge:principal:app", 0, -1) == ["a:1"]
    granted = await a.acquire(lease(3, principal="app"), **{**room, "principal_cap": 2})
    assert granted == Grant(True, None, held=3, long_held=1, principal_held=2)


async def test_a_principal_without_a_cap_is_counted_but_never_refuses(stores):
    a = stores("a")
    for n in range(3):
        grant = await a.acquire(lease(n, principal="app"), capacity=5, ttl_ms=TTL)
        assert (grant.granted, grant.principal_held) == (True, n + 1)


async def test_a_principal_cap_needs_a_principal(stores):
    with pytest.raises(ValueError, match="a principal_cap needs a principal"):
        await stores("a").acquire(lease(1), capacity=1, principal_cap=1, ttl_ms=TTL)


async def test_acquiring_a_held_id_again_refreshes_it_and_counts_it_once(stores, clock, raw):
    a = stores("a")
    one = lease(1, long=True, principal="app")
    caps = {"capacity": 1, "long_capacity": 1, "principal_cap": 1}
    assert (await a.acquire(one, **caps, ttl_ms=TTL)).granted
    clock.now += 500
    again = await a.acquire(one, **caps, ttl_ms=TTL)
    assert again == Grant(True, None, held=1, long_held=1, principal_held=1)
    for key in (f"iop-edge:lease:{P}", f"iop-edge:long:{P}", "iop-edge:principal:app"):
        assert raw.zscore(key, "a:1") == T0 + 500 + TTL


async def test_a_lease_expires_when_the_clock_reaches_its_expiry(stores, clock):
    """A lease is live while its expiry is above now: at exactly now + ttl it is gone."""
    a, b = stores("a"), stores("b")
    assert (await a.acquire(lease(1), capacity=1, ttl_ms=TTL)).granted
    clock.now += TTL - 1
    assert (await b.acquire(lease(1, "b"), capacity=1, ttl_ms=TTL)).refused == "provider"
    clock.now += 1
    assert await b.acquire(lease(1, "b"), capacity=1, ttl_ms=TTL) == Grant(True, None, 1, 0, 0)


async def test_ttl_and_counts_are_checked(stores):
    a = stores("a")
    with pytest.raises(ValueError, match="ttl_ms 0 must be a whole number of at least 1"):
        await a.acquire(lease(1), capacity=1, ttl_ms=0)
    # a capacity of 0 refuses everything
    assert (await a.acquire(lease(1), capacity=0, ttl_ms=TTL)).refused == "provider"


async def test_without_now_ms_the_expiry_is_the_servers_clock(redis_url, raw):
    async with _store(redis_url, "a") as a:
        assert (await a.acquire(lease(1), capacity=1, ttl_ms=60_000)).granted
        seconds, micros = raw.time()
        server_ms = seconds * 1000 + micros // 1000
        expiry = raw.zscore(f"iop-edge:lease:{P}", "a:1")
        assert expiry is not None
        # set within this test, so within BOUND of the server's clock read after it
        assert server_ms + 60_000 - BOUND * 1000 <= expiry <= server_ms + 60_000


# -- release ---------------------------------------------------------------------------------


async def test_release_removes_the_lease_from_all_its_sets_and_is_idempotent(stores, raw):
    a = stores("a")
    one = lease(1, long=True, principal="app")
    caps = {"capacity": 3, "long_capacity": 2, "principal_cap": 2, "ttl_ms": TTL}
    await a.acquire(one, **caps)
    await a.acquire(lease(2, long=True, principal="app"), **caps)
    expected = Released(P, held=1, long_held=1, principal="app", principal_held=1, instance="a")
    assert await a.release(one) == expected
    assert await a.release(one) == expected
    assert raw.zrange(f"iop-edge:lease:{P}", 0, -1) == ["a:2"]
    assert raw.zrange(f"iop-edge:long:{P}", 0, -1) == ["a:2"]
    assert raw.zrange("iop-edge:principal:app", 0, -1) == ["a:2"]


async def test_releasing_an_unknown_lease_changes_nothing_and_answers_the_counts(stores):
    a = stores("a")
    await a.acquire(lease(1), capacity=3, ttl_ms=TTL)
    unknown = LeaseRef("z:9", Q, principal="nobody")
    assert await a.release(unknown) == Released(Q, 0, 0, "nobody", 0, "z")
    assert await a.release(lease(7)) == Released(P, 1, 0, None, 0, "a")


async def test_releasing_one_lease_never_removes_another(stores, raw):
    a, b = stores("a"), stores("b")
    await a.acquire(lease(1), capacity=3, ttl_ms=TTL)
    await b.acquire(lease(1, "b"), capacity=3, ttl_ms=TTL)
    await a.release(lease(1))
    assert raw.zrange(f"iop-edge:lease:{P}", 0, -1) == ["b:1"]


# -- renew and reassert ----------------------------------------------------------------------


async def test_renew_extends_the_leases_held_and_reports_the_missing(stores, clock, raw):
    a, b = stores("a"), stores("b")
    kept = lease(1, long=True, principal="app")
    lapsed = lease(2, principal="app")
    caps = {"capacity": 5, "long_capacity": 1, "principal_cap": 5}
    await a.acquire(kept, **caps, ttl_ms=TTL)
    await a.acquire(lapsed, **caps, ttl_ms=TTL // 2)
    clock.now += TTL // 2
    missing = await a.renew([kept, lapsed, lease(3)], ttl_ms=TTL)
    assert missing == ["a:2", "a:3"]
    for key in (f"iop-edge:lease:{P}", f"iop-edge:long:{P}", "iop-edge:principal:app"):
        assert raw.zrange(key, 0, -1, withscores=True) == [("a:1", clock.now + TTL)]
    # live past its first expiry: b finds the provider at its capacity of 1
    clock.now += TTL - 1
    assert (await b.acquire(lease(1, "b"), capacity=1, ttl_ms=TTL)).refused == "provider"


async def test_renew_takes_many_leases_in_batches(stores, clock):
    a = stores("a")
    count = 2 * BATCH + 50
    leases = [lease(n, principal=f"p{n % 3}", long=n % 2 == 0) for n in range(count)]
    for each in leases:
        assert (await a.acquire(each, capacity=count, long_capacity=count, ttl_ms=TTL)).granted
    gone = [each for n, each in enumerate(leases) if n % 97 == 0]
    for each in gone:
        await a.release(each)
    clock.now += TTL - 1
    assert await a.renew(leases, ttl_ms=TTL) == [each.lease_id for each in gone]
    clock.now += TTL - 1
    view = await a.view([P], ["p0", "p1", "p2"])
    assert view.providers[P].held == count - len(gone)
    assert sum(view.principals.values()) == count - len(gone)


async def test_reassert_adds_leases_without_any_check(stores, clock):
    a, b = stores("a"), stores("b")
    held = [lease(n, long=True, principal="app") for n in range(3)]
    await a.reassert(held, ttl_ms=TTL)
    view = await a.view([P], ["app"])
    assert view.providers[P] == ProviderView(held=3, long_held=3, held_by={"a": 3})
    assert view.principals == {"app": 3}
    assert (await b.acquire(lease(1, "b"), capacity=3, ttl_ms=TTL)).refused == "provider"
    clock.now += TTL
    assert (await b.acquire(lease(1, "b"), capacity=3, ttl_ms=TTL)).granted


# -- membership and views --------------------------------------------------------------------


async def test_heartbeat_counts_the_live_members_and_leave_removes_one(stores, clock):
    a, b = stores("a"), stores("b")
    assert await a.heartbeat(TTL) == 1
    assert await b.heartbeat(TTL) == 2
    await b.leave()
    assert await a.heartbeat(TTL) == 1
    await b.heartbeat(TTL)
    clock.now += TTL  # b's membership lapses; a renews its own
    assert await a.heartbeat(TTL) == 1
    assert (await a.view([], [])).members == 1


async def test_view_counts_live_leases_by_instance_and_drops_the_expired(stores, clock):
    a, b = stores("a"), stores("b")
    await a.heartbeat(TTL)
    await a.acquire(lease(1, long=True, principal="app"), capacity=9, long_capacity=9, ttl_ms=TTL)
    await a.acquire(lease(2), capacity=9, ttl_ms=2 * TTL)
    await b.acquire(lease(1, "b", principal="app"), capacity=9, ttl_ms=2 * TTL)
    await b.acquire(lease(2, "b", provider=Q), capacity=9, ttl_ms=TTL)
    view = await a.view([P, Q, "none/none"], ["app", "nobody"])
    assert view.providers == {
        P: ProviderView(held=3, long_held=1, held_by={"a": 2, "b": 1}),
        Q: ProviderView(held=1, long_held=0, held_by={"b": 1}),
        "none/none": ProviderView(held=0, long_held=0, held_by={}),
    }
    assert view.principals == {"app": 2, "nobody": 0}
    assert view.members == 1
    clock.now += TTL
    view = await b.view([P, Q], ["app"])
    assert view.providers == {
        P: ProviderView(held=2, long_held=0, held_by={"a": 1, "b": 1}),
        Q: ProviderView(held=0, long_held=0, held_by={}),
    }
    assert (view.principals, view.members) == ({"app": 1}, 0)


# -- rates -----------------------------------------------------------------------------------


async def test_take_rate_answers_as_the_in_process_buckets_at_the_same_times(stores, clock):
    """The store's bucket and :class:`RateLimits` give the same answers, to the bit."""
    a = stores("a")
    limits = RateLimits({"app": 3})
    # (a burst of the minute's worth, then the refill: one token every 20 s)
    for step in (0, 0, 0, 0, 1, 5_000, 14_999, 1, 20_000, 0, 60_000, 0, 0, 0, 0, 123):
        clock.now += step
        mine = await a.take_rate("app", 3)
        assert mine == limits.take("app", clock.now / 1000)
    assert mine is not None
    assert mine > 0


async def test_take_rate_refuses_with_the_seconds_until_a_token(stores, clock):
    a = stores("a")
    assert [await a.take_rate("app", 2) for _ in range(2)] == [None, None]
    assert await a.take_rate("app", 2) == 30.0
    clock.now += 10_000
    assert await a.take_rate("app", 2) == pytest.approx(20.0)
    assert await stores("b").take_rate("other", 2) is None  # a bucket per principal


async def test_take_rate_on_the_servers_clock_keeps_an_idle_bucket_no_longer_than_a_refill(
    redis_url, raw
):
    async with _store(redis_url, "a") as a:
        assert await a.take_rate("app", 1) is None
        wait = await a.take_rate("app", 1)
        assert wait is not None
        assert 0 < wait <= 60
    # empty: full again within 60 s, so the hash goes a second after that
    assert 0 < raw.pttl("iop-edge:rate:app") <= 61_000
    with pytest.raises(ValueError, match="per_minute 0"):
        await SharedStore(redis_url, instance_id="a").take_rate("app", 0)


# -- releases published ----------------------------------------------------------------------


async def test_listen_hears_every_release_that_freed_something(stores, raw):
    a, b = stores("a"), stores("b")
    heard: list[Released] = []
    arrived = asyncio.Event()
    subscribed = asyncio.Event()

    def on_release(released: Released) -> None:
        heard.append(released)
        arrived.set()

    listening = asyncio.create_task(b.listen(on_release, on_subscribed=subscribed.set))
    try:
        async with asyncio.timeout(BOUND):
            await subscribed.wait()
        await a.acquire(lease(1, long=True, principal="app"), capacity=2, long_capacity=1,
                        ttl_ms=TTL)  # fmt: skip
        await a.acquire(lease(2), capacity=2, ttl_ms=TTL)
        # a release that frees nothing, and a message that is no release: neither is heard
        await a.release(lease(9))
        raw.publish("iop-edge:released", "not a release")
        answer = await a.release(lease(1, long=True, principal="app"))
        async with asyncio.timeout(BOUND):
            await arrived.wait()
        assert heard == [Released(P, 1, 0, "app", 0, "a")]
        # the message carries the release's version exactly (16 digits: not a JSON number,
        # which the store's cjson writes with 14)
        assert heard[0].version == answer.version > 10**15
    finally:
        listening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await listening
    assert raw.pubsub_numsub("iop-edge:released") == [("iop-edge:released", 0)]


def test_a_release_message_decodes_or_is_skipped():
    message = '["n/p",1,0,"",0,"a",7]'
    assert decode_released(message) == Released("n/p", 1, 0, None, 0, "a")
    assert decode_released(message).version == 7  # type: ignore[union-attr]
    for other in (
        "",
        "[]",
        "null",
        '{"a":1}',
        '["n/p",1]',
        b"\xff",
        None,
        '["n/p","x",0,"",0,"a"]',
    ):
        assert decode_released(other) is None


# -- the store failing -----------------------------------------------------------------------


async def test_a_killed_store_raises_store_unavailable_without_the_password(own_redis):
    async with _store(own_redis.url, "a") as a:
        await a.connect()
        assert (await a.acquire(lease(1), capacity=1, ttl_ms=TTL)).granted
        own_redis.kill()
        with pytest.raises(StoreUnavailable) as failed:
            await a.acquire(lease(2), capacity=1, ttl_ms=TTL)
        message = str(failed.value)
        assert failed.value.op == "acquire"
        assert isinstance(failed.value, IopEdgeError)
        assert "hunter2" not in message
        assert message.startswith(
            f"shared store redis://:***@127.0.0.1:{own_redis.port}/0: acquire failed: "
        )
        with pytest.raises(
            StoreUnavailable, match=r"release failed: Error 111 connecting"
        ) as failed:
            await a.release(lease(1))
        assert "hunter2" not in str(failed.value)
        stats = a.statistics()
        assert (stats.calls["acquire"], stats.errors["acquire"]) == (2, 1)
        assert stats.errors["release"] == 1
        assert stats.last_error == str(failed.value)
        # back (empty: the scripts are loaded again on their first use)
        own_redis.start()
        assert (await a.acquire(lease(2), capacity=1, ttl_ms=TTL)).granted
        assert a.statistics().last_error is None


async def test_a_store_that_does_not_answer_fails_each_call_within_op_timeout(own_redis):
    """A stopped server (a partition: connections open, no answer)."""
    async with _store(own_redis.url, "a", op_timeout=0.2) as a:
        await a.heartbeat(TTL)
        assert own_redis.process is not None
        os.kill(own_redis.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable) as failed:
                await a.renew([lease(1)], ttl_ms=TTL)
            assert str(failed.value) == (
                f"shared store redis://:***@127.0.0.1:{own_redis.port}/0: renew failed: "
                "no answer within 0.2 s"
            )
        finally:
            os.kill(own_redis.process.pid, signal.SIGCONT)
        assert await a.heartbeat(TTL) == 1


async def test_connect_to_nothing_raises_store_unavailable(tmp_path):
    url = f"redis://:pw@127.0.0.1:{closed_port()}/0"
    async with _store(url, "a") as a:
        with pytest.raises(
            StoreUnavailable, match=r"connect failed: Error 111 connecting"
        ) as failed:
            await a.connect()
        assert failed.value.op == "connect"
        assert ":pw@" not in str(failed.value)
    async with _store(f"unix://{tmp_path / 'none.sock'}", "a") as a:
        with pytest.raises(StoreUnavailable, match="view failed"):
            await a.view([P], [])


async def test_listen_raises_store_unavailable_when_the_store_is_killed(own_redis):
    async with _store(own_redis.url, "a") as a:
        subscribed = asyncio.Event()
        listening = asyncio.create_task(a.listen(lambda _: None, on_subscribed=subscribed.set))
        async with asyncio.timeout(BOUND):
            await subscribed.wait()
        own_redis.kill()
        with pytest.raises(StoreUnavailable, match="listen failed") as failed:
            async with asyncio.timeout(BOUND):
                await listening
        assert "hunter2" not in str(failed.value)
        assert a.statistics().errors["listen"] == 1


async def test_listen_pings_an_idle_channel_and_raises_when_no_answer_comes(own_redis):
    async with _store(own_redis.url, "a", op_timeout=0.1) as a:
        subscribed = asyncio.Event()
        listening = asyncio.create_task(
            a.listen(lambda _: None, on_subscribed=subscribed.set, keepalive=0.05)
        )
        async with asyncio.timeout(BOUND):
            await subscribed.wait()
        with redis.Redis.from_url(own_redis.url, decode_responses=True) as client:

            def pinged_while_subscribed() -> bool:
                return any(c["sub"] == "1" and c["cmd"] == "ping" for c in client.client_list())

            # idle: pinged, answered, still listening
            await wait_for(pinged_while_subscribed)
        assert not listening.done()
        assert own_redis.process is not None
        os.kill(own_redis.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable, match=r"no answer to PING within 0\.1 s"):
                async with asyncio.timeout(BOUND):
                    await listening
        finally:
            os.kill(own_redis.process.pid, signal.SIGCONT)


# -- the unix socket, statistics, URLs -------------------------------------------------------


async def test_the_store_works_over_a_unix_socket(redis_server, redis_url, clock):
    async with _store(redis_server.unix_url, "u", now_ms=clock) as u:
        await u.connect()
        assert (await u.acquire(lease(1, "u"), capacity=1, ttl_ms=TTL)).granted
        assert (await u.view([P], [])).providers[P].held_by == {"u": 1}
        assert "hunter2" not in u.redacted_url
        assert ":***@" in u.redacted_url


async def test_statistics_count_calls_errors_and_latency(stores):
    a = stores("a")
    assert a.statistics().calls == dict.fromkeys(OPS, 0)
    await a.connect()
    for n in range(3):
        await a.acquire(lease(n), capacity=2, ttl_ms=TTL)
    await a.release(lease(0))
    await a.view([P], [])
    stats = a.statistics()
    assert stats.calls == {**dict.fromkeys(OPS, 0), "connect": 1, "acquire": 3, "release": 1,
                           "view": 1}  # fmt: skip
    assert stats.errors == dict.fromkeys(OPS, 0)
    assert stats.latency_buckets == LATENCY_BUCKETS
    assert stats.latency_count == 6
    assert list(stats.latency_counts) == sorted(stats.latency_counts)
    assert stats.latency_counts[-1] <= stats.latency_count
    assert stats.latency_sum > 0
    assert stats.last_error is None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@10.0.0.5:6379/0", "redis://:***@10.0.0.5:6379/0"),
        ("rediss://user:s3cret@cache.example:6380/2", "rediss://user:***@cache.example:6380/2"),
        ("redis://10.0.0.5:6379/0", "redis://10.0.0.5:6379/0"),
        ("redis://t0ken@10.0.0.5:6379/0", "redis://***@10.0.0.5:6379/0"),
        ("unix://:s3cret@/run/redis/redis.sock?db=0", "unix://:***@/run/redis/redis.sock?db=0"),
        ("unix:///run/redis.sock?db=1&password=s3cret", "unix:///run/redis.sock?db=1&password=***"),
    ],
)
def test_the_store_url_is_shown_with_its_password_hidden(url, shown):
    assert redact_store_url(url) == shown
    assert SharedStore(url, instance_id="a").redacted_url == shown


@pytest.mark.parametrize(
    ("url", "fields", "message"),
    [
        ("http://:pw@h/0", {}, "shared store URL 'http://:***@h/0': the scheme 'http' is not"),
        ("redis://h/0", {"instance_id": "a:b"}, "instance_id 'a:b' must be non-empty and without"),
        ("redis://h/0", {"instance_id": ""}, "instance_id '' must be non-empty"),
        ("redis://h/0", {"op_timeout": 0}, "op_timeout 0 must be above 0 seconds"),
    ],
)
def test_a_store_is_refused_a_bad_url_instance_or_timeout(url, fields, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        SharedStore(url, **{"instance_id": "a", **fields})


def test_a_lease_names_its_instance():
    assert LeaseRef("3f9a1c0b2d4e:17", P).instance == "3f9a1c0b2d4e"


class _store:
    """``async with _store(url, instance) as store``: a client closed at the end."""

    def __init__(self, url: str, instance: str, **options: Any) -> None:
        self.store = SharedStore(url, instance_id=instance, **options)

    async def __aenter__(self) -> SharedStore:
        return self.store

    async def __aexit__(self, *exc: object) -> None:
        await self.store.aclose()


async def test_a_cancel_the_client_swallowed_still_stops_the_caller(redis_url):
    """A call answered although its task was cancelled meanwhile (redis-py can: a cancel that
    lands while it hands its connection back) raises ``CancelledError``: a loop stopped by
    cancelling its task (the gate's renewals, at ``aclose``) stops, instead of running on."""
    store = SharedStore(redis_url, instance_id="e1")
    entered = asyncio.Event()

    async def answers_anyway() -> str:
        entered.set()
        with contextlib.suppress(asyncio.CancelledError):  # (what the client did)
            await asyncio.Event().wait()
        return "answered"

    call = asyncio.create_task(store._call("view", answers_anyway))
    await entered.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await store.aclose()

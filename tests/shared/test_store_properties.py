"""Property tests of the lease scripts against a real ``redis-server``, with the time driven by
the test (``now_ms``).

A Hypothesis state machine runs three edges (instances ``a``, ``b``, ``c``, each its own
client) against one store: random acquires (two providers, general or long, of a principal
with a cap, one without, or none), acquires of a held id again, releases (of any lease ever
taken: held, released or expired), renewals of an instance's leases and advances of the clock.
A model of the sorted sets predicts every answer — each :class:`Grant`, each release's counts,
each renewal's missing ids — and after every step the store is read back. Checked:

1. live leases (expiry above now) never exceed a provider's capacity, its long-context
   capacity, or a capped principal's ``max_in_flight``;
2. a granted lease stays a member, with the expiry it was given, until it is released or
   expires; a release removes that lease and no other;
3. the counts a script answers are the sizes of the sets after the expired were dropped.

A second property: the store's rate buckets answer exactly as :class:`RateLimits` does at the
same times.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar, cast

import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from iop_edge.pool.rates import RateLimits
from iop_edge.shared.store import Grant, LeaseRef, Released, SharedStore
from iop_edge.testing.redis_server import RedisServer

INSTANCES = ("a", "b", "c")
PROVIDERS = ("n1/p", "n2/q")
PRINCIPALS = (None, "capped", "free")  # "free": counted, never refused
T0 = 1_700_000_000_000
TTLS = st.sampled_from([300, 1000, 2500])

#: one set of the store: (kind, name) with kind "lease", "long" or "principal"
SetKey = tuple[str, str]
T = TypeVar("T")


class LeaseMachine(RuleBasedStateMachine):
    """Three clients of one store against a model of its sorted sets."""

    url = ""  # set by the test (the session's server)

    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.runner = asyncio.Runner()
        with redis.Redis.from_url(self.url) as client:
            client.flushall()
        self.raw = redis.Redis.from_url(self.url, decode_responses=True)
        self.stores = {
            name: SharedStore(self.url, instance_id=name, now_ms=lambda: self.now)
            for name in INSTANCES
        }
        self.seq = itertools.count()
        #: every lease taken, by id
        self.taken: dict[str, LeaseRef] = {}
        #: the model: each set's members and their expiry, expired ones kept until a script
        #: would drop them
        self.sets: dict[SetKey, dict[str, int]] = {}
        self.capacity = 1
        self.long_capacity = 0
        self.principal_cap = 1

    def teardown(self) -> None:
        async def close() -> None:
            for store in self.stores.values():
                await store.aclose()

        self.runner.run(close())
        self.runner.close()
        self.raw.close()

    @initialize(capacity=st.integers(1, 4), long_capacity=st.integers(0, 2), cap=st.integers(1, 3))
    def limits(self, capacity: int, long_capacity: int, cap: int) -> None:
        self.capacity = capacity
        self.long_capacity = min(long_capacity, capacity)
        self.principal_cap = cap

    # -- the model ---------------------------------------------------------------------------

    def members(self, key: SetKey) -> dict[str, int]:
        return self.sets.setdefault(key, {})

    def live(self, key: SetKey) -> int:
        """Drop the expired members (as the scripts do) and count the rest."""
        members = self.members(key)
        for lease_id in [m for m, expiry in members.items() if expiry <= self.now]:
            del members[lease_id]
        return len(members)

    def keys_of(self, lease: LeaseRef, *, long: bool) -> list[SetKey]:
        keys = [("lease", lease.provider)]
        if long:
            keys.append(("long", lease.provider))
        if lease.principal is not None:
            keys.append(("principal", lease.principal))
        return keys

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coroutine)

    # -- rules -------------------------------------------------------------------------------

    @rule(
        target=leases,
        instance=st.sampled_from(INSTANCES),
        provider=st.sampled_from(PROVIDERS),
        long=st.booleans(),
        principal=st.sampled_from(PRINCIPALS),
        ttl=TTLS,
    )
    def acquire(
        self, instance: str, provider: str, long: bool, principal: str | None, ttl: int
    ) -> LeaseRef:
        lease = LeaseRef(f"{instance}:{next(self.seq)}", provider, long, principal)
        self.taken[lease.lease_id] = lease
        self.take(lease, ttl)
        return lease

    @rule(lease=leases, ttl=TTLS)
    def acquire_again(self, lease: LeaseRef, ttl: int) -> None:
        self.take(lease, ttl)

    def take(self, lease: LeaseRef, ttl: int) -> None:
        cap = self.principal_cap if lease.principal == "capped" else None
        grant = self.run(
            self.stores[lease.instance].acquire(
                lease,
                capacity=self.capacity,
                long_capacity=self.long_capacity,
                principal_cap=cap,
                ttl_ms=ttl,
            )
        )
        general, long_key = ("lease", lease.provider), ("long", lease.provider)
        principal_key = ("principal", lease.principal or "")
        counts = [self.live(general), self.live(long_key)]
        counts.append(self.live(principal_key) if lease.principal else 0)

        def others(key: SetKey, count: int) -> int:
            return count - (lease.lease_id in self.members(key))

        refused: Literal["provider", "long", "principal"] | None = None
        if others(general, counts[0]) >= self.capacity:
            refused = "provider"
        elif lease.long and others(long_key, counts[1]) >= self.long_capacity:
            refused = "long"
        elif cap is not None and others(principal_key, counts[2]) >= cap:
            refused = "principal"
        if refused is None:
            for key in self.keys_of(lease, long=lease.long):
                self.members(key)[lease.lease_id] = self.now + ttl
            counts = [len(self.members(general)), len(self.members(long_key))]
            counts.append(len(self.members(principal_key)) if lease.principal else 0)
        assert grant == Grant(refused is None, refused, counts[0], counts[1], counts[2])

    @rule(lease=leases)
    def release(self, lease: LeaseRef) -> None:
        released = self.run(self.stores[lease.instance].release(lease))
        counts = []
        for key in self.keys_of(lease, long=True):
            self.live(key)
            self.members(key).pop(lease.lease_id, None)
            counts.append(len(self.members(key)))
        if lease.principal is None:
            counts.append(0)
        assert released == Released(
            lease.provider, counts[0], counts[1], lease.principal, counts[2], lease.instance
        )

    @rule(instance=st.sampled_from(INSTANCES), data=st.data(), ttl=TTLS)
    def renew(self, instance: str, data: st.DataObject, ttl: int) -> None:
        """Renew a sample of the leases ``instance`` ever took (held, released, expired)."""
        taken = [lease for lease in self.taken.values() if lease.instance == instance]
        pick = st.lists(st.sampled_from(taken), min_size=1, unique=True)
        refs = data.draw(pick if taken else st.just([]))
        missing = self.run(self.stores[instance].renew(refs, ttl))
        expected = []
        for lease in refs:
            general = self.members(("lease", lease.provider))
            keys = self.keys_of(lease, long=lease.long)
            if general.get(lease.lease_id, self.now) > self.now:
                for key in keys:
                    if lease.lease_id in self.members(key):
                        self.members(key)[lease.lease_id] = self.now + ttl
            else:
                for key in keys:
                    self.members(key).pop(lease.lease_id, None)
                expected.append(lease.lease_id)
        assert missing == expected

    @rule(ms=st.sampled_from([0, 1, 100, 299, 300, 700, 1000, 2500]))
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule()
    def view(self) -> None:
        """The counts a view answers are the model's, expired leases dropped."""
        principals = [p for p in PRINCIPALS if p is not None]
        view = self.run(self.stores["a"].view(PROVIDERS, principals))
        for provider in PROVIDERS:
            seen = view.providers[provider]
            expected = (self.live(("lease", provider)), self.live(("long", provider)))
            assert (seen.held, seen.long_held) == expected
            by_instance = {
                name: sum(m.startswith(f"{name}:") for m in self.members(("lease", provider)))
                for name in INSTANCES
            }
            assert seen.held_by == {name: n for name, n in by_instance.items() if n}
        for principal in principals:
            assert view.principals[principal] == self.live(("principal", principal))

    # -- checks ------------------------------------------------------------------------------

    @invariant()
    def the_store_holds_what_the_model_holds_within_the_limits(self) -> None:
        """Read without changing anything (expired members stay until a script drops them)."""
        for (kind, name), members in self.sets.items():
            pairs = self.raw.zrange(f"iop-edge:{kind}:{name}", 0, -1, withscores=True)
            stored = dict(cast("list[tuple[str, float]]", pairs))
            assert stored == {lease_id: float(expiry) for lease_id, expiry in members.items()}
            live = sum(expiry > self.now for expiry in members.values())
            if kind == "lease":
                assert live <= self.capacity
            elif kind == "long":
                assert live <= self.long_capacity
            elif name == "capped":
                assert live <= self.principal_cap


def test_the_lease_scripts_keep_their_invariants(redis_server: RedisServer) -> None:
    redis_server.start()
    LeaseMachine.url = redis_server.url
    run_state_machine_as_test(
        LeaseMachine, settings=settings(max_examples=60, stateful_step_count=50)
    )


_principals = itertools.count()


@settings(max_examples=100)
@given(
    per_minute=st.integers(1, 120),
    steps=st.lists(
        st.one_of(st.integers(0, 3), st.integers(0, 2_000), st.integers(0, 90_000)),
        min_size=1,
        max_size=40,
    ),
)
def test_the_store_takes_rates_exactly_as_rate_limits(
    redis_server: RedisServer, per_minute: int, steps: list[int]
) -> None:
    redis_server.start()
    now = [T0]
    principal = f"p{next(_principals)}"
    limits = RateLimits({principal: per_minute})

    async def run() -> tuple[list[float | None], list[float | None]]:
        store = SharedStore(redis_server.url, instance_id="a", now_ms=lambda: now[0])
        mine: list[float | None] = []
        theirs: list[float | None] = []
        try:
            for step in steps:
                now[0] += step
                mine.append(await store.take_rate(principal, per_minute))
                theirs.append(limits.take(principal, now[0] / 1000))
        finally:
            await store.aclose()
        return mine, theirs

    mine, theirs = asyncio.run(run())
    assert mine == theirs

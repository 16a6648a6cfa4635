"""The shell between one edge's admission and the store it shares with the other edges.

Every edge keeps its own queue, priorities and fair share (:mod:`iop_edge.pool`); the store
(:class:`~iop_edge.shared.store.SharedStore`) is the arbiter of the caps they share. A request
the local scheduler dispatches holds a *lease* in the store before it goes upstream
(:meth:`SharedGate.acquire`: one script, one round trip); a refusal puts it back in its place
(:meth:`PoolScheduler.requeue`) with the store's counts as what is held elsewhere
(:meth:`PoolScheduler.set_elsewhere`), so it comes back only when a slot is free in the store.
Releases are published: every edge hears them and gives the freed slot to its waiters at once.
Every answer of the store carries a version and this edge's own leases among its counts, so
what is held elsewhere is exact as of that answer, and an older answer (answers cross on the
way) is never applied after a newer one; another edge's release message may only lower it.

Background work, one task each: renewing this edge's leases every ``lease_ttl_ms / 3``
(together with its membership); listening for the others' releases; and, while requests wait,
reading the store's counts every ``min(1 s, lease_ttl_ms / 4)`` — how a dead edge's expired
leases are seen. A lease the store no longer holds (it expired: this edge could not renew it in
time) is *lost*: its request is stopped (:meth:`Lease.lose`).

The store out of reach (an error or a call past its bound): ``on_store_down: static_split``
gives this edge ``floor(capacity / members)`` of each provider (members: the last count it
saw; what the other members were last seen holding over their share stays reserved for
``lease_ttl_ms``, as long as the store would have counted it — kept for the whole outage, the
edges' views of different moments could leave none of them a slot), ``reject`` refuses
new dispatches ``store_unavailable``. Every ``lease_ttl_ms / 3`` it tries the store again; when
it answers, the releases that could not be sent are sent, the leases held are written back, and
after one more renewal period (so that every edge has written its own back) the store's counts
rule again — never a burst over the cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from iop_edge.pool import PoolPolicy, ProviderKey, SharedPolicy
from iop_edge.runtime.logs import Logger, get_logger
from iop_edge.shared.refusal import StoreRefusal
from iop_edge.shared.store import (
    Grant,
    LeaseRef,
    Released,
    SharedStore,
    StoreStatistics,
    StoreUnavailable,
    StoreView,
)

if TYPE_CHECKING:
    from iop_edge.admission import AdmissionScheduler, Lease
    from iop_edge.seams import Clock

__all__ = ["GateStatistics", "SharedGate", "StoreRefusal"]

StoreState = Literal["up", "down", "recovering"]

#: The longest wait between two reads of the store's counts while requests wait here.
_RESYNC_MAX: Final = 1.0


@dataclass(frozen=True, slots=True)
class ProviderShare:
    """One provider as the store counts it: every edge's leases, and this edge's."""

    node_id: str
    provider_id: str
    held: int
    long_held: int
    mine: int
    long_mine: int


@dataclass(frozen=True, slots=True)
class GateStatistics:
    """The shared pool as this edge sees it, for the status and the metrics.

    ``state``: ``up`` (the store's counts rule), ``down`` (out of reach: ``on_store_down``
    rules) or ``recovering`` (back, the split still kept for one renewal period).
    ``members``: the live edges at the last heartbeat. ``refused``: dispatches the store
    refused (the request waited again); ``lost``: leases the store no longer held at a renewal
    (their requests were stopped); ``store``: the client's calls, errors and latencies.
    """

    instance_id: str
    store: str
    state: StoreState
    on_store_down: str
    lease_ttl_ms: int
    members: int
    down_since: float | None
    providers: tuple[ProviderShare, ...]
    leases: int
    refused: int
    lost: int
    store_calls: StoreStatistics


class SharedGate:
    """Leases in the shared store for the dispatches of one :class:`AdmissionScheduler`.

    Made with the store and the shared policy; :meth:`attach` ties it to its admission (which
    calls :meth:`acquire`, :meth:`released`, :meth:`take_rate` and :meth:`policy_changed`);
    :meth:`start` from the running loop; :meth:`aclose` at the end (releases are sent, the
    membership left).
    """

    def __init__(
        self,
        store: SharedStore,
        policy: SharedPolicy,
        clock: Clock,
        *,
        log: Logger | None = None,
    ) -> None:
        self._log = log if log is not None else get_logger()
        self._store = store
        self._shared = policy
        self._clock = clock
        self._admission: AdmissionScheduler | None = None
        self._seq = itertools.count(1)
        self._names: dict[ProviderKey, str] = {}
        self._keys: dict[str, ProviderKey] = {}
        self._limits: dict[ProviderKey, tuple[int, int]] = {}
        self._caps: Mapping[str, int] = {}
        self._per_minute: Mapping[str, int] = {}
        #: lease id -> (its ref, its lease) for every lease this edge holds in the store
        self._held: dict[str, tuple[LeaseRef, Lease]] = {}
        self._mine: Counter[ProviderKey] = Counter()
        self._long_mine: Counter[ProviderKey] = Counter()
        self._principal_mine: Counter[str] = Counter()
        self._counts: dict[ProviderKey, tuple[int, int]] = {}
        self._held_by: dict[ProviderKey, Mapping[str, int]] = {}
        #: the version of the counts last applied, per provider and per principal
        self._versions: dict[ProviderKey, int] = {}
        self._principal_versions: dict[str, int] = {}
        #: what the others hold, as last applied (what admission has while the store rules)
        self._elsewhere: dict[ProviderKey, tuple[int, int]] = {}
        self._principal_elsewhere: dict[str, int] = {}
        self._unsent: list[LeaseRef] = []  # releases the store did not take (it was down)
        self._state: StoreState = "up"
        self._down_since: float | None = None
        self._reserve_lapsed = False  # (down past lease_ttl_ms: the others' excess expired)
        self._recovered_at: float | None = None
        self._members = 0  # (0: none seen yet)
        self._refused = 0
        self._lost = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._sends: set[asyncio.Task[None]] = set()
        self._waiting = asyncio.Event()

    # -- wiring ------------------------------------------------------------------------------

    @property
    def instance_id(self) -> str:
        """This edge's id among the members (the prefix of its lease ids)."""
        return self._store.instance_id

    def attach(self, admission: AdmissionScheduler) -> None:
        """Serve ``admission`` (its policy read now and at each :meth:`policy_changed`)."""
        self._admission = admission
        self.policy_changed(admission.policy)
        admission.set_rate_share(None)

    def policy_changed(self, policy: PoolPolicy) -> None:
        """The pool's policy changed live: capacities, caps and rates are read again (a
        static split is computed again from them)."""
        # A model route's slots (provider id "route:MODEL") are not in the pool: per edge.
        self._names = {
            p.key: f"{p.node_id}/{p.provider_id}"
            for p in policy.providers
            if not p.provider_id.startswith("route:")
        }
        self._keys = {name: key for key, name in self._names.items()}
        self._limits = {
            p.key: (p.capacity, p.long_context_capacity)
            for p in policy.providers
            if p.key in self._names
        }
        self._caps = policy.caps
        self._per_minute = policy.per_minute
        if policy.shared is not None:
            self._shared = policy.shared
        if self._state != "up" and self._admission is not None:
            self._split()

    async def start(self) -> None:
        """Join the members (if the store answers) and start the background tasks."""
        try:
            await self._store.connect()
            self._members = await self._store.heartbeat(self._shared.lease_ttl_ms)
            await self._resync()
        except StoreUnavailable as exc:
            self._went_down(exc)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._renew_loop()),
            loop.create_task(self._listen_loop()),
            loop.create_task(self._resync_loop()),
        ]

    async def aclose(self) -> None:
        """Stop the background tasks, send what is left to release, leave the members."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._sends:
            await asyncio.gather(*self._sends, return_exceptions=True)
        with contextlib.suppress(StoreUnavailable):
            await self._flush_unsent()
            await self._store.leave()
        await self._store.aclose()

    # -- the request path --------------------------------------------------------------------

    async def acquire(self, lease: Lease) -> bool:
        """Hold ``lease`` (just dispatched here) in the store. ``False``: the store refused
        it (full elsewhere); the counts it answered are set as held elsewhere before return.
        Raises :class:`StoreRefusal` when the store is out of reach and ``on_store_down`` is
        ``reject``. With the store down and ``static_split``, granted while it fits the split.
        """
        admission = self._admission
        assert admission is not None
        key = lease.key
        name = self._names.get(key)
        if name is None:
            return True  # (a model route: its capacity is this edge's own)
        if self._state == "down" and self._shared.on_store_down == "reject":
            raise StoreRefusal(self._down_message())
        principal = lease.principal if lease.principal in self._caps else None
        ref = LeaseRef(
            f"{self._store.instance_id}:{next(self._seq)}",
            name,
            lease.long_context,
            principal,
        )
        if self._state == "down":
            # The split decides; the lease is written to the store when it is back.
            if not admission.within(lease):
                return False
            self._hold(ref, lease)
            return True
        capacity, long_capacity = self._limits[key]
        try:
            grant = await self._store.acquire(
                ref,
                capacity=capacity,
                long_capacity=long_capacity,
                principal_cap=None if principal is None else self._caps[principal],
                ttl_ms=self._shared.lease_ttl_ms,
            )
        except asyncio.CancelledError:
            # The script may have run: release the id (a no-op if it did not).
            self._send_release(ref)
            raise
        except StoreUnavailable as exc:
            self._went_down(exc)
            return await self.acquire(lease)
        if grant.granted:
            self._hold(ref, lease)
        else:
            self._refused += 1
            self._waiting.set()
        self._counted(key, grant, principal)
        return grant.granted

    def _hold(self, ref: LeaseRef, lease: Lease) -> None:
        self._held[ref.lease_id] = (ref, lease)
        key = lease.key
        self._mine[key] += 1
        if ref.long:
            self._long_mine[key] += 1
        if ref.principal is not None:
            self._principal_mine[ref.principal] += 1
        lease.ticket = ref.lease_id

    def released(self, lease: Lease) -> None:
        """``lease`` was released here: its store lease goes too (sent in the background)."""
        ticket = lease.ticket
        if ticket is None:
            return
        held = self._held.pop(ticket, None)
        if held is None:
            return
        ref = held[0]
        key = lease.key
        self._mine[key] -= 1
        if ref.long:
            self._long_mine[key] -= 1
        if ref.principal is not None:
            self._principal_mine[ref.principal] -= 1
        self._send_release(ref)

    async def take_rate(self, principal: str) -> float | None:
        """Take one of ``principal``'s requests a minute in the store: ``None`` when it may
        go (or it has no such limit), else the seconds until it may. With the store down, the
        scheduler's own split of the rate decides (``None`` here)."""
        limit = self._per_minute.get(principal)
        if limit is None or self._state != "up":
            return None
        try:
            return await self._store.take_rate(principal, limit)
        except StoreUnavailable as exc:
            self._went_down(exc)
            return None

    def wake(self) -> None:
        """A request waits here: the store's counts are read again soon (a dead edge's
        expired leases free slots no release announces)."""
        self._waiting.set()

    def rated(self, principal: str) -> bool:
        """Whether ``principal``'s rate is counted in the store (a cheap check first)."""
        return principal in self._per_minute

    # -- views -------------------------------------------------------------------------------

    def statistics(self) -> GateStatistics:
        """The shared pool as this edge sees it now."""
        providers = tuple(
            ProviderShare(
                key[0],
                key[1],
                *self._counts.get(key, (0, 0)),
                self._mine[key],
                self._long_mine[key],
            )
            for key in self._names
        )
        return GateStatistics(
            instance_id=self._store.instance_id,
            store=self._store.redacted_url,
            state=self._state,
            on_store_down=self._shared.on_store_down,
            lease_ttl_ms=self._shared.lease_ttl_ms,
            members=self._members,
            down_since=self._down_since,
            providers=providers,
            leases=len(self._held),
            refused=self._refused,
            lost=self._lost,
            store_calls=self._store.statistics(),
        )

    # -- counts ------------------------------------------------------------------------------

    def _counted(self, key: ProviderKey, answer: Grant | Released, principal: str | None) -> None:
        """The store answered this edge's own acquire or release: its counts, its version and
        this edge's leases among them (``mine``) say exactly what the others held then. An
        answer older than one applied already (answers cross on the way) changes nothing."""
        mine = answer.mine
        assert mine is not None
        providers: dict[ProviderKey, tuple[int, int]] = {}
        if answer.version > self._versions.get(key, -1):
            self._versions[key] = answer.version
            self._counts[key] = (answer.held, answer.long_held)
            providers[key] = (answer.held - mine[0], answer.long_held - mine[1])
        principals: dict[str, int] = {}
        if principal is not None and answer.version > self._principal_versions.get(principal, -1):
            self._principal_versions[principal] = answer.version
            principals[principal] = answer.principal_held - mine[2]
        self._elsewhere_now(providers, principals)

    def _on_release(self, released: Released) -> None:
        """Another edge released a lease (its message): a slot may be free. What this edge held
        at that moment is not in the message, so the message may only lower what is held
        elsewhere — an edge's own answers and the views say it exactly."""
        key = self._keys.get(released.provider)
        if key is None or released.instance == self._store.instance_id:
            return  # (this edge's own: its release's answer was applied)
        providers: dict[ProviderKey, tuple[int, int]] = {}
        if released.version > self._versions.get(key, -1):
            self._versions[key] = released.version
            self._counts[key] = (released.held, released.long_held)
            general, long = self._elsewhere.get(key, (0, 0))
            providers[key] = (
                min(general, max(0, released.held - self._mine[key])),
                min(long, max(0, released.long_held - self._long_mine[key])),
            )
        principals: dict[str, int] = {}
        ref = released.principal
        if ref is not None and released.version > self._principal_versions.get(ref, -1):
            self._principal_versions[ref] = released.version
            held = max(0, released.principal_held - self._principal_mine[ref])
            principals[ref] = min(self._principal_elsewhere.get(ref, 0), held)
        self._elsewhere_now(providers, principals)

    def _apply_view(self, view: StoreView) -> None:
        """A view: every count, exact at its version, this edge's leases named in it."""
        self._members = max(view.members, 1)
        me = self._store.instance_id
        providers: dict[ProviderKey, tuple[int, int]] = {}
        for name, seen in view.providers.items():
            key = self._keys.get(name)
            if key is None:
                continue
            self._held_by[key] = seen.held_by
            if view.version > self._versions.get(key, -1):
                self._versions[key] = view.version
                self._counts[key] = (seen.held, seen.long_held)
                providers[key] = (
                    seen.held - seen.held_by.get(me, 0),
                    seen.long_held - seen.long_mine,
                )
        principals: dict[str, int] = {}
        for ref, held in view.principals.items():
            if view.version > self._principal_versions.get(ref, -1):
                self._principal_versions[ref] = view.version
                principals[ref] = held - view.principals_mine.get(ref, 0)
        self._elsewhere_now(providers, principals)

    def _elsewhere_now(
        self, providers: dict[ProviderKey, tuple[int, int]], principals: dict[str, int]
    ) -> None:
        """Keep what is held elsewhere, and tell admission while the store's counts rule."""
        if not (providers or principals):
            return
        self._elsewhere.update(providers)
        self._principal_elsewhere.update(principals)
        if self._state == "up":
            assert self._admission is not None
            self._admission.set_elsewhere(providers, principals)

    async def _resync(self) -> None:
        view = await self._store.view(self._names.values(), list(self._caps))
        self._apply_view(view)

    # -- the store down and back -------------------------------------------------------------

    def _went_down(self, exc: StoreUnavailable) -> None:
        if self._state == "down":
            return
        self._state = "down"
        self._down_since = self._clock.now()
        self._recovered_at = None
        self._reserve_lapsed = False
        self._log.warning(
            "shared_store_down",
            store=self._store.redacted_url,
            error=str(exc),
            on_store_down=self._shared.on_store_down,
            members=self._members,
        )
        self._split()

    def _split(self) -> None:
        """Hold this edge to its static split: for each provider, what the other members
        may hold is reserved — each its share, or what it was last seen holding if more,
        until the store would have let those leases expire (:meth:`_still_down`)."""
        admission = self._admission
        assert admission is not None
        me = self._store.instance_id
        # The members: as many as the last heartbeat counted, or as many edges as were seen
        # holding leases, if more (one started since).
        seen = {i for held_by in self._held_by.values() for i, n in held_by.items() if n}
        members = max(self._members, len(seen | {me})) if self._members else 0
        providers: dict[ProviderKey, tuple[int, int]] = {}
        for key, (capacity, long_capacity) in self._limits.items():
            if members < 1:
                providers[key] = (capacity, long_capacity)  # no membership seen: nothing
                continue
            share = capacity // members
            long_share = long_capacity // members
            held_by = self._held_by.get(key, {})
            others = [n for instance, n in held_by.items() if instance != me]
            seen_elsewhere = self._counts.get(key, (0, 0))[0] - self._mine[key]
            reserve = sum(max(n, share) for n in others) + share * (members - 1 - len(others))
            reserve += max(0, seen_elsewhere - sum(others))  # (taken since the last view)
            if self._reserve_lapsed:
                reserve = share * (members - 1)
            providers[key] = (
                min(capacity, max(capacity - share, reserve)),
                long_capacity - long_share,
            )
        principals = {
            ref: cap - max(1, cap // members) if members >= 1 else cap
            for ref, cap in self._caps.items()
        }
        admission.set_elsewhere(providers, principals)
        admission.set_rate_share(max(members, 1))

    async def _came_back(self) -> None:
        """The store answers again: send the releases it missed, write back the leases held
        here, and keep the split one more renewal period (the other edges write theirs)."""
        self._members = await self._store.heartbeat(self._ttl_ms)  # (it answers: go on)
        await self._flush_unsent()
        # From here a new lease goes to the store itself (the split still bounds this edge):
        # one taken while the leases are written back is in the store as well.
        self._state = "recovering"
        self._recovered_at = self._clock.now()
        await self._store.reassert([ref for ref, _ in self._held.values()], self._ttl_ms)
        self._log.info(
            "shared_store_back",
            store=self._store.redacted_url,
            down_s=round(self._recovered_at - (self._down_since or 0.0), 3),
            leases_written_back=len(self._held),
        )

    def _resume(self) -> None:
        assert self._admission is not None
        self._state = "up"
        self._down_since = self._recovered_at = None
        self._admission.set_rate_share(None)

    def _down_message(self) -> str:
        return (
            f"the shared store {self._store.redacted_url} is out of reach and "
            "provider_pool.shared.on_store_down is reject"
        )

    async def _flush_unsent(self) -> None:
        while self._unsent:
            ref = self._unsent.pop()
            try:
                await self._store.release(ref)
            except BaseException:
                self._unsent.append(ref)  # (sent again at the next try)
                raise

    # -- background ----------------------------------------------------------------------------

    @property
    def _ttl_ms(self) -> int:
        return self._shared.lease_ttl_ms

    def _send_release(self, ref: LeaseRef) -> None:
        if self._state == "down":
            self._unsent.append(ref)
            return
        task = asyncio.get_running_loop().create_task(self._release(ref))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _release(self, ref: LeaseRef) -> None:
        try:
            released = await self._store.release(ref)
        except StoreUnavailable as exc:
            self._unsent.append(ref)
            self._went_down(exc)
            return
        key = self._keys.get(released.provider)
        if key is not None:
            self._counted(key, released, released.principal)

    async def _renew_loop(self) -> None:
        while True:
            await _sleep(self._clock, self._ttl_ms / 3000)
            try:
                await self._renew_once()
            except StoreUnavailable as exc:
                self._went_down(exc)
                self._still_down()

    def _still_down(self) -> None:
        """Down for ``lease_ttl_ms`` now: the leases the other members were last seen holding
        over their share would have expired in the store, as a dead member's do — each member
        is reserved its share only from now on."""
        if self._reserve_lapsed or self._state != "down" or self._down_since is None:
            return
        if self._clock.now() - self._down_since < self._ttl_ms / 1000:
            return
        self._reserve_lapsed = True
        self._split()

    async def _renew_once(self) -> None:
        if self._state == "down":
            await self._came_back()
            return
        if self._state == "recovering":
            self._resume()
            await self._resync()
        self._members = await self._store.heartbeat(self._ttl_ms)
        refs = [ref for ref, _ in self._held.values()]
        if not refs:
            return
        for lease_id in await self._store.renew(refs, self._ttl_ms):
            held = self._held.get(lease_id)
            if held is None:
                continue  # (released meanwhile)
            self._lost += 1
            self._log.warning("shared_lease_lost", lease=lease_id, provider=held[0].provider)
            held[1].lose(
                "the shared pool's store no longer counts this request's lease (its edge could "
                "not renew it within provider_pool.shared.lease_ttl_ms); the request was "
                "stopped, retry it"
            )

    async def _listen_loop(self) -> None:
        while True:
            try:
                await self._store.listen(self._on_release, on_subscribed=self._listening)
            except StoreUnavailable as exc:
                self._went_down(exc)
            await _sleep(self._clock, self._ttl_ms / 3000)

    def _listening(self) -> None:
        self._waiting.set()  # (a resync: releases before the subscription were not heard)

    async def _resync_loop(self) -> None:
        period = min(_RESYNC_MAX, self._ttl_ms / 4000)
        while True:
            admission = self._admission
            assert admission is not None
            if not admission.queue_depth:
                self._waiting.clear()
                await self._waiting.wait()
            await _sleep(self._clock, period)
            if self._state != "up":
                continue
            try:
                await self._resync()
            except StoreUnavailable as exc:
                self._went_down(exc)


async def _sleep(clock: Clock, seconds: float) -> None:
    """Wait ``seconds`` on ``clock`` (a test's fake clock moves it by hand)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    cancel = clock.call_at(clock.now() + seconds, wake)
    try:
        await done
    finally:
        cancel()

"""The scheduler's mutable bookkeeping: provider slots, model groups and their candidate indexes.

Internal to :mod:`iop_edge.pool`; the public view of it is :meth:`PoolScheduler.statistics`.

Choosing a candidate must not cost a scan of the group, so each :class:`ModelGroup` keeps two
lazy heaps (general, long) of its members that have a free slot of that kind, keyed by the
selection order of SPEC §5: ``(in_flight, priority, rotation stamp)``. The rotation stamp is the
group's tick when it last chose that member (never-chosen members keep config order), so among
equals the least recently chosen member wins: round-robin per model group, stable and fair.
Every change to a provider bumps the version of its memberships and re-offers them; heap entries
with an old version are dropped when they surface.

A remote provider (its node reaches the edge over a node link) is ``connected`` only while that
link is up. A disconnected provider stays a member of its groups (their requests queue for it)
but is no candidate, takes no part in a panic and is not waited for by a request failing over.
The candidate paths test one flag, ``serving`` (enabled *and* connected), where they tested
``enabled`` before: a local provider is always connected, so it costs them nothing.
"""

from __future__ import annotations

import heapq

from iop_edge.pool.decisions import RequestQueue
from iop_edge.pool.fair import FairQueue
from iop_edge.pool.health import ProviderHealth
from iop_edge.pool.policy import ProviderKey, ProviderPolicy

HeapEntry = tuple[int, int, int, int, "Membership"]


class ProviderSlot:
    """The live slot counts of one provider resource and its current policy.

    A slot record outlives its provider's removal from the policy while leases still hold it
    (``in_policy`` false), so those leases release into the right counters. ``health`` is its
    :class:`ProviderHealth`; ``usable`` caches ``health.usable`` (read on every offer), kept
    in step by the scheduler. ``retry_on``: the retry classes its failures fail over on.
    ``remote``: its node is reached over a node link; ``connected``: that link is up (always,
    for a local provider; a remote one starts disconnected). ``serving`` caches ``enabled and
    connected``: whether it can be a candidate at all (see the module docstring).

    ``capacity`` / ``long_capacity`` are what this scheduler may fill: the policy's
    (``configured`` / ``long_configured``) less the leases held ``elsewhere`` /
    ``long_elsewhere`` (by the other edges sharing the pool, or a static split's reserve:
    :meth:`PoolScheduler.set_elsewhere`); without a shared pool nothing is held elsewhere and
    they are the policy's, so the candidate paths compare one number as before.
    """

    __slots__ = (
        "capacity",
        "configured",
        "connected",
        "elsewhere",
        "enabled",
        "health",
        "in_flight",
        "in_policy",
        "key",
        "long_capacity",
        "long_configured",
        "long_elsewhere",
        "long_in_flight",
        "memberships",
        "priority",
        "remote",
        "retry_on",
        "serving",
        "usable",
    )

    def __init__(self, policy: ProviderPolicy) -> None:
        self.key: ProviderKey = policy.key
        self.in_flight = 0
        self.long_in_flight = 0
        self.memberships: list[Membership] = []
        self.elsewhere = self.long_elsewhere = 0
        self.configured = self.capacity = policy.capacity
        self.long_configured = self.long_capacity = policy.long_context_capacity
        self.priority = policy.priority
        self.retry_on = policy.retry_on
        self.enabled = policy.enabled
        self.remote = policy.remote
        self.connected = not policy.remote
        self.serving = self.enabled and self.connected
        self.in_policy = True
        self.health = ProviderHealth(policy.probe)
        self.usable = True

    def update(self, policy: ProviderPolicy, connected: bool) -> None:
        """Take the new policy of this provider; the counts are kept, and so is its health
        unless it was disabled or removed: then it starts ``unknown`` again. ``connected``:
        whether its node link is up (the scheduler knows; always true for a local provider)."""
        if not self.enabled and policy.enabled:
            self.health = ProviderHealth(policy.probe)
            self.usable = True
        self.configured = policy.capacity
        self.long_configured = policy.long_context_capacity
        self._fill()
        self.priority = policy.priority
        self.retry_on = policy.retry_on
        self.enabled = policy.enabled
        self.remote = policy.remote
        self.in_policy = True
        if connected is not self.connected:
            self.set_connected(connected)  # (only if remote changed: links are per node)
        self.serving = self.enabled and self.connected

    def set_elsewhere(self, general: int, long: int) -> None:
        """The leases held on this provider elsewhere: by the other edges sharing the pool."""
        self.elsewhere = general
        self.long_elsewhere = long
        self._fill()

    def _fill(self) -> None:
        self.capacity = max(0, self.configured - self.elsewhere)
        self.long_capacity = max(0, self.long_configured - self.long_elsewhere)

    def set_connected(self, connected: bool) -> None:
        """Its node link went down or came back: what was known of its health no longer
        holds, so it starts over (``unknown``) either way."""
        self.connected = connected
        self.serving = self.enabled and connected
        self.health = self.health.renewed()
        self.usable = True

    def retire(self) -> None:
        """The provider left the policy: it is no candidate any more, its leases still count."""
        self.enabled = False
        self.serving = False
        self.in_policy = False
        self.memberships = []

    def can_serve(self, long_context: bool) -> bool:
        """Whether a request of that kind could take a slot here now."""
        return (
            self.serving
            and self.in_flight < self.capacity
            and (not long_context or self.long_in_flight < self.long_capacity)
        )

    def changed(self) -> None:
        """Re-offer this provider to its groups after its counts or policy changed."""
        for membership in self.memberships:
            membership.version += 1
            membership.group.offer(membership)


class Membership:
    """One provider's place in one model group: its rotation stamp and index version."""

    __slots__ = ("group", "slot", "stamp", "version")

    def __init__(self, group: ModelGroup, slot: ProviderSlot, stamp: int) -> None:
        self.group = group
        self.slot = slot
        self.stamp = stamp
        self.version = 0


class ModelGroup:
    """A model group: its enabled members, their candidate heaps, and its pending queues.

    ``queues[False]`` holds general requests, ``queues[True]`` long-context ones; ``retries``
    the requests failing over (either kind), served before both. The queues and the rotation
    counters survive policy swaps (they move to the group's new record), so rotation stamps
    stay unique within a group: chosen members get ``tick`` values (>= 0), new members
    ``fresh`` ones (far below 0, increasing), which puts them first among equals. ``panic``:
    every connected member is out (ejected or held), so health is ignored and every connected
    member is a candidate (a group whose members are all disconnected is not in panic).
    """

    __slots__ = ("fresh", "group_id", "heaps", "members", "panic", "queues", "retries", "tick")

    def __init__(
        self,
        group_id: str,
        queues: tuple[FairQueue, FairQueue],
        retries: RequestQueue,
        tick: int = 0,
        fresh: int = -(1 << 62),
    ) -> None:
        self.group_id = group_id
        self.members: list[Membership] = []
        self.heaps: tuple[list[HeapEntry], list[HeapEntry]] = ([], [])
        self.queues = queues
        self.retries = retries
        self.tick = tick
        self.fresh = fresh
        self.panic = False

    def all_queues(self) -> tuple[FairQueue, FairQueue, RequestQueue]:
        """The general, long-context and failover queues."""
        return (*self.queues, self.retries)

    def admits(self, slot: ProviderSlot) -> bool:
        """Whether health lets a new request of this group go to ``slot`` now."""
        return slot.usable or self.panic

    def update_panic(self) -> bool:
        """Recompute :attr:`panic` from the connected members' health; return whether it
        changed."""
        panic = False
        for membership in self.members:
            slot = membership.slot
            if slot.connected:
                if not slot.health.out:
                    panic = False
                    break
                panic = True
        changed = panic is not self.panic
        self.panic = panic
        return changed

    def add_member(self, slot: ProviderSlot, stamp: int | None) -> None:
        """Add an enabled provider; ``stamp`` carries its rotation place over a policy swap."""
        if stamp is None:
            # New here: before every chosen member, and in config order among the new ones.
            stamp = self.fresh
            self.fresh += 1
        membership = Membership(self, slot, stamp)
        self.members.append(membership)
        slot.memberships.append(membership)
        self.offer(membership)

    def offer(self, membership: Membership) -> None:
        """Index ``membership`` under its current counts, in each heap whose slot kind is free."""
        slot = membership.slot
        if not slot.serving or slot.in_flight >= slot.capacity or not (slot.usable or self.panic):
            return
        entry = (slot.in_flight, slot.priority, membership.stamp, membership.version, membership)
        heaps = self.heaps
        self._push(heaps[0], entry)
        if slot.long_in_flight < slot.long_capacity:
            self._push(heaps[1], entry)

    def _push(self, heap: list[HeapEntry], entry: HeapEntry) -> None:
        heapq.heappush(heap, entry)
        if len(heap) > 2 * len(self.members) + 16:
            # Stale entries pile up under churn: keep only the current ones (amortized O(1)).
            live = [e for e in heap if e[3] == e[4].version]
            heapq.heapify(live)
            heap[:] = live

    def best_candidate(self, long_context: bool) -> Membership | None:
        """The member a new request of that kind goes to, or ``None`` if no slot is free.

        Lowest ``in_flight``, then lowest ``priority`` number, then least recently chosen.
        """
        heap = self.heaps[long_context]
        while heap:
            entry = heap[0]
            if entry[3] == entry[4].version:
                return entry[4]
            heapq.heappop(heap)
        return None

    def best_untried(self, long_context: bool, tried: frozenset[ProviderKey]) -> Membership | None:
        """:meth:`best_candidate` among the members not in ``tried`` (a failing-over request;
        rare enough for a scan of the group)."""
        best: Membership | None = None
        best_rank: tuple[int, int, int] | None = None
        for membership in self.members:
            slot = membership.slot
            if slot.key in tried or not slot.can_serve(long_context) or not self.admits(slot):
                continue
            rank = (slot.in_flight, slot.priority, membership.stamp)
            if best_rank is None or rank < best_rank:
                best, best_rank = membership, rank
        return best

    def has_untried(self, tried: frozenset[ProviderKey]) -> bool:
        """Whether a member not in ``tried`` could take the request once a slot frees up (a
        disconnected one cannot: a request failing over does not wait for a link)."""
        return any(
            m.slot.key not in tried and m.slot.connected and (self.panic or not m.slot.health.out)
            for m in self.members
        )

    def choose(self, membership: Membership) -> None:
        """Record that this group just gave ``membership`` a request (advances the rotation)."""
        membership.stamp = self.tick
        self.tick += 1

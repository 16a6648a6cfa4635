"""The admission scheduler as a sans-IO state machine (SPEC §5, live swaps of SPEC §4).

:class:`PoolScheduler` is synchronous and never reads a clock: every method takes ``now``
(monotonic seconds), changes state and returns the :data:`Decision` list for the shell to act on.

Kept whole (about 900 lines) on purpose: it is one state machine whose queue, slots and health
outbox change together in each method, under invariants the Hypothesis state machines check on
the whole; what has a life of its own already lives beside it (``slots``, ``fair``, ``health``,
``decisions``, ``deadlines``). See docs/architecture.md.

Data structures, chosen so that no operation costs O(pending requests):

- per model group two FIFO :class:`RequestQueue` (general, long-context), with a global
  sequence number (``request_id``) to compare their heads, and lazy removal;
- per model group two candidate heaps (see :mod:`iop_edge.pool.slots`);
- one heap of deadlines, lazily skipping requests that already left.

Invariant (work conservation): no pending request has a free slot it could use. So a new request
whose (group, kind) queue is non-empty queues without looking for a slot, and a freed slot on P
only has to be offered to the heads of the queues of P's groups. A slot goes to the oldest of
those heads that P can serve.

Health (SPEC §5.1, :mod:`iop_edge.pool.health`): each provider slot keeps a
:class:`~iop_edge.pool.health.ProviderHealth`. Attempts report how they ended through
:meth:`PoolScheduler.release` (an outcome) or :meth:`PoolScheduler.fail` (a failure, and — when
the provider's ``retry_on`` lists its class — a retry on an untried provider, ahead of every
queued request). Health timers (ejections ending, 429 holds ending, probes due, idle checks once
:meth:`PoolScheduler.start` turned idle probes on) sit in one heap next to the deadlines:
:meth:`next_event` says when to call :meth:`expire`. What the shell must do or log — run a
probe, log an ejection — waits in an outbox read with :meth:`take_events`. A model's panic is
reported under its own group only (never its derived groups': ``PoolPolicy.derived``).

Remote providers (``ProviderPolicy.remote``: their node dials the edge over a node link) are
candidates only while their link is up, which the shell reports with
:meth:`PoolScheduler.set_connected`. A disconnected provider stays a member (requests for it
queue, so a node back within ``queue_timeout_ms`` loses nothing), but nothing is dispatched to
it, a panic counts connected members only, a request failing over does not wait for it, and
its health timers and probes stop; its health starts over, ``unknown``, when the link is back,
and it is refilled at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Final, Literal

from iop_edge.pool.deadlines import DeadlineHeap, HealthTimers
from iop_edge.pool.decisions import (
    Decision,
    Dispatch,
    Failover,
    PendingRequest,
    Rejection,
    RejectReason,
    RequestQueue,
    RequestState,
    SlotLease,
    Submission,
)
from iop_edge.pool.fair import ANONYMOUS, FairQueue, PrincipalBook, service_key
from iop_edge.pool.health import OK, Failure, HealthEvent, Outcome
from iop_edge.pool.policy import PoolPolicy, ProviderKey, may_retry
from iop_edge.pool.rates import RateLimits
from iop_edge.pool.slots import Membership, ModelGroup, ProviderSlot
from iop_edge.pool.statistics import (
    REJECTION_COUNTERS,
    GroupStatistics,
    PoolStatistics,
    PrincipalStatistics,
    provider_statistics,
)

PROBE: Final = "probe"
"""An outbox entry asking the shell to probe a provider (then call :meth:`PoolScheduler.probed`)."""

Notice = tuple[ProviderKey, HealthEvent | Literal["probe"]] | tuple[str, HealthEvent]
"""An outbox entry: a provider's health event or probe request, or a model group's panic."""


class PoolScheduler:
    """Admits requests onto provider slots, queues the rest, and swaps its policy live.

    Candidates of a request are the enabled (and connected) providers of its model group with
    a free slot of the needed kind that health lets in (not ejected or held, unless the group
    is in panic); the lowest ``in_flight`` wins, then the lowest ``priority`` number, then
    the least recently chosen by that group. Without a free candidate the request queues if
    fewer than ``max_queue`` are pending; a freed slot goes to the oldest pending request its
    provider can serve.
    """

    def __init__(self, policy: PoolPolicy) -> None:
        self._policy = policy
        self._max_queue = policy.max_queue
        self._timeout = policy.queue_timeout_s
        self._slots: dict[ProviderKey, ProviderSlot] = {}
        self._retired: dict[ProviderKey, ProviderSlot] = {}
        self._groups: dict[str, ModelGroup] = {}
        self._deadlines = DeadlineHeap()
        self._health_timers = HealthTimers()
        self._events: list[Notice] = []
        self._failovers = 0
        self._pending = 0
        self._retrying = 0  # of ``_pending``, the requests failing over
        self._unparked: list[FairQueue] = []  # queues whose capped principal fell under its cap
        self._last_id = 0
        self._submitted = 0
        self._admitted = 0
        self._released = 0
        self._double_releases = 0
        self._inherited = 0
        self._handed_over = False
        self._idle_probes = False
        self._nodes_up: set[str] = set()  # the remote nodes whose link is up (set_connected)
        self._rejected = dict.fromkeys(REJECTION_COUNTERS, 0)
        self._book = PrincipalBook(
            policy.weights, policy.caps, policy.fair_share, queue_caps=policy.queue_caps
        )
        self._capped = bool(policy.caps)
        for name in policy.principals:
            self._book.share(name)
        self._rates = RateLimits(policy.per_minute)
        self._rated = bool(policy.per_minute)
        self._rate_share: int | None = 1  # (set_rate_share: None, the store takes the rates)
        self._install(policy)

    @property
    def policy(self) -> PoolPolicy:
        """The policy in force."""
        return self._policy

    @property
    def queue_depth(self) -> int:
        """How many requests are pending."""
        return self._pending

    # -- operations -------------------------------------------------------------------------

    def submit(
        self,
        group_id: str,
        *,
        long_context: bool = False,
        now: float,
        principal: str = ANONYMOUS,
        submitted_at: float | None = None,
        over_rate: float | None = None,
    ) -> Submission:
        """Submit a request of ``principal`` for model group ``group_id``: dispatch it, queue
        it or refuse it.

        Refusals: unknown group → ``model_not_found``; no enabled provider →
        ``no_available_provider``; no free candidate and ``max_queue`` pending →
        ``queue_full``. A queued request gets ``deadline = now + queue_timeout``.
        ``over_rate``: the shared store found the principal over its
        ``max_requests_per_minute`` (the seconds until it may send again): refused
        ``rate_limit_exceeded`` (see :meth:`set_rate_share`).
        """
        decisions = self._expire_due(now)
        self._last_id += 1
        arrived = now if submitted_at is None else submitted_at
        request = PendingRequest(self._last_id, group_id, long_context, arrived)
        share = request.share = self._book.share(principal)
        self._submitted += 1
        group = self._groups.get(group_id)
        if self._handed_over:
            decisions.append(self._reject(request, RejectReason.HANDED_OVER, _HANDED_OVER))
        elif group is None:
            decisions.append(
                self._reject(
                    request,
                    RejectReason.MODEL_NOT_FOUND,
                    f"model group {group_id!r} does not exist",
                )
            )
        elif not group.members:
            decisions.append(
                self._reject(
                    request,
                    RejectReason.NO_AVAILABLE_PROVIDER,
                    f"model group {group_id!r} has no enabled provider",
                )
            )
        elif over_rate is not None or (
            self._rated and (wait := self._rates.take(principal, now)) is not None
        ):
            if over_rate is not None:
                wait = over_rate
            decisions.append(
                self._reject(
                    request,
                    RejectReason.RATE_LIMIT_EXCEEDED,
                    f"principal {principal!r} is over its max_requests_per_minute "
                    f"({self._policy.per_minute.get(principal)}); the next request is allowed in "
                    f"{wait:.3f} s",
                    retry_after=wait,
                )
            )
        else:
            queue = group.queues[long_context]
            # Work conservation: a queue of this kind with a request to serve means no slot is
            # free for it; a principal at its cap waits whatever is free.
            if self._capped:
                # A queue whose every request is of a capped principal serves nobody now.
                blocked = (queue.live and queue.head() is not None) or not share.eligible
            else:
                blocked = bool(queue.live)
            membership = None if blocked else group.best_candidate(long_context)
            if membership is not None:
                decisions.append(self._dispatch(request, membership, now))
            elif (cap := share.max_queued) is not None and share.queued >= cap:
                decisions.append(
                    self._reject(
                        request,
                        RejectReason.PRINCIPAL_QUEUE_FULL,
                        f"principal {principal!r} has {share.queued} requests pending, its "
                        f"max_queued is {cap}",
                    )
                )
            elif self._pending >= self._max_queue:
                decisions.append(
                    self._reject(
                        request,
                        RejectReason.QUEUE_FULL,
                        f"the admission queue is full: {self._pending} requests pending, "
                        f"max_queue is {self._max_queue}",
                    )
                )
            else:
                if self._capped and not share.eligible:
                    queue.park(share)  # (before the push: its lane gets no heap entry)
                queue.push(request)
                self._pending += 1
                if self._timeout is not None:
                    request.deadline = arrived + self._timeout
                    self._deadlines.push(request, self._pending)
        return Submission(request, decisions)

    def release(self, lease: SlotLease, now: float, outcome: Outcome = None) -> list[Decision]:
        """Release ``lease`` and hand its slot to the oldest pending request that can use it.

        ``outcome`` tells the provider's health how the attempt ended: :data:`OK` (it
        answered), a :class:`Failure`, or ``None`` (nothing learnt: the client left).
        Releasing twice is a no-op counted in ``double_releases``. A lease on a provider that a
        policy swap removed or disabled is released into the right counts and frees nothing.
        """
        if lease.owner is not self:
            raise ValueError(f"{lease!r} was not granted by this scheduler")
        if lease.released:
            self._double_releases += 1
            return []
        decisions = self._expire_due(now)
        self._release(lease, now, outcome, decisions, None)
        if self._unparked:
            self._serve_unparked(now, decisions)
        return decisions

    def fail(self, lease: SlotLease, failure: Failure, now: float) -> Failover:
        """The attempt holding ``lease`` failed before the client got a byte: release the lease
        (once) with ``failure`` as its outcome, and retry the request on another provider.

        The retry goes ahead of every queued request (it keeps its arrival time, so its deadline
        is unchanged, and ``max_queue`` does not apply: it was accepted already), on a provider
        of its group it has not tried that health lets in; it waits if all of those are busy.
        No retry when the provider's ``retry_on`` does not list the failure's class (a 429
        always fails over), ``max_attempts`` are used up, no untried candidate exists, or the
        request is past its deadline and no slot is free at once: then the failure is the
        answer (and still counts for the provider's health).
        """
        self._check_held(lease)
        request = lease.request
        decisions = self._expire_due(now)
        if may_retry(failure.kind, lease.slot.retry_on):
            retried = self._release(lease, now, failure, decisions, request)
        else:  # (the provider's rule: this failure is the answer)
            request.tried = request.tried | {lease.key}
            retried = self._release(lease, now, failure, decisions, None)
        if self._unparked:
            self._serve_unparked(now, decisions)
        return Failover(request, retried, decisions)

    def probed(self, key: ProviderKey, ok: bool, reason: str | None, now: float) -> list[Decision]:
        """A probe the outbox asked for came back (``reason`` says why it failed)."""
        decisions = self._expire_due(now)
        slot = self._slots.get(key)
        if slot is None or not slot.serving:
            return decisions  # (disabled or disconnected: its health starts over when back)
        event = slot.health.probed(ok, reason, now, self._policy.health)
        if event is not None:
            self._events.append((key, event))
        self._health_changed(slot, now, decisions)
        return decisions

    # -- a pool shared with other edges (the shell's store says what they hold) ----------------

    def set_elsewhere(
        self,
        providers: Mapping[ProviderKey, tuple[int, int]],
        principals: Mapping[str, int],
        now: float,
    ) -> list[Decision]:
        """The leases held elsewhere — by the other edges sharing the pool, or a static
        split's reserve while their store is out of reach — count against capacities here:
        ``providers`` maps a provider to its ``(general, long-context)`` leases held
        elsewhere, ``principals`` a principal to its. A provider or principal not named keeps
        what it had. Slots that this frees go to the pending requests at once; a count that
        grows cancels nothing (as a capacity lowered live)."""
        decisions = self._expire_due(now)
        # (the principals first: a slot freed below goes only to those under their cap now)
        for name, held in principals.items():
            self._unparked.extend(self._book.set_elsewhere(name, held))
        for key, (general, long) in providers.items():
            slot = self._slots.get(key)
            if slot is None:
                continue
            before, long_before = slot.capacity, slot.long_capacity
            slot.set_elsewhere(general, long)
            if slot.capacity == before and slot.long_capacity == long_before:
                continue
            grew = slot.capacity > before or slot.long_capacity > long_before
            if not (grew and self._pending and self._refill(slot, now, decisions)):
                slot.changed()
        if self._unparked:
            self._serve_unparked(now, decisions)
        return decisions

    def within(self, lease: SlotLease) -> bool:
        """Whether ``lease`` fits what this scheduler may fill now (its provider's capacities
        and its principal's cap, less what is held elsewhere): a lease granted before a
        static split may not."""
        slot = lease.slot
        cap = lease.request.share.cap
        return (
            slot.in_flight <= slot.capacity
            and (not lease.long_context or slot.long_in_flight <= slot.long_capacity)
            and (cap is None or lease.request.share.in_flight <= cap)
        )

    def requeue(self, lease: SlotLease, now: float, refusal: str | None = None) -> list[Decision]:
        """The shared store refused ``lease`` (just dispatched): the slot is given back — no
        outcome for the provider's health, not counted as admitted or released — and its
        request goes back into its queue with its place and deadline, to be dispatched again
        when a slot is free here *and* in the store (:meth:`set_elsewhere` says first what the
        store holds, so that it does not come straight back to the same slot).

        ``refusal``: the store cannot be asked (its ``on_store_down`` is ``reject``): the
        request is refused ``store_unavailable`` with that message instead.
        """
        self._check_held(lease)
        request = lease.request
        decisions = self._expire_due(now)
        lease.released = True
        request.lease = None
        self._admitted -= 1
        request.attempts -= 1
        slot = lease.slot
        slot.in_flight -= 1
        if lease.long_context:
            slot.long_in_flight -= 1
        self._unparked.extend(request.share.release())
        health = slot.health
        if health.trial is lease:
            health.trial = None  # (the next request may be the half-open provider's trial)
            slot.usable = health.usable
        request.state = RequestState.PENDING
        group = self._groups.get(request.group_id)
        if refusal is not None or group is None:
            reason = RejectReason.STORE_UNAVAILABLE
            if refusal is None:
                reason = RejectReason.MODEL_NOT_FOUND
                refusal = f"model group {request.group_id!r} was removed by a config change"
            decisions.append(self._reject(request, reason, refusal, config_change=group is None))
        else:
            if request.attempts:
                group.retries.push(request)
                self._retrying += 1
            else:
                group.queues[request.long_context].restore(request)
            self._pending += 1
            if request.deadline is not None:
                self._deadlines.push(request, self._pending)
        if not (self._pending and self._refill(slot, now, decisions)):
            slot.changed()
        if request.queue is not None and request.state is RequestState.PENDING:
            self._redispatch(request, group, now, decisions)
        if self._unparked:
            self._serve_unparked(now, decisions)
        return decisions

    def set_rate_share(self, share: int | None) -> None:
        """Who counts ``max_requests_per_minute``: ``None``, the shared store (this scheduler
        takes no token; :meth:`submit`'s ``over_rate`` carries the store's refusal); ``n``,
        this scheduler with ``1/n`` of each limit (at least 1): 1 alone, ``n`` for a static
        split among ``n`` edges while their store is out of reach."""
        if share == self._rate_share:
            return
        self._rate_share = share
        self._rates = RateLimits(self._rate_limits())
        self._rated = share is not None and bool(self._policy.per_minute)

    def _rate_limits(self) -> dict[str, int]:
        share = self._rate_share or 1
        return {p: max(1, limit // share) for p, limit in self._policy.per_minute.items()}

    def _check_held(self, lease: SlotLease) -> None:
        """Refuse a lease this scheduler did not grant, or one already released."""
        if lease.owner is not self:
            raise ValueError(f"{lease!r} was not granted by this scheduler")
        if lease.released:
            raise ValueError(f"{lease!r} was already released")

    def _redispatch(
        self,
        request: PendingRequest,
        group: ModelGroup | None,
        now: float,
        decisions: list[Decision],
    ) -> None:
        """Dispatch a request just put back at once if another provider of its group is free."""
        if group is None or not request.share.eligible:
            return
        if request.attempts:
            membership = group.best_untried(request.long_context, request.tried)
        elif group.queues[request.long_context].head() is request:
            membership = group.best_candidate(request.long_context)
        else:
            return
        if membership is not None:
            decisions.append(self._dispatch(request, membership, now))

    def start(self, now: float) -> None:
        """Turn idle probes on (the shell, once it runs): from ``now + probe_interval`` every
        enabled provider with a health check is probed while it is idle (see
        :mod:`iop_edge.pool.health`). Before, only ejected providers are probed."""
        if not self._idle_probes:
            self._idle_probes = True
            self._start_idle_probes(now)

    def take_events(self) -> list[Notice]:
        """Empty the outbox: health events to log and probes to run, in order."""
        events, self._events = self._events, []
        return events

    @property
    def has_events(self) -> bool:
        """Whether :meth:`take_events` has something (a cheap check for the hot path)."""
        return bool(self._events)

    def inherit(
        self, key: ProviderKey, *, long_context: bool = False, principal: str, now: float
    ) -> SlotLease | None:
        """Count a slot that another process holds on provider ``key`` for ``principal`` (a
        handover: the process this one takes over from still runs that request), as a lease
        of this scheduler, so that capacity and the principal's caps stay exact while both
        run. Release it with :meth:`release` when the other process reports the request done.

        A provider this policy does not have (or has disabled) is not counted: ``None``. Like
        a capacity lowered live, an inherited lease may take a provider past its capacity; it
        cancels nothing, and new dispatches wait until ``in_flight`` drops below it. Counted
        in ``inherited`` (not ``submitted`` or ``admitted``); its release in ``released``.
        """
        slot = self._slots.get(key)
        if slot is None or not slot.enabled:
            return None
        self._last_id += 1
        request = PendingRequest(self._last_id, "", long_context, now)
        request.share = share = self._book.share(principal)
        share.in_flight += 1
        slot.in_flight += 1
        if long_context:
            slot.long_in_flight += 1
        slot.changed()
        lease = SlotLease(self, request, slot, now)
        request.state = RequestState.DISPATCHED
        request.lease = lease
        self._inherited += 1
        return lease

    def set_connected(self, node_id: str, connected: bool, now: float) -> list[Decision]:
        """The node link of remote node ``node_id`` came up (``connected``) or went down.

        Covers every remote provider of the node (those of the policy, and any a later swap
        adds). Going down: each is no candidate any more, leaves the panic count of its groups
        (the connected members may panic among themselves), and requests failing over that
        only it could still take are refused ``no_available_provider``; queued requests stay
        queued, and leases are kept (their holders release them as usual). Coming up: its
        health starts over, ``unknown``, and its free slots go to the pending requests at
        once. Each provider whose state changes gets a ``connected`` or ``disconnected``
        :class:`HealthEvent` (a disabled one none: it is ``disabled``). A model route's slot
        is never remote (a route has no health: while its node is down it fails at once), and
        a node without remote providers only has its state remembered.
        """
        decisions = self._expire_due(now)
        if connected:
            self._nodes_up.add(node_id)
        else:
            self._nodes_up.discard(node_id)
        event = HealthEvent("connected" if connected else "disconnected")
        for slot in (*self._slots.values(), *self._retired.values()):
            if slot.remote and slot.key[0] == node_id and slot.connected is not connected:
                slot.set_connected(connected)
                if slot.enabled:  # (not disabled, nor removed and still leased)
                    self._events.append((slot.key, event))
                    self._health_changed(slot, now, decisions)
        return decisions

    def hand_over(self, now: float) -> list[Decision]:
        """Another process took over the pool (a handover): every pending request is refused
        ``handed_over`` (the shell relays it to that process), and so is every request
        submitted from now on; leases are kept and released as usual, and dispatch nothing."""
        self._handed_over = True
        decisions = self._expire_due(now)
        pending = [r for group in self._groups.values() for q in group.all_queues() for r in q]
        pending.sort(key=lambda request: request.request_id)
        decisions.extend(
            self._reject(request, RejectReason.HANDED_OVER, _HANDED_OVER) for request in pending
        )
        return decisions

    def cancel(self, request: PendingRequest, now: float) -> list[Decision]:
        """The client of ``request`` went away: drop it from the queue (``client_gone``).

        A request that is no longer pending is left alone (its lease, if any, must still be
        released by its holder).
        """
        queue = request.queue
        group = self._groups.get(request.group_id)
        if queue is not None and (
            group is None or (queue not in group.queues and queue is not group.retries)
        ):
            raise ValueError(f"{request!r} is not pending in this scheduler")
        decisions = self._expire_due(now)
        if request.queue is not None:
            decisions.append(
                self._reject(
                    request,
                    RejectReason.CLIENT_GONE,
                    "the client went away while the request waited in the admission queue",
                )
            )
        return decisions

    def expire(self, now: float) -> list[Decision]:
        """Expire every pending request whose deadline is at or before ``now``, then run the
        health timers that are due (holds and ejections ending, probes due)."""
        return self._expire_due(now)

    def next_deadline(self) -> float | None:
        """The earliest deadline of a pending request, or ``None``."""
        return self._deadlines.soonest()

    def next_event(self) -> float | None:
        """When to call :meth:`expire` next: the earliest deadline or health timer, or ``None``."""
        deadline = self._deadlines.soonest()
        when = self._health_timers.soonest()
        if when is None or (deadline is not None and deadline <= when):
            return deadline
        return when

    def apply_policy(self, policy: PoolPolicy, now: float) -> list[Decision]:
        """Swap in ``policy`` live (SPEC §4) and re-evaluate every pending request at once.

        Leases are kept. Pending requests of a removed group fail ``model_not_found``, those of
        a group left without an enabled provider ``no_available_provider`` (both counted as
        ``config_change``). Deadlines are recomputed from each request's submit time (0 removes
        them) and what is due expires. Then every slot the new policy frees is dispatched to the
        pending requests, oldest first. A lower ``max_queue`` evicts nothing; a capacity below
        ``in_flight`` cancels nothing.
        """
        old_groups = self._groups
        old_timeout = self._timeout
        self._install(policy, now)
        decisions: list[Decision] = []
        dropped: list[tuple[PendingRequest, RejectReason, str]] = []
        for group_id, old in old_groups.items():
            new = self._groups.get(group_id)
            if new is not None and new.members:
                continue
            if new is None:
                reason = RejectReason.MODEL_NOT_FOUND
                message = f"model group {group_id!r} was removed by a config change"
            else:
                reason = RejectReason.NO_AVAILABLE_PROVIDER
                message = f"model group {group_id!r} lost its last enabled provider"
            for queue in (*old.queues, old.retries):
                dropped.extend((request, reason, message) for request in queue)
        dropped.sort(key=lambda item: item[0].request_id)
        for request, reason, message in dropped:
            decisions.append(self._reject(request, reason, message, config_change=True))
        self._rates.update(self._rate_limits())
        self._rated = self._rate_share is not None and bool(policy.per_minute)
        self._book.reweigh(
            [q for group in self._groups.values() for q in group.queues],
            weights=policy.weights,
            caps=policy.caps,
            mode=policy.fair_share,
            queue_caps=policy.queue_caps,
        )
        self._capped = bool(policy.caps)
        for name in policy.principals:
            self._book.share(name)
        if self._timeout != old_timeout:
            timeout = self._timeout
            pending = [r for group in self._groups.values() for q in group.all_queues() for r in q]
            for request in pending:
                request.deadline = None if timeout is None else request.submitted_at + timeout
            self._deadlines.rebuild(pending)
        decisions.extend(self._expire_due(now))
        if self._pending:
            self._dispatch_all(now, decisions)
            for group in self._groups.values():
                self._sweep_retries(group, decisions, config_change=True)
        return decisions

    def __repr__(self) -> str:
        """The live counts, for a debugger or a log line."""
        return _live_counts(type(self).__name__, self.statistics())

    def statistics(self) -> PoolStatistics:
        """A frozen snapshot: queue depth, every provider's slots, and the counters."""
        providers = [provider_statistics(slot) for slot in self._slots.values()]
        providers.extend(provider_statistics(slot) for slot in self._retired.values())
        derived = self._policy.derived
        groups = tuple(
            GroupStatistics(group_id, len(group.members), group.panic, derived.get(group_id))
            for group_id, group in self._groups.items()
        )
        return PoolStatistics(
            queue_depth=self._pending,
            max_queue=self._max_queue,
            queue_timeout_ms=self._policy.queue_timeout_ms,
            providers=tuple(providers),
            submitted=self._submitted,
            admitted=self._admitted,
            rejected=MappingProxyType(dict(self._rejected)),
            released=self._released,
            double_releases=self._double_releases,
            inherited=self._inherited,
            failovers=self._failovers,
            groups=groups,
            principals=tuple(self._principal_statistics()),
        )

    def _principal_statistics(self) -> Iterator[PrincipalStatistics]:
        """The principals the policy names, and any other still holding or awaiting a slot
        (one a live change removed)."""
        policy = self._policy
        known = set(policy.principals)
        for share in self._book.shares():
            if share.name not in known and not (share.in_flight or share.queued):
                continue
            yield PrincipalStatistics(
                principal=share.name,
                weight=share.weight,
                max_in_flight=share.configured,
                max_queued=share.max_queued,
                max_requests_per_minute=policy.per_minute.get(share.name),
                in_flight=share.in_flight,
                queued=share.queued,
                rejected=MappingProxyType(dict(share.rejected)),
                in_flight_elsewhere=share.elsewhere,
            )

    # -- internals --------------------------------------------------------------------------

    def _install(self, policy: PoolPolicy, now: float | None = None) -> None:
        """Build slots and groups for ``policy``, keeping counts, queues and rotations."""
        old_groups = self._groups
        slots: dict[ProviderKey, ProviderSlot] = {}
        for provider in policy.providers:
            slot = self._slots.pop(provider.key, None) or self._retired.pop(provider.key, None)
            connected = not provider.remote or provider.node_id in self._nodes_up
            if slot is None:
                slot = ProviderSlot(provider)
                if connected is not slot.connected:
                    slot.set_connected(connected)  # a remote provider added while its link is up
            else:
                slot.update(provider, connected)
                slot.memberships = []
            if slot.health.can_probe is not provider.probe:
                # Its next health time may move (a probe due or not): arm a timer for it.
                slot.health.can_probe = provider.probe
                self._health_timers.arm(slot)
            slots[provider.key] = slot
        for slot in self._slots.values():
            slot.retire()
            if slot.in_flight:
                self._retired[slot.key] = slot
        self._slots = slots
        groups: dict[str, ModelGroup] = {}
        for group_id, keys in policy.groups.items():
            old = old_groups.get(group_id)
            if old is None:
                book = self._book
                queues = (FairQueue(book, group_id, False), FairQueue(book, group_id, True))
                group = ModelGroup(group_id, queues, RequestQueue())
                stamps: dict[ProviderKey, int] = {}
            else:
                group = ModelGroup(group_id, old.queues, old.retries, old.tick, old.fresh)
                stamps = {m.slot.key: m.stamp for m in old.members}
            for key in keys:
                slot = slots[key]
                if slot.enabled:
                    group.add_member(slot, stamps.get(key))
            if group.update_panic():
                self._reoffer(group)
            changed = (old is not None and old.panic) is not group.panic
            if changed and group_id not in policy.derived:
                self._events.append((group_id, _panic_event(group)))
            groups[group_id] = group
        self._groups = groups
        self._policy = policy
        self._max_queue = policy.max_queue
        self._timeout = policy.queue_timeout_s
        if self._idle_probes and now is not None:
            self._start_idle_probes(now)  # providers added, enabled again, or given a check

    def _start_idle_probes(self, now: float) -> None:
        policy = self._policy.health
        for slot in self._slots.values():
            health = slot.health
            health.idle_probes = True
            if slot.serving and health.arm_idle(now, policy):
                self._health_timers.arm(slot)

    def _release(
        self,
        lease: SlotLease,
        now: float,
        outcome: Outcome,
        decisions: list[Decision],
        failing: PendingRequest | None,
    ) -> bool:
        """Release ``lease`` (not yet released) with ``outcome``, then hand on what it freed.

        ``failing`` (from :meth:`fail`) is the lease's request: it re-enters admission after
        health has taken the failure in (an ejection may start a panic that opens other
        providers) and before any slot is handed on, so no queued request overtakes it.
        Returns whether it was retried.
        """
        lease.released = True
        # The request lets go of its lease: the pair would otherwise be a reference cycle, left
        # to the garbage collector's full collections (one per served request).
        lease.request.lease = None
        self._released += 1
        slot = lease.slot
        slot.in_flight -= 1
        if lease.long_context:
            slot.long_in_flight -= 1
        share = lease.request.share
        if share.parked:
            # Its principal may fall under its cap: its waiting requests compete again, after
            # this release has been handed on (below).
            self._unparked.extend(share.release())
        else:
            share.in_flight -= 1  # (Share.release, inlined: nothing parked)
        if not slot.in_policy:
            if slot.in_flight == 0:
                self._retired.pop(slot.key, None)
            return failing is not None and self._fail_over(failing, slot.key, now, decisions)
        health = slot.health
        health.quiet_since = now  # (an attempt ended: idle probes wait a probe_interval)
        trial = health.trial is lease
        # (A disconnected provider's outcomes say nothing of it: its health starts over when
        # its link is back.)
        if slot.serving and (outcome is not None or trial):
            if trial:
                # The trial ended: whatever it says below decides, and an outcome that leaves
                # the provider half-open (the client left, a 429) lets the next request be it.
                health.trial = None
            if outcome == OK:
                event = health.succeeded(now, started=lease.granted_at)
            elif outcome is None:
                event = None
            else:
                assert isinstance(outcome, Failure)
                event = health.failed(outcome, now, self._policy.health)
            # Whether a provider is usable changes only with an event or the end of a trial:
            # the happy path (a healthy provider answered) stops here.
            if event is not None or trial:
                if event is not None:
                    self._events.append((slot.key, event))
                return self._health_changed(slot, now, decisions, failing)
        retried = failing is not None and self._fail_over(failing, slot.key, now, decisions)
        if not (self._pending and self._refill(slot, now, decisions)):
            slot.changed()
        return retried

    def _fail_over(
        self, request: PendingRequest, tried: ProviderKey, now: float, decisions: list[Decision]
    ) -> bool:
        """Put ``request``, whose attempt on ``tried`` failed, back into admission ahead of the
        queue (see :meth:`fail`); return whether it was retried."""
        request.tried = request.tried | {tried}
        group = self._groups.get(request.group_id)
        if (
            self._handed_over  # another process owns the slots now: no new attempt here
            or request.attempts >= self._policy.max_attempts
            or group is None
            or not group.has_untried(request.tried)
        ):
            return False
        deadline = None if self._timeout is None else request.submitted_at + self._timeout
        # Others of this group failing over already wait: this one joins them (the oldest goes
        # first), so every untried member's free capacity goes round in order.
        joins = bool(group.retries.live)
        membership = None if joins else group.best_untried(request.long_context, request.tried)
        if membership is None and deadline is not None and deadline <= now:
            return False  # past its deadline with no slot at once: the failure is the answer
        self._failovers += 1
        request.state = RequestState.PENDING
        request.lease = None
        if membership is not None:
            decisions.append(self._dispatch(request, membership, now))
            return True
        group.retries.push(request)
        self._pending += 1
        self._retrying += 1
        request.deadline = deadline
        if deadline is not None:
            self._deadlines.push(request, self._pending)
        if joins:
            for member in group.members:
                if member.slot.key not in request.tried:
                    self._refill(member.slot, now, decisions)
        return True

    def _dispatch(self, request: PendingRequest, membership: Membership, now: float) -> Dispatch:
        """Give ``request`` a slot on ``membership``'s provider (the caller checked it is free)."""
        queue = request.queue
        if queue is not None:  # _dequeue, inlined: this is the hot path
            self._pending -= 1
            if request.attempts:
                queue.discard(request)  # the failover queue
                self._retrying -= 1
            else:
                assert isinstance(queue, FairQueue)  # a group's queue: take() advances the clock
                queue.take(request)
        request.share.in_flight += 1  # (Share.acquire, inlined)
        slot = membership.slot
        group = membership.group
        group.choose(membership)
        slot.in_flight += 1
        if request.long_context:
            slot.long_in_flight += 1
        lease = SlotLease(self, request, slot, now)
        health = slot.health
        # (``ejections`` first: 0 on the happy path, and a half-open provider was ejected)
        if health.ejections and health.half_open and health.trial is None and not group.panic:
            health.trial = lease  # the one trial request of a half-open provider
            slot.usable = False
        slot.changed()
        request.attempts += 1
        request.state = RequestState.DISPATCHED
        request.lease = lease
        self._admitted += 1
        return Dispatch(request, lease)

    def _dequeue(self, request: PendingRequest) -> None:
        """Take a pending request out of its queue (a request failing over has attempts)."""
        assert request.queue is not None
        request.queue.discard(request)
        self._pending -= 1
        if request.attempts:
            self._retrying -= 1

    def _reject(
        self,
        request: PendingRequest,
        reason: RejectReason,
        message: str,
        *,
        config_change: bool = False,
        retry_after: float | None = None,
    ) -> Rejection:
        if request.queue is not None:
            self._dequeue(request)
        rejection = Rejection(request, reason, message, config_change, retry_after)
        request.state = RequestState.REJECTED
        request.rejection = rejection
        counter = "config_change" if config_change else reason.value
        self._rejected[counter] += 1
        rejected = request.share.rejected
        rejected[counter] = rejected.get(counter, 0) + 1
        return rejection

    def _refill(self, slot: ProviderSlot, now: float, decisions: list[Decision]) -> bool:
        """Give ``slot``'s free capacity to the oldest pending requests it can serve.

        Returns whether anything was dispatched. Cost: the heads of P's groups' queues.
        """
        dispatched = False
        while slot.serving and slot.in_flight < slot.capacity:
            long_free = slot.long_in_flight < slot.long_capacity
            oldest: PendingRequest | None = None
            chosen: Membership | None = None
            if self._retrying:
                retry = self._retry_for(slot, long_free)
                if retry is not None:
                    decisions.append(self._dispatch(*retry, now))
                    dispatched = True
                    continue
            for membership in slot.memberships:
                group = membership.group
                if not (slot.usable or group.panic):
                    continue
                general, long_queue = group.queues
                # (the comparisons are service_key's, without building tuples)
                if general.live:
                    head = general.head()
                    if head is not None and (
                        oldest is None
                        or head.start < oldest.start
                        or (head.start == oldest.start and head.request_id < oldest.request_id)
                    ):
                        oldest, chosen = head, membership
                if long_free and long_queue.live:
                    head = long_queue.head()
                    if head is not None and (
                        oldest is None
                        or head.start < oldest.start
                        or (head.start == oldest.start and head.request_id < oldest.request_id)
                    ):
                        oldest, chosen = head, membership
            if oldest is None or chosen is None:
                break
            decisions.append(self._dispatch(oldest, chosen, now))
            dispatched = True
        return dispatched

    def _retry_for(
        self, slot: ProviderSlot, long_free: bool
    ) -> tuple[PendingRequest, Membership] | None:
        """The oldest request failing over that ``slot``'s free capacity can take, if any."""
        oldest: PendingRequest | None = None
        chosen: Membership | None = None
        key = slot.key
        for membership in slot.memberships:
            group = membership.group
            if not group.retries.live or not (slot.usable or group.panic):
                continue
            # The retries queue is in order of failure, not of arrival: scan it (it is short).
            for request in group.retries:
                if key in request.tried or (request.long_context and not long_free):
                    continue
                if oldest is None or request.request_id < oldest.request_id:
                    oldest, chosen = request, membership
        return None if oldest is None or chosen is None else (oldest, chosen)

    def _dispatch_all(self, now: float, decisions: list[Decision]) -> None:
        """Dispatch every pending request that has a free candidate, oldest first (O(Q log Q)),
        the requests failing over before all others."""
        retries = [r for group in self._groups.values() for r in group.retries]
        retries.sort(key=lambda request: request.request_id)
        for request in retries:
            membership = self._groups[request.group_id].best_untried(
                request.long_context, request.tried
            )
            if membership is not None:
                decisions.append(self._dispatch(request, membership, now))
        pending = [r for group in self._groups.values() for q in group.queues for r in q]
        pending.sort(key=service_key)
        exhausted: set[tuple[str, bool]] = set()
        for request in pending:
            kind = (request.group_id, request.long_context)
            if kind in exhausted:
                continue
            if not request.share.eligible:
                # A principal at its cap waits without holding back its kind, parked so that
                # its next release offers it the slots.
                assert isinstance(request.queue, FairQueue)
                request.queue.park(request.share)
                continue
            membership = self._groups[request.group_id].best_candidate(request.long_context)
            if membership is None:
                # Free slots only shrink during this pass: later requests of this kind wait too.
                exhausted.add(kind)
            else:
                decisions.append(self._dispatch(request, membership, now))

    def _serve_unparked(self, now: float, decisions: list[Decision]) -> None:
        """Offer free slots to the queues where a principal just fell under its cap."""
        queues, self._unparked = self._unparked, []
        for queue in queues:
            group = self._groups.get(queue.group_id)
            if group is None or queue not in group.queues:
                continue  # its group was swapped away meanwhile
            while (head := queue.head()) is not None:
                membership = group.best_candidate(queue.long_context)
                if membership is None:
                    break
                decisions.append(self._dispatch(head, membership, now))

    def _expire_due(self, now: float) -> list[Decision]:
        decisions: list[Decision] = []
        if self._deadlines.is_due(now):
            decisions.extend(self._timed_out(request, now) for request in self._deadlines.due(now))
        timers = self._health_timers.heap
        if timers and timers[0][0] <= now:
            self._run_health_timers(now, decisions)
        return decisions

    def _timed_out(self, request: PendingRequest, now: float) -> Rejection:
        return self._reject(
            request,
            RejectReason.QUEUE_TIMEOUT,
            f"the request waited {now - request.submitted_at:.3f} s in the admission "
            f"queue, past queue_timeout_ms {self._policy.queue_timeout_ms}",
        )

    # -- health ------------------------------------------------------------------------------

    def _run_health_timers(self, now: float, decisions: list[Decision]) -> None:
        policy = self._policy.health
        for slot in self._health_timers.due(now):
            if not slot.serving or self._slots.get(slot.key) is not slot:
                continue  # disabled, disconnected or removed: it starts over when it is back
            health = slot.health
            out = health.out
            events = health.advance(now, policy, slot.in_flight > 0)
            if not events and health.out is out and slot.usable is health.usable:
                self._health_timers.arm(slot)  # an idle check that found traffic: nothing else
                continue
            for event in events:
                self._events.append((slot.key, event))
            self._health_changed(slot, now, decisions)

    def _health_changed(
        self,
        slot: ProviderSlot,
        now: float,
        decisions: list[Decision],
        failing: PendingRequest | None = None,
    ) -> bool:
        """Bring the candidate indexes, the groups' panic and the pending requests in step
        with ``slot``'s health, and arm its next health timer. ``failing`` (a request whose
        attempt on ``slot`` just failed) re-enters admission before any slot is handed on;
        returns whether it was retried."""
        slot.usable = slot.health.usable
        touched = [slot]
        derived = self._policy.derived
        for membership in slot.memberships:
            group = membership.group
            if group.update_panic():
                if group.group_id not in derived:  # (a model's panic is reported once)
                    self._events.append((group.group_id, _panic_event(group)))
                self._reoffer(group)
                touched.extend(m.slot for m in group.members if m.slot is not slot)
        slot.changed()
        if slot.serving:  # (a disconnected provider has no health timer, and is not probed)
            slot.health.arm_idle(now, self._policy.health)
            self._health_timers.arm(slot)
        retried = failing is not None and self._fail_over(failing, slot.key, now, decisions)
        if self._pending:
            for each in touched:
                self._refill(each, now, decisions)
            for membership in slot.memberships:
                self._sweep_retries(membership.group, decisions)
        return retried

    @staticmethod
    def _reoffer(group: ModelGroup) -> None:
        for membership in group.members:
            membership.version += 1
            group.offer(membership)

    def _sweep_retries(
        self, group: ModelGroup, decisions: list[Decision], *, config_change: bool = False
    ) -> None:
        """Refuse the requests failing over in ``group`` that no untried provider can take
        any more (ejected, disabled or removed meanwhile)."""
        if not group.retries.live:
            return
        for request in group.retries:
            if not group.has_untried(request.tried):
                decisions.append(
                    self._reject(
                        request,
                        RejectReason.NO_AVAILABLE_PROVIDER,
                        f"model group {group.group_id!r} has no provider left that this "
                        "request has not tried",
                        config_change=config_change,
                    )
                )


_HANDED_OVER: Final = "another edge process took over; the request goes to it"


def _panic_event(group: ModelGroup) -> HealthEvent:
    return HealthEvent("panic" if group.panic else "panic_over")


def _live_counts(name: str, stats: PoolStatistics) -> str:
    return (
        f"<{name} in_flight={stats.in_flight} queued={stats.queue_depth}/{stats.max_queue} "
        f"providers={len(stats.providers)} submitted={stats.submitted} "
        f"admitted={stats.admitted} rejected={stats.rejected_total}>"
    )

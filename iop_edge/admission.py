"""The asyncio shell around the pure admission scheduler.

:class:`AdmissionScheduler` owns a :class:`iop_edge.pool.PoolScheduler`, one injected
:class:`iop_edge.seams.Clock` and one timer. ``await admit(group)`` returns a :class:`Lease`
(dispatched at once, or after waiting in the queue) or raises
:class:`iop_edge.errors.AdmissionError`. All state lives in the pure core; this module resolves
futures from its decisions and keeps the timer armed no later than the nearest deadline or
health timer.

Health (SPEC §5.1): a lease carries how its attempt ended (:meth:`Lease.succeeded`,
:meth:`Lease.failed`) into its release; :meth:`AdmissionScheduler.failover` releases a failed
attempt and waits for a slot on another provider (when the provider's ``retry_on`` allows).
Probes the core asks for — of ejected providers, and once :meth:`AdmissionScheduler.start` ran
of idle ones (never of a remote provider whose node link is down:
:meth:`AdmissionScheduler.set_connected`) — run as tasks through the injected ``prober``, their
results fed back to the core; health events go to the injected ``on_health``. The same one
timer serves deadlines, health times and idle checks: nothing is armed per request.

Cancellation safety: a cancelled waiter leaves the queue as soon as its task runs (counted as
``client_gone``); a slot granted to a waiter that was cancelled in the same tick is released at
once, which offers it to the next pending request. Everything runs on one event loop, so no lock
is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from iop_edge.errors import AdmissionError
from iop_edge.pool import (
    ANONYMOUS,
    OK,
    PROBE,
    Decision,
    Dispatch,
    Failure,
    HealthEvent,
    Outcome,
    PendingRequest,
    PoolPolicy,
    PoolScheduler,
    PoolStatistics,
    ProviderKey,
    Rejection,
    RequestState,
    SlotLease,
)
from iop_edge.runtime.clock import MonotonicClock
from iop_edge.seams import Clock, Prober, ProbeResult
from iop_edge.shared.refusal import StoreRefusal

if TYPE_CHECKING:
    from iop_edge.shared.gate import SharedGate

__all__ = ["AdmissionScheduler", "HealthListener", "Lease", "MonotonicClock"]

HealthListener = Callable[[ProviderKey | str, HealthEvent], None]
"""Told each health event: of a provider ``(node, id)``, or of a model group (its id)."""


async def _no_prober(key: ProviderKey) -> ProbeResult:
    return False, "no health check is wired to this scheduler"


class Lease:
    """A slot on one provider, held by one admitted request until released exactly once.

    ``async with lease:`` releases on exit, whatever happens inside; :meth:`release` may be
    called directly (from a ``finally``, a callback). A second release is an ignored no-op,
    counted in ``statistics().double_releases``. Before releasing, say how the attempt ended
    for the provider's health: :meth:`succeeded` or :meth:`failed` (neither: the client left,
    nothing was learnt about the provider).
    """

    __slots__ = ("_admission", "_holder", "_lost", "_outcome", "_slot_lease", "ticket")

    def __init__(self, admission: AdmissionScheduler, slot_lease: SlotLease) -> None:
        self._admission = admission
        self._slot_lease = slot_lease
        self._outcome: Outcome = None
        #: its lease id in the shared store (``None``: not shared, or held by a static split)
        self.ticket: str | None = None
        self._holder: asyncio.Task[Any] | None = None
        self._lost: str | None = None

    @property
    def node_id(self) -> str:
        """The node of the provider the request was admitted onto."""
        return self._slot_lease.node_id

    @property
    def provider_id(self) -> str:
        """The provider the request was admitted onto."""
        return self._slot_lease.provider_id

    @property
    def key(self) -> ProviderKey:
        """The provider resource ``(node_id, provider_id)``."""
        return self._slot_lease.key

    @property
    def principal(self) -> str:
        """The principal whose request holds the lease."""
        return self._slot_lease.request.share.name

    @property
    def lost(self) -> str | None:
        """Why the shared store no longer counts this lease (its request must stop), or
        ``None``."""
        return self._lost

    def lose(self, reason: str) -> None:
        """The shared store no longer counts this lease: the task holding it is cancelled,
        and reads :attr:`lost` to end its request with that error (see
        :mod:`iop_edge.api.attempt`)."""
        self._lost = reason
        holder = self._holder
        if holder is not None and not holder.done():
            holder.cancel()

    @property
    def long_context(self) -> bool:
        """Whether the lease holds a long-context slot as well as a general one."""
        return self._slot_lease.long_context

    @property
    def queue_wait(self) -> float:
        """Seconds the request waited in the queue before it got this slot (0 if it did not)."""
        return self._slot_lease.granted_at - self._slot_lease.request.submitted_at

    @property
    def released(self) -> bool:
        """Whether the slot has been given back."""
        return self._slot_lease.released

    def succeeded(self) -> None:
        """The provider answered (its answer, or a 4xx of the client's making)."""
        self._outcome = OK

    def failed(self, failure: Failure) -> None:
        """The provider failed after the client got its first byte (no failover then)."""
        self._outcome = failure

    def release(self) -> None:
        """Give the slot back (to the oldest pending request that can use it). Idempotent."""
        admission = self._admission
        admission._release(self._slot_lease, self._outcome)
        if self.ticket is not None and admission._gate is not None:
            admission._gate.released(self)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Lease({self._slot_lease!r})"


class AdmissionScheduler:
    """Admission control for the event loop: leases on provider slots, a bounded queue.

    ``clock`` defaults to :class:`MonotonicClock`; tests pass a
    :class:`iop_edge.testing.clock.FakeClock`. ``prober`` runs a provider's health check when
    the core asks for one; ``on_health`` is told every health event (to log it).
    """

    def __init__(
        self,
        policy: PoolPolicy,
        *,
        clock: Clock | None = None,
        prober: Prober = _no_prober,
        on_health: HealthListener | None = None,
        gate: SharedGate | None = None,
    ) -> None:
        self._core = PoolScheduler(policy)
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._prober = prober
        self._on_health = on_health
        self._waiters: dict[PendingRequest, asyncio.Future[Lease]] = {}
        self._timer_at: float | None = None
        self._cancel_timer: Callable[[], None] | None = None
        self._probes: set[asyncio.Task[None]] = set()
        self._closed = False  # (aclose: no probe starts, no timer is armed any more)
        #: told of every lease released (set during a handover: the successor counts them)
        self.on_release: Callable[[SlotLease], None] | None = None
        #: the shared store's leases (``provider_pool.shared``), or ``None``
        self._gate = gate
        if gate is not None:
            gate.attach(self)

    @property
    def policy(self) -> PoolPolicy:
        """The policy in force."""
        return self._core.policy

    @property
    def timer_deadline(self) -> float | None:
        """When the one expiry timer is armed for (never later than the nearest deadline)."""
        return self._timer_at

    def __repr__(self) -> str:
        """The live counts of the scheduler core."""
        return repr(self._core).replace(type(self._core).__name__, type(self).__name__, 1)

    def statistics(self) -> PoolStatistics:
        """A frozen snapshot of the queue, the providers' slots and the counters."""
        return self._core.statistics()

    @property
    def queue_depth(self) -> int:
        """How many requests wait."""
        return self._core.queue_depth

    @property
    def gate(self) -> SharedGate | None:
        """The shared store's gate (``provider_pool.shared``), or ``None``."""
        return self._gate

    async def admit(
        self,
        group_id: str,
        *,
        long_context: bool = False,
        principal: str = ANONYMOUS,
        submitted_at: float | None = None,
    ) -> Lease:
        """Wait for a slot on a provider of model group ``group_id`` and return its lease;
        pending requests are served fairly across principals (:mod:`iop_edge.pool.fair`).

        Raises :class:`AdmissionError` with reason ``model_not_found``,
        ``no_available_provider`` or ``queue_full`` at once, or ``queue_timeout`` /
        (after a live config change, ``config_change=True``) ``model_not_found`` /
        ``no_available_provider`` while waiting. Cancelling the caller leaves the queue.
        """
        gate = self._gate
        over_rate = None
        if gate is not None and gate.rated(principal):
            over_rate = await gate.take_rate(principal)
        submission = self._core.submit(
            group_id,
            long_context=long_context,
            now=self._clock.now(),
            principal=principal,
            submitted_at=submitted_at,
            over_rate=over_rate,
        )
        request = submission.request
        self._settle(submission.decisions, own=request)
        lease = await self._outcome_of(request)
        return lease if gate is None else await self._through_gate(lease)

    async def failover(
        self, lease: Lease, failure: Failure, *, retried: Callable[[], None] | None = None
    ) -> Lease | None:
        """The attempt holding ``lease`` failed before the client got a byte: release it with
        ``failure`` and wait for a slot on a provider the request has not tried — if the
        failed provider's ``retry_on`` lists the failure's class (a 429 always fails over).

        ``retried`` is called once the request has re-entered admission (counted in
        ``statistics().failovers``), before any wait. Returns ``None`` when there is no retry
        (not in ``retry_on``, attempts used up, no untried candidate) or the last untried
        provider went away while the request waited: the caller returns the failed attempt's
        error. Raises :class:`AdmissionError` like :meth:`admit` (``queue_timeout`` counts
        from the request's arrival).
        """
        result = self._core.fail(lease._slot_lease, failure, self._clock.now())
        request = result.request
        if self._gate is not None:
            self._gate.released(lease)
        self._settle(result.decisions, own=request)
        if not result.retried:
            return None
        if retried is not None:
            retried()
        try:
            granted = await self._outcome_of(request)
            return granted if self._gate is None else await self._through_gate(granted)
        except AdmissionError as exc:
            if exc.reason == "no_available_provider":
                return None
            raise

    def start(self) -> None:
        """Start probing idle providers (from the running loop, once the daemon serves): every
        enabled provider with a health check, each ``probe_interval_ms`` without traffic."""
        self._core.start(self._clock.now())
        self._rearm()

    def inherit(self, key: ProviderKey, *, long_context: bool, principal: str) -> Lease | None:
        """A slot the process this one takes over from still holds (a handover): counted as
        this scheduler's lease until released (see :meth:`PoolScheduler.inherit`). In a
        shared pool, ``None``: the old process's leases stay in the store, renewed and
        released by that process, and count here as held elsewhere — never twice."""
        if self._gate is not None:
            return None
        slot_lease = self._core.inherit(
            key, long_context=long_context, principal=principal, now=self._clock.now()
        )
        return None if slot_lease is None else Lease(self, slot_lease)

    def set_connected(self, node_id: str, connected: bool) -> None:
        """The node link of remote node ``node_id`` came up or went down (the link's only
        write into admission; see :meth:`PoolScheduler.set_connected`): waiters are dispatched
        at once on a link that came up; on one that went down, waiting requests stay queued,
        and those failing over that only its providers could take get ``None`` from
        :meth:`failover`. No lease is released here: their holders release them as usual."""
        self._settle(self._core.set_connected(node_id, connected, self._clock.now()))

    def hand_over(self) -> None:
        """Another process took over (a handover): every waiting request, and every one
        admitted from now on, is refused ``handed_over`` for the server to relay it."""
        self._settle(self._core.hand_over(self._clock.now()))

    def apply_policy(self, policy: PoolPolicy) -> None:
        """Swap the policy live (SPEC §4): waiters are dispatched or failed at once."""
        self._settle(self._core.apply_policy(policy, self._clock.now()))
        if self._gate is not None:
            self._gate.policy_changed(policy)

    # -- a pool shared with other edges (the gate's calls) -------------------------------------

    def set_elsewhere(
        self, providers: Mapping[ProviderKey, tuple[int, int]], principals: Mapping[str, int]
    ) -> None:
        """The leases held by the other edges (see :meth:`PoolScheduler.set_elsewhere`):
        waiters are dispatched at once onto what that frees."""
        self._settle(self._core.set_elsewhere(providers, principals, self._clock.now()))

    def within(self, lease: Lease) -> bool:
        """Whether ``lease`` fits what this edge may fill now (a static split)."""
        return self._core.within(lease._slot_lease)

    def set_rate_share(self, share: int | None) -> None:
        """Who counts the per-minute rates (see :meth:`PoolScheduler.set_rate_share`)."""
        self._core.set_rate_share(share)

    async def aclose(self) -> None:
        """Stop the health probes still running, and start no other (the daemon stops)."""
        self._closed = True
        if self._cancel_timer is not None:
            self._cancel_timer()
            self._cancel_timer = self._timer_at = None
        probes = list(self._probes)
        for task in probes:
            task.cancel()
        for task in probes:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- internals --------------------------------------------------------------------------

    async def _through_gate(self, lease: Lease) -> Lease:
        """Hold ``lease`` in the shared store too; a refusal puts its request back in its
        place here until a slot is free in the store (the gate says how many are held
        elsewhere first), and it tries again then."""
        gate = self._gate
        assert gate is not None
        while True:
            request = lease._slot_lease.request
            try:
                granted = await gate.acquire(lease)
            except StoreRefusal as exc:
                self._settle(
                    self._core.requeue(lease._slot_lease, self._clock.now(), str(exc)), own=request
                )
                assert request.rejection is not None
                raise _admission_error(request.rejection) from None
            except BaseException:
                lease.release()  # (cancelled: the gate gave its store id back)
                raise
            if granted:
                lease._holder = asyncio.current_task()
                return lease
            self._settle(self._core.requeue(lease._slot_lease, self._clock.now()), own=request)
            lease = await self._outcome_of(request)

    async def _outcome_of(self, request: PendingRequest) -> Lease:
        """The lease ``request`` got, or its rejection raised, waiting while it is pending."""
        if request.state is RequestState.DISPATCHED:
            assert request.lease is not None
            return Lease(self, request.lease)
        if request.state is RequestState.REJECTED:
            assert request.rejection is not None
            raise _admission_error(request.rejection)
        waiter: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        self._waiters[request] = waiter
        if self._gate is not None:
            self._gate.wake()
        try:
            return await waiter
        except BaseException:
            self._abandon(request, waiter)
            raise

    def _release(self, slot_lease: SlotLease, outcome: Outcome = None) -> None:
        released = slot_lease.released
        self._settle(self._core.release(slot_lease, self._clock.now(), outcome))
        if self.on_release is not None and not released:
            self.on_release(slot_lease)

    def _abandon(self, request: PendingRequest, waiter: asyncio.Future[Lease]) -> None:
        """The waiting task ended without taking its result (cancelled, most likely)."""
        if self._waiters.pop(request, None) is waiter:
            # Every decision about a request removes its waiter first: it is still pending.
            self._settle(self._core.cancel(request, self._clock.now()))
        elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            # Granted, then cancelled before the task resumed: the slot goes to the next one.
            waiter.result().release()

    def _settle(self, decisions: list[Decision], own: PendingRequest | None = None) -> None:
        """Resolve the waiters named by ``decisions`` (and by the decisions those lead to)."""
        work = deque(decisions)
        while work:
            decision = work.popleft()
            if decision.request is own:
                continue  # admit() handles its own request's fate
            waiter = self._waiters.pop(decision.request, None)
            alive = waiter is not None and not waiter.done()
            if isinstance(decision, Dispatch):
                if alive:
                    assert waiter is not None
                    waiter.set_result(Lease(self, decision.lease))
                else:
                    # The waiter was cancelled in this same tick: give the slot back at once.
                    work.extend(self._core.release(decision.lease, self._clock.now()))
            elif alive:
                assert waiter is not None
                waiter.set_exception(_admission_error(decision))
        if self._core.has_events:
            self._notify()
        self._rearm()

    def _notify(self) -> None:
        """Start the probes the core asked for; pass its health events on."""
        for subject, event in self._core.take_events():
            if event == PROBE:
                assert isinstance(subject, tuple)
                if self._closed:
                    continue
                task = asyncio.get_running_loop().create_task(self._probe(subject))
                self._probes.add(task)
                task.add_done_callback(self._probes.discard)
            elif self._on_health is not None:
                assert isinstance(event, HealthEvent)
                self._on_health(subject, event)

    async def _probe(self, key: ProviderKey) -> None:
        try:
            ok, reason = await self._prober(key)
        except Exception as exc:  # a prober's bug must not leave the provider unprobed
            ok, reason = False, f"the probe failed: {type(exc).__name__}"
        self._settle(self._core.probed(key, ok, reason, self._clock.now()))

    def _rearm(self) -> None:
        """Keep one timer armed no later than the nearest deadline.

        A timer armed earlier than needed (its request left the queue) is kept and simply fires
        for nothing, which is cheaper than re-arming on every dispatch.
        """
        deadline = self._core.next_event()
        if (
            deadline is None
            or self._closed
            or (self._timer_at is not None and self._timer_at <= deadline)
        ):
            return
        if self._cancel_timer is not None:
            self._cancel_timer()
        self._timer_at = deadline
        self._cancel_timer = self._clock.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer_at = None
        self._cancel_timer = None
        self._settle(self._core.expire(self._clock.now()))


def _admission_error(rejection: Rejection) -> AdmissionError:
    return AdmissionError(
        rejection.reason.value,
        rejection.message,
        config_change=rejection.config_change,
        retry_after=rejection.retry_after,
    )

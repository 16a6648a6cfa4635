"""The asyncio shell around the pure admission scheduler.

:class:`AdmissionScheduler` owns a :class:`iop_edge.pool.PoolScheduler`, one injected
:class:`iop_edge.seams.Clock` and one timer. ``await admit(group)`` returns a :class:`Lease`
(dispatched at once, or after waiting in the queue) or raises
:class:`iop_edge.errors.AdmissionError`. All state lives in the pure core; this module resolves
futures from its decisions and keeps the timer armed no later than the nearest deadline.

Cancellation safety: a cancelled waiter leaves the queue as soon as its task runs (counted as
``client_gone``); a slot granted to a waiter that was cancelled in the same tick is released at
once, which offers it to the next pending request. Everything runs on one event loop, so no lock
is needed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from types import TracebackType

from iop_edge.errors import AdmissionError
from iop_edge.pool import (
    Decision,
    Dispatch,
    PendingRequest,
    PoolPolicy,
    PoolScheduler,
    PoolStatistics,
    ProviderKey,
    Rejection,
    RequestState,
    SlotLease,
)
from iop_edge.seams import Clock


class MonotonicClock:
    """The real clock: the running event loop's monotonic time and timers.

    The loop's own ``time()`` is used (not ``time.monotonic()`` directly) so that ``now()`` and
    timers agree under any loop implementation (uvloop included). Must be used from the loop.
    """

    __slots__ = ("_loop",)

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def now(self) -> float:
        """The event loop's monotonic time in seconds."""
        loop = self._loop
        if loop is None or loop.is_closed():
            # Looked up once: the request path reads the clock several times per request.
            loop = self._loop = asyncio.get_running_loop()
        return loop.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` on the loop once its time reaches ``when``; return its canceller."""
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle

        def fire() -> None:
            nonlocal handle
            # asyncio may run a timer up to its clock resolution early; the contract is never.
            if loop.time() < when:
                handle = loop.call_at(when, fire)
            else:
                callback()

        handle = loop.call_at(when, fire)

        def cancel() -> None:
            handle.cancel()

        return cancel


class Lease:
    """A slot on one provider, held by one admitted request until released exactly once.

    ``async with lease:`` releases on exit, whatever happens inside; :meth:`release` may be
    called directly (from a ``finally``, a callback). A second release is an ignored no-op,
    counted in ``statistics().double_releases``.
    """

    __slots__ = ("_admission", "_slot_lease")

    def __init__(self, admission: AdmissionScheduler, slot_lease: SlotLease) -> None:
        self._admission = admission
        self._slot_lease = slot_lease

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

    def release(self) -> None:
        """Give the slot back (to the oldest pending request that can use it). Idempotent."""
        self._admission._release(self._slot_lease)

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
    :class:`iop_edge.testing.clock.FakeClock`.
    """

    def __init__(self, policy: PoolPolicy, *, clock: Clock | None = None) -> None:
        self._core = PoolScheduler(policy)
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._waiters: dict[PendingRequest, asyncio.Future[Lease]] = {}
        self._timer_at: float | None = None
        self._cancel_timer: Callable[[], None] | None = None

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

    async def admit(self, group_id: str, *, long_context: bool = False) -> Lease:
        """Wait for a slot on a provider of model group ``group_id`` and return its lease.

        Raises :class:`AdmissionError` with reason ``model_not_found``,
        ``no_available_provider`` or ``queue_full`` at once, or ``queue_timeout`` /
        (after a live config change, ``config_change=True``) ``model_not_found`` /
        ``no_available_provider`` while waiting. Cancelling the caller leaves the queue.
        """
        submission = self._core.submit(group_id, long_context=long_context, now=self._clock.now())
        request = submission.request
        self._settle(submission.decisions, own=request)
        if request.state is RequestState.DISPATCHED:
            assert request.lease is not None
            return Lease(self, request.lease)
        if request.state is RequestState.REJECTED:
            assert request.rejection is not None
            raise _admission_error(request.rejection)
        waiter: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        self._waiters[request] = waiter
        try:
            return await waiter
        except BaseException:
            self._abandon(request, waiter)
            raise

    def apply_policy(self, policy: PoolPolicy) -> None:
        """Swap the policy live (SPEC §4): waiters are dispatched or failed at once."""
        self._settle(self._core.apply_policy(policy, self._clock.now()))

    # -- internals --------------------------------------------------------------------------

    def _release(self, slot_lease: SlotLease) -> None:
        self._settle(self._core.release(slot_lease, self._clock.now()))

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
        self._rearm()

    def _rearm(self) -> None:
        """Keep one timer armed no later than the nearest deadline.

        A timer armed earlier than needed (its request left the queue) is kept and simply fires
        for nothing, which is cheaper than re-arming on every dispatch.
        """
        deadline = self._core.next_deadline()
        if deadline is None or (self._timer_at is not None and self._timer_at <= deadline):
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
        rejection.reason.value, rejection.message, config_change=rejection.config_change
    )

"""The asyncio shell of the scheduler, driven by a FakeClock; no real sleeps.

Tasks are synchronised by yielding to the loop (``asyncio.sleep(0)``) until a condition holds,
never by waiting a real duration.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import pytest

from iop_edge.admission import AdmissionScheduler, Lease, MonotonicClock
from iop_edge.errors import AdmissionError
from iop_edge.pool import Failure, HealthEvent, PoolPolicy, ProviderPolicy
from iop_edge.testing.clock import FakeClock


def policy(
    capacity: int = 1,
    *,
    groups: dict[str, tuple[str, ...]] | None = None,
    enabled: bool = True,
    max_queue: int = 8,
    queue_timeout_ms: int = 0,
) -> PoolPolicy:
    """Providers a (the given capacity) and b (capacity 1); group m = (a,) by default."""
    providers = (
        ProviderPolicy("n1", "a", capacity, capacity, 0, enabled),
        ProviderPolicy("n1", "b", 1, 1, 0, True),
    )
    groups = groups if groups is not None else {"m": ("a",)}
    return PoolPolicy(
        max_queue=max_queue,
        queue_timeout_ms=queue_timeout_ms,
        providers=providers,
        groups={g: tuple(("n1", pid) for pid in pids) for g, pids in groups.items()},
    )


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until ``condition()`` holds (a bounded number of ticks)."""
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def waiting(scheduler: AdmissionScheduler, n: int) -> Callable[[], bool]:
    return lambda: scheduler.statistics().queue_depth == n


def in_flight(scheduler: AdmissionScheduler) -> int:
    return scheduler.statistics().in_flight


async def test_admit_returns_a_lease_at_once_when_a_slot_is_free() -> None:
    scheduler = AdmissionScheduler(policy(), clock=FakeClock())
    lease = await scheduler.admit("m")
    assert isinstance(lease, Lease)
    assert (lease.node_id, lease.provider_id, lease.key) == ("n1", "a", ("n1", "a"))
    assert (lease.long_context, lease.queue_wait, lease.released) == (False, 0.0, False)
    assert in_flight(scheduler) == 1


async def test_lease_context_manager_releases_on_exit_even_when_the_body_fails() -> None:
    scheduler = AdmissionScheduler(policy(), clock=FakeClock())
    lease = await scheduler.admit("m")
    with pytest.raises(RuntimeError, match="upstream broke"):
        async with lease:
            raise RuntimeError("upstream broke")
    assert lease.released
    stats = scheduler.statistics()
    assert (stats.in_flight, stats.released, stats.double_releases) == (0, 1, 0)


async def test_second_release_of_a_lease_is_a_counted_no_op() -> None:
    scheduler = AdmissionScheduler(policy(), clock=FakeClock())
    async with await scheduler.admit("m") as lease:
        lease.release()
    stats = scheduler.statistics()
    assert (stats.in_flight, stats.released, stats.double_releases) == (0, 1, 1)


@pytest.mark.parametrize(
    ("group", "reason", "message"),
    [
        ("nope", "model_not_found", "model group 'nope' does not exist"),
        ("off", "no_available_provider", "model group 'off' has no enabled provider"),
    ],
)
async def test_admit_refuses_at_once_without_queueing(
    group: str, reason: str, message: str
) -> None:
    scheduler = AdmissionScheduler(policy(enabled=False, groups={"off": ("a",)}), clock=FakeClock())
    with pytest.raises(AdmissionError) as caught:
        await scheduler.admit(group)
    assert (caught.value.reason, str(caught.value), caught.value.config_change) == (
        reason,
        message,
        False,
    )
    assert scheduler.statistics().queue_depth == 0


async def test_admit_rejects_queue_full_at_once() -> None:
    scheduler = AdmissionScheduler(policy(max_queue=1), clock=FakeClock())
    held = await scheduler.admit("m")
    waiter = asyncio.create_task(scheduler.admit("m"))
    await until(waiting(scheduler, 1))
    with pytest.raises(AdmissionError) as caught:
        await scheduler.admit("m")
    assert caught.value.reason == "queue_full"
    held.release()
    assert (await waiter).provider_id == "a"


async def test_waiter_gets_the_slot_when_a_lease_is_released_oldest_first() -> None:
    clock = FakeClock()
    scheduler = AdmissionScheduler(policy(), clock=clock)
    held = await scheduler.admit("m")
    first = asyncio.create_task(scheduler.admit("m"))
    await until(waiting(scheduler, 1))
    clock.advance(1.0)
    second = asyncio.create_task(scheduler.admit("m"))
    await until(waiting(scheduler, 2))
    clock.advance(2.0)
    held.release()
    lease = await first
    assert lease.queue_wait == 3.0
    assert not second.done()
    lease.release()
    assert (await second).queue_wait == 2.0


async def test_queue_timeout_fires_exactly_at_the_deadline() -> None:
    clock = FakeClock(start=100.0)
    scheduler = AdmissionScheduler(policy(queue_timeout_ms=1500), clock=clock)
    await scheduler.admit("m")
    waiter = asyncio.create_task(scheduler.admit("m"))
    await until(waiting(scheduler, 1))
    assert clock.armed == [101.5]
    clock.advance_to(101.499)
    await asyncio.sleep(0)
    assert not waiter.done()
    clock.advance_to(101.5)
    with pytest.raises(AdmissionError) as caught:
        await waiter
    assert caught.value.reason == "queue_timeout"
    assert str(caught.value) == (
        "the request waited 1.500 s in the admission queue, past queue_timeout_ms 1500"
    )
    stats = scheduler.statistics()
    assert (stats.queue_depth, stats.expired) == (0, 1)


async def test_one_timer_is_armed_for_the_nearest_deadline() -> None:
    clock = FakeClock()
    scheduler = AdmissionScheduler(policy(queue_timeout_ms=1000), clock=clock)
    held = await scheduler.admit("m")
    waiters = []
    for i in range(3):
        waiters.append(asyncio.create_task(scheduler.admit("m")))
        await until(waiting(scheduler, i + 1))
        clock.advance(0.25)
    assert clock.armed == [1.0]
    assert scheduler.timer_deadline == 1.0
    # The head gets the slot; the timer armed for its deadline fires for nothing and re-arms.
    held.release()
    lease = await waiters[0]
    clock.advance_to(1.0)
    assert clock.armed == [1.25]
    assert not waiters[1].done()
    clock.advance_to(1.25)
    with pytest.raises(AdmissionError, match="queue_timeout_ms 1000"):
        await waiters[1]
    assert clock.armed == [1.5]
    lease.release()
    assert (await waiters[2]).queue_wait == 0.75
    assert scheduler.statistics().expired == 1


async def test_cancelled_waiter_leaves_the_queue_at_once() -> None:
    scheduler = AdmissionScheduler(policy(), clock=FakeClock())
    held = await scheduler.admit("m")
    gone = asyncio.create_task(scheduler.admit("m"))
    stays = asyncio.create_task(scheduler.admit("m"))
    await until(waiting(scheduler, 2))
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    stats = scheduler.statistics()
    assert (stats.queue_depth, stats.rejected["client_gone"]) == (1, 1)
    held.release()
    assert (await stays).provider_id == "a"


async def test_client_timeout_around_admit_counts_client_gone() -> None:
    clock = FakeClock()
    scheduler = AdmissionScheduler(policy(), clock=clock)
    await scheduler.admit("m")

    async def impatient() -> None:
        async with asyncio.timeout(None) as scope:
            scope.reschedule(asyncio.get_running_loop().time())  # expire at once, no real wait
            await scheduler.admit("m")

    with pytest.raises(TimeoutError):
        await impatient()
    stats = scheduler.statistics()
    assert (stats.queue_depth, stats.rejected["client_gone"]) == (0, 1)


@pytest.mark.parametrize(
    "cancel_first", [False, True], ids=["grant-then-cancel", "cancel-then-grant"]
)
async def test_slot_granted_to_a_waiter_cancelled_in_the_same_tick_goes_to_the_next(
    cancel_first: bool,
) -> None:
    scheduler = AdmissionScheduler(policy(), clock=FakeClock())
    held = await scheduler.admit("m")
    gone = asyncio.create_task(scheduler.admit("m"))
    nxt = asyncio.create_task(scheduler.admit("m"))
    await until(waiting(scheduler, 2))
    # Both happen in the same tick, before either task runs again.
    if cancel_first:
        gone.cancel()
        held.release()
    else:
        held.release()
        gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    await until(nxt.done)  # fails (rather than hangs) if the slot leaked with the cancelled one
    lease = nxt.result()
    assert lease.provider_id == "a"
    stats = scheduler.statistics()
    # Slot counts are exact: only nxt holds a slot; gone's grant was released, never twice.
    assert (stats.in_flight, stats.queue_depth, stats.double_releases) == (1, 0, 0)
    assert stats.admitted == 3
    assert stats.released == 2


async def test_policy_swap_raising_capacity_dispatches_waiters_at_once() -> None:
    scheduler = AdmissionScheduler(policy(capacity=1), clock=FakeClock())
    await scheduler.admit("m")
    waiters = [asyncio.create_task(scheduler.admit("m")) for _ in range(3)]
    await until(waiting(scheduler, 3))
    scheduler.apply_policy(policy(capacity=3))
    assert [(await w).provider_id for w in waiters[:2]] == ["a", "a"]
    assert not waiters[2].done()
    assert scheduler.policy.providers[0].capacity == 3
    waiters[2].cancel()


async def test_policy_swap_adding_a_provider_to_the_group_dispatches_waiters() -> None:
    scheduler = AdmissionScheduler(policy(), clock=FakeClock())
    await scheduler.admit("m")
    waiter = asyncio.create_task(scheduler.admit("m"))
    await until(waiting(scheduler, 1))
    scheduler.apply_policy(policy(groups={"m": ("a", "b")}))
    assert (await waiter).provider_id == "b"


async def test_policy_swap_removing_the_group_fails_waiters_as_config_change() -> None:
    scheduler = AdmissionScheduler(policy(groups={"m": ("a",), "k": ("b",)}), clock=FakeClock())
    held = await scheduler.admit("m")
    removed = asyncio.create_task(scheduler.admit("m"))
    await until(waiting(scheduler, 1))
    scheduler.apply_policy(policy(groups={"k": ("b",)}))
    with pytest.raises(AdmissionError) as caught:
        await removed
    assert (caught.value.reason, caught.value.config_change) == ("model_not_found", True)
    held.release()  # the lease survives the swap and releases cleanly
    stats = scheduler.statistics()
    assert (stats.in_flight, stats.rejected["config_change"]) == (0, 1)


async def test_policy_swap_disabling_the_last_provider_fails_waiters_as_config_change() -> None:
    scheduler = AdmissionScheduler(policy(), clock=FakeClock())
    await scheduler.admit("m")
    waiter = asyncio.create_task(scheduler.admit("m"))
    await until(waiting(scheduler, 1))
    scheduler.apply_policy(policy(enabled=False))
    with pytest.raises(AdmissionError) as caught:
        await waiter
    assert (caught.value.reason, caught.value.config_change) == ("no_available_provider", True)


async def test_policy_swap_shortening_the_timeout_expires_waiters_and_rearms() -> None:
    clock = FakeClock()
    scheduler = AdmissionScheduler(policy(queue_timeout_ms=10_000), clock=clock)
    await scheduler.admit("m")
    old = asyncio.create_task(scheduler.admit("m"))
    await until(waiting(scheduler, 1))
    clock.advance(3.0)
    young = asyncio.create_task(scheduler.admit("m"))
    await until(waiting(scheduler, 2))
    assert clock.armed == [10.0]
    scheduler.apply_policy(policy(queue_timeout_ms=2_000))  # old is past 0 + 2 s already
    with pytest.raises(AdmissionError, match="queue_timeout_ms 2000"):
        await old
    assert clock.armed == [5.0]  # the stale 10 s timer was replaced by young's new deadline
    clock.advance_to(5.0)
    with pytest.raises(AdmissionError) as caught:
        await young
    assert caught.value.reason == "queue_timeout"


async def test_monotonic_clock_follows_the_loop_and_its_timers_can_be_cancelled() -> None:
    loop = asyncio.get_running_loop()
    clock = MonotonicClock()
    assert clock.now() <= loop.time()
    fired: list[float] = []
    due = clock.now()
    clock.call_at(due, lambda: fired.append(loop.time()))
    cancel = clock.call_at(due, lambda: fired.append(-1.0))
    cancel()
    await until(lambda: bool(fired))
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(fired) == 1
    assert fired[0] >= due


async def test_monotonic_clock_never_runs_a_timer_early(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    real_call_at = loop.call_at
    scheduled: list[asyncio.TimerHandle | asyncio.Handle] = []

    def early_once(
        when: float, callback: Callable[..., object], *args: object, **kwargs: object
    ) -> asyncio.Handle:
        # The first timer fires at once, as asyncio may do within its clock resolution.
        handle = loop.call_soon(callback, *args) if not scheduled else real_call_at(when, callback)
        scheduled.append(handle)
        return handle

    monkeypatch.setattr(loop, "call_at", early_once)
    fired: list[float] = []
    cancel = MonotonicClock().call_at(loop.time() + 3600.0, lambda: fired.append(loop.time()))
    await until(lambda: len(scheduled) == 2)
    assert fired == []  # it woke early, saw the time, and re-armed for the real deadline
    cancel()
    assert scheduled[1].cancelled()


async def test_admission_uses_the_real_clock_by_default() -> None:
    scheduler = AdmissionScheduler(policy(queue_timeout_ms=60_000))
    held = await scheduler.admit("m")
    waiter = asyncio.create_task(scheduler.admit("m"))
    await until(waiting(scheduler, 1))
    deadline = scheduler.timer_deadline
    assert deadline is not None
    assert 59.0 < deadline - asyncio.get_running_loop().time() <= 60.0
    held.release()
    (await waiter).release()


def test_fake_clock_fires_timers_in_order_at_their_own_time() -> None:
    clock = FakeClock(start=5.0)
    seen: list[tuple[str, float]] = []
    clock.call_at(7.0, lambda: seen.append(("b", clock.now())))
    clock.call_at(6.0, lambda: seen.append(("a", clock.now())))
    cancel = clock.call_at(6.5, lambda: seen.append(("cancelled", clock.now())))
    cancel()
    assert clock.armed == [6.0, 7.0]
    clock.advance(1.5)
    assert (seen, clock.now()) == ([("a", 6.0)], 6.5)
    clock.advance_to(10.0)
    assert (seen, clock.now(), clock.armed) == ([("a", 6.0), ("b", 7.0)], 10.0, [])
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance(-1.0)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance_to(9.0)


async def test_idle_probes_run_through_the_prober_from_start_until_aclose():
    """Once started, the shell runs the idle probes the core asks for through its prober on
    the one timer and feeds the results back; after ``aclose`` no probe starts and no timer
    is left armed."""
    clock = FakeClock(50.0)
    asked: list[tuple[str, str]] = []

    async def prober(key: tuple[str, str]) -> tuple[bool, str | None]:
        asked.append(key)
        return False, "GET /models: connection refused"

    probed = dataclasses.replace(
        policy(),
        providers=(
            ProviderPolicy("n1", "a", 1, 1, 0, True, probe=True),
            ProviderPolicy("n1", "b", 1, 1, 0, True),
        ),
    )
    scheduler = AdmissionScheduler(probed, clock=clock, prober=prober)
    clock.advance(10.0)
    assert (asked, clock.armed) == ([], [])  # not started: nothing idle is probed
    scheduler.start()
    assert clock.armed == [62.0]
    clock.advance(2.0)
    await until(lambda: scheduler.statistics().providers[0].probes_failed == 1)
    assert asked == [("n1", "a")]  # never b: it has no health check
    assert clock.armed == [64.0]
    await scheduler.aclose()
    assert clock.armed == []
    clock.advance(10.0)
    await asyncio.sleep(0)
    assert asked == [("n1", "a")]


async def test_set_connected_dispatches_waiters_on_a_link_back_and_releases_no_lease() -> None:
    """A remote provider (issue 29): requests wait while its node link is down and get its
    slot as soon as it is up; a link going down refuses the failover that waited only for it
    (``failover`` returns ``None``) but leaves its lease to the holder, released once."""
    events: list[tuple[object, HealthEvent]] = []
    remote = PoolPolicy(
        max_queue=8,
        queue_timeout_ms=5000,
        providers=(
            ProviderPolicy("n1", "a", 1, 1, 0, True),
            ProviderPolicy("far", "r", 1, 1, 1, True, remote=True),
        ),
        groups={"m": (("n1", "a"), ("far", "r"))},
    )
    scheduler = AdmissionScheduler(
        remote, clock=FakeClock(), on_health=lambda subject, event: events.append((subject, event))
    )
    on_a = await scheduler.admit("m")
    assert on_a.key == ("n1", "a")
    task = asyncio.create_task(scheduler.admit("m"))
    await until(waiting(scheduler, 1))  # r is disconnected: the request waits
    scheduler.set_connected("far", True)
    await until(task.done)
    on_r = task.result()
    assert on_r.key == ("far", "r")
    assert events == [(("far", "r"), HealthEvent("connected"))]

    retry = asyncio.create_task(scheduler.failover(on_a, Failure("connect", "connection refused")))
    await until(waiting(scheduler, 1))  # it waits for r, the one provider it has not tried
    scheduler.set_connected("far", False)
    await until(retry.done)
    assert retry.result() is None  # the caller answers with the failed attempt's error
    assert events[-1] == (("far", "r"), HealthEvent("disconnected"))
    assert not on_r.released
    stats = scheduler.statistics()
    assert (stats.in_flight, stats.released, stats.queue_depth) == (1, 1, 0)
    assert stats.providers[1].health == "disconnected"
    on_r.release()
    on_r.release()
    stats = scheduler.statistics()
    assert (stats.in_flight, stats.released, stats.double_releases) == (0, 2, 1)

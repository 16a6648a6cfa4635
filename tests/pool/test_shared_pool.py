"""The pure scheduler's side of a pool shared by several edges: leases held elsewhere count
against capacities and principal caps (``set_elsewhere``), a dispatch the store refused goes
back to its place (``requeue``), a static split's check (``within``), and who counts the
per-minute rates (``set_rate_share``). The store itself is tested in ``tests/shared``."""

from __future__ import annotations

import dataclasses

import pytest

from iop_edge.pool import PoolScheduler, RequestState
from tests.helpers.pool import (
    check_counters,
    dispatched,
    key,
    lease_of,
    pool,
    provider,
    queued,
    rejected,
    shown,
)


def test_leases_held_elsewhere_count_against_capacity_and_are_shown_beside_it() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=4, long=2)]))
    assert scheduler.set_elsewhere({key("a"): (3, 1)}, {}, 0.0) == []
    lease_of(scheduler)
    queued(scheduler)  # 1 here + 3 elsewhere = 4: full
    stats = shown(scheduler, "a")
    assert (stats.capacity, stats.long_context_capacity) == (4, 2)
    assert (stats.held_elsewhere, stats.long_held_elsewhere) == (3, 1)
    assert stats.in_flight == 1


def test_fewer_leases_elsewhere_dispatch_the_waiters_at_once_oldest_first() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=2)]))
    scheduler.set_elsewhere({key("a"): (2, 0)}, {}, 0.0)
    first = queued(scheduler, now=0.1)
    second = queued(scheduler, now=0.2)
    third = queued(scheduler, now=0.3)
    decisions = scheduler.set_elsewhere({key("a"): (0, 0)}, {}, 1.0)
    assert dispatched(decisions) == [(first.request_id, "a"), (second.request_id, "a")]
    assert third.state is RequestState.PENDING
    check_counters(scheduler)


def test_more_leases_elsewhere_than_capacity_cancel_nothing_and_admit_nothing() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=2)]))
    held = lease_of(scheduler)
    assert scheduler.set_elsewhere({key("a"): (5, 0)}, {}, 0.0) == []
    assert held.request.state is RequestState.DISPATCHED
    queued(scheduler)
    assert shown(scheduler, "a").in_flight == 1


def test_long_context_leases_elsewhere_count_against_the_long_slots_only() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=3, long=1)]))
    scheduler.set_elsewhere({key("a"): (1, 1)}, {}, 0.0)
    queued(scheduler, long=True)  # the one long slot is held elsewhere
    lease_of(scheduler)  # a general one is free
    decisions = scheduler.set_elsewhere({key("a"): (1, 0)}, {}, 1.0)
    assert [pid for _, pid in dispatched(decisions)] == ["a"]


def test_held_elsewhere_survives_a_live_policy_change() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=2)]))
    scheduler.set_elsewhere({key("a"): (2, 0)}, {}, 0.0)
    scheduler.apply_policy(pool([provider("a", capacity=3)]), 1.0)
    lease_of(scheduler)
    queued(scheduler)  # 3 - 2 elsewhere = 1 here
    assert shown(scheduler, "a").capacity == 3


def test_a_principal_holding_its_cap_elsewhere_waits_and_goes_when_it_drops() -> None:
    policy = dataclasses.replace(
        pool([provider("a", capacity=4)]), caps={"app": 2}, principals=("app",)
    )
    scheduler = PoolScheduler(policy)
    scheduler.set_elsewhere({}, {"app": 2}, 0.0)
    waiting = scheduler.submit("m", now=0.0, principal="app").request
    assert waiting.state is RequestState.PENDING
    other = scheduler.submit("m", now=0.1, principal="other").request
    assert other.state is RequestState.DISPATCHED  # a capped principal holds back nobody
    decisions = scheduler.set_elsewhere({}, {"app": 1}, 1.0)
    assert dispatched(decisions) == [(waiting.request_id, "a")]
    stats = next(p for p in scheduler.statistics().principals if p.principal == "app")
    assert (stats.max_in_flight, stats.in_flight, stats.in_flight_elsewhere) == (2, 1, 1)


def test_a_refused_dispatch_goes_back_to_its_place_with_its_deadline() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=1)], queue_timeout_ms=5000))
    holder = lease_of(scheduler, now=0.0)
    older = queued(scheduler, now=0.1)
    younger = queued(scheduler, now=0.2)
    decisions = scheduler.release(holder, 1.0)
    assert dispatched(decisions) == [(older.request_id, "a")]
    refused = older.lease
    assert refused is not None
    # The store says another edge took the slot: the request is back, first, and waits.
    scheduler.set_elsewhere({key("a"): (1, 0)}, {}, 1.1)
    assert scheduler.requeue(refused, 1.1) == []
    assert older.state is RequestState.PENDING
    assert older.deadline == pytest.approx(5.1)
    stats = scheduler.statistics()
    assert (stats.queue_depth, stats.admitted, stats.in_flight) == (2, 1, 0)
    check_counters(scheduler)
    decisions = scheduler.set_elsewhere({key("a"): (0, 0)}, {}, 2.0)
    assert dispatched(decisions) == [(older.request_id, "a")]
    assert younger.state is RequestState.PENDING
    # Its deadline still holds once it waits again.
    assert older.lease is not None
    scheduler.set_elsewhere({key("a"): (1, 0)}, {}, 2.1)
    scheduler.requeue(older.lease, 2.1)
    expired = scheduler.expire(5.1)
    assert [(rid, reason) for rid, reason, _ in rejected(expired)] == [
        (older.request_id, "queue_timeout")
    ]


def test_a_refused_request_dispatched_at_once_still_goes_before_later_arrivals() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=1)]))
    lease = lease_of(scheduler, now=0.0)
    later = queued(scheduler, now=0.5)
    scheduler.set_elsewhere({key("a"): (1, 0)}, {}, 1.0)
    scheduler.requeue(lease, 1.0)
    decisions = scheduler.set_elsewhere({key("a"): (0, 0)}, {}, 2.0)
    assert dispatched(decisions) == [(lease.request.request_id, "a")]
    assert later.state is RequestState.PENDING


def test_a_refused_dispatch_takes_another_free_provider_of_its_group_at_once() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=1), provider("b", capacity=1)]))
    lease = lease_of(scheduler)
    assert lease.provider_id == "a"
    scheduler.set_elsewhere({key("a"): (1, 0)}, {}, 0.0)
    decisions = scheduler.requeue(lease, 0.0)
    assert dispatched(decisions) == [(lease.request.request_id, "b")]
    check_counters(scheduler)


def test_a_requeue_with_a_refusal_answers_store_unavailable() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=1)]))
    lease = lease_of(scheduler)
    waiting = queued(scheduler)
    decisions = scheduler.requeue(lease, 1.0, "the shared store is out of reach")
    assert rejected(decisions)[0] == (lease.request.request_id, "store_unavailable", False)
    assert dispatched(decisions) == [(waiting.request_id, "a")]
    assert scheduler.statistics().rejected["store_unavailable"] == 1
    check_counters(scheduler)


def test_requeue_refuses_a_lease_already_released() -> None:
    scheduler = PoolScheduler(pool([provider("a")]))
    lease = lease_of(scheduler)
    scheduler.release(lease, 0.0)
    with pytest.raises(ValueError, match="already released"):
        scheduler.requeue(lease, 0.0)


def test_within_says_whether_a_lease_fits_a_static_split() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=4)]))
    leases = [lease_of(scheduler) for _ in range(3)]
    scheduler.set_elsewhere({key("a"): (2, 0)}, {}, 0.0)  # a split of 4 in two: 2 here
    assert not scheduler.within(leases[0])
    scheduler.release(leases[0], 0.1)
    assert scheduler.within(leases[1])


def test_the_store_takes_the_rates_or_a_split_of_them() -> None:
    policy = dataclasses.replace(
        pool([provider("a", capacity=100)]), per_minute={"app": 4}, principals=("app",)
    )
    scheduler = PoolScheduler(policy)
    scheduler.set_rate_share(None)  # the store counts: nothing refused here
    for _ in range(6):
        assert scheduler.submit("m", now=0.0, principal="app").request.state is not (
            RequestState.REJECTED
        )
    refused = scheduler.submit("m", now=0.0, principal="app", over_rate=2.5)
    rejection = refused.request.rejection
    assert rejection is not None
    assert rejection.reason.value == "rate_limit_exceeded"
    assert rejection.retry_after == 2.5
    scheduler.set_rate_share(2)  # a split among two edges: 2 a minute here
    states = [scheduler.submit("m", now=1.0, principal="app").request.state for _ in range(3)]
    assert states.count(RequestState.REJECTED) == 1

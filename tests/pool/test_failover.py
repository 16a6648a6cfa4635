"""Failover in the pure scheduler (SPEC §5.1): ``fail()`` retrying on an untried provider ahead
of the queue, keeping the request's arrival time; and live policy changes with health.
"""

from __future__ import annotations

import pytest

from iop_edge.pool import (
    OK,
    GroupStatistics,
    HealthPolicy,
    PoolScheduler,
    RequestState,
)
from tests.helpers.pool import (
    BAD_GATEWAY,
    REFUSED,
    check_counters,
    dispatched,
    eject,
    key,
    lease_of,
    panic,
    pool,
    provider,
    queued,
    rejected,
    shown,
)

# -- failover ------------------------------------------------------------------------------------


def test_fail_retries_on_an_untried_provider_and_releases_the_failed_lease_once() -> None:
    scheduler = PoolScheduler(pool([provider("a"), provider("b", priority=1)]))
    lease = lease_of(scheduler)
    request = lease.request
    result = scheduler.fail(lease, BAD_GATEWAY, 0.25)
    assert (result.request, result.retried) == (request, True)
    assert dispatched(result.decisions) == [(request.request_id, "b")]
    assert request.lease is not None
    assert request.lease.provider_id == "b"
    assert (request.attempts, request.tried, request.state) == (
        2,
        frozenset({key("a")}),
        RequestState.DISPATCHED,
    )
    assert lease.released
    assert repr(request) == "PendingRequest(#1 'm' general attempt 2 dispatched deadline=None)"
    assert shown(scheduler, "a").consecutive_failures == 1
    with pytest.raises(ValueError, match="already released"):
        scheduler.fail(lease, BAD_GATEWAY, 0.25)
    assert scheduler.release(lease, 0.25) == []
    stats = scheduler.statistics()
    assert (stats.released, stats.double_releases, stats.failovers, stats.admitted) == (1, 1, 1, 2)
    check_counters(scheduler)


def test_fail_of_a_lease_from_another_scheduler_is_refused() -> None:
    policy = pool([provider("a")])
    lease = lease_of(PoolScheduler(policy))
    with pytest.raises(ValueError, match="not granted by this scheduler"):
        PoolScheduler(policy).fail(lease, REFUSED, 0.0)


def test_a_retry_never_goes_to_a_provider_it_already_tried() -> None:
    scheduler = PoolScheduler(
        pool([provider("a", capacity=2), provider("b", capacity=2, priority=1)], max_attempts=3)
    )
    lease = lease_of(scheduler)
    assert lease.provider_id == "a"
    first = scheduler.fail(lease, REFUSED, 0.0)
    assert dispatched(first.decisions) == [(lease.request.request_id, "b")]
    second_lease = lease.request.lease
    assert second_lease is not None
    # Attempts remain (3) and a is free, preferred and healthy, but already tried.
    second = scheduler.fail(second_lease, REFUSED, 0.0)
    assert (second.retried, second.decisions) == (False, [])
    assert lease.request.state is RequestState.DISPATCHED  # the caller returns the error
    assert shown(scheduler, "a").in_flight == shown(scheduler, "b").in_flight == 0
    stats = scheduler.statistics()
    assert (stats.failovers, stats.released) == (1, 2)
    check_counters(scheduler)


def test_no_retry_when_max_attempts_are_used_up() -> None:
    scheduler = PoolScheduler(pool([provider("a"), provider("b")], max_attempts=1))
    lease = lease_of(scheduler)
    assert lease.provider_id == "a"
    result = scheduler.fail(lease, REFUSED, 0.0)  # b is free, untried and healthy
    assert (result.retried, result.decisions) == (False, [])
    assert lease.request.state is RequestState.DISPATCHED
    stats = scheduler.statistics()
    assert (stats.failovers, stats.released, shown(scheduler, "b").in_flight) == (0, 1, 0)
    check_counters(scheduler)


def test_no_retry_when_no_untried_candidate_exists() -> None:
    scheduler = PoolScheduler(pool([provider("a"), provider("b", priority=1)]))
    eject(scheduler, "a")  # a out, b is the only one left
    lease = lease_of(scheduler)
    assert lease.provider_id == "b"
    result = scheduler.fail(lease, REFUSED, 0.0)
    # a is ejected and the group is not in panic (b has one failure only): nothing to try.
    assert not panic(scheduler)
    assert (result.retried, result.decisions) == (False, [])
    assert scheduler.statistics().failovers == 0
    check_counters(scheduler)


def test_a_retry_goes_ahead_of_older_queued_requests_and_keeps_its_deadline() -> None:
    # g1 only reaches a; g2 reaches a and b. The g1 request queued first is older.
    scheduler = PoolScheduler(
        pool(
            [provider("a"), provider("b")],
            {"g1": ["a"], "g2": ["a", "b"]},
            queue_timeout_ms=4000,
        )
    )
    on_a = lease_of(scheduler, "g1", now=0.0)
    older = queued(scheduler, "g1", now=0.5)
    lease = lease_of(scheduler, "g2", now=1.0)
    assert (on_a.provider_id, lease.provider_id) == ("a", "b")
    retry = lease.request
    result = scheduler.fail(lease, BAD_GATEWAY, 1.5)
    assert (result.retried, result.decisions) == (True, [])
    assert (retry.state, retry.deadline, retry.submitted_at) == (RequestState.PENDING, 5.0, 1.0)
    assert repr(retry) == "PendingRequest(#3 'g2' general attempt 2 pending deadline=5.0)"
    assert scheduler.next_deadline() == 4.5  # the older one's; the retry's is 5.0
    decisions = scheduler.release(on_a, 2.0, OK)
    assert dispatched(decisions) == [(retry.request_id, "a")]
    assert older.state is RequestState.PENDING
    check_counters(scheduler)


def test_a_retry_goes_ahead_of_queued_requests_when_its_failure_starts_a_panic() -> None:
    """The failure ejects the last member not out: the panic opens a, and the retry gets it
    before the request queued for it meanwhile."""
    scheduler = PoolScheduler(pool([provider("a"), provider("b", long=0, priority=1)]))
    eject(scheduler, "a")
    scheduler.release(lease_of(scheduler), 0.0, REFUSED)  # b: 1 failure of 2
    lease = lease_of(scheduler)
    assert lease.provider_id == "b"
    younger = queued(scheduler, long=True, now=0.25)  # a is ejected, b has no long slot
    result = scheduler.fail(lease, REFUSED, 0.5)  # b's second failure: ejected, panic
    assert panic(scheduler)
    assert result.retried
    assert dispatched(result.decisions) == [(lease.request.request_id, "a")]
    assert younger.state is RequestState.PENDING


def test_a_retry_past_its_deadline_without_a_free_slot_is_not_retried() -> None:
    """It would only wait to time out: the failed attempt's error is the client's answer (not
    a queue_timeout for a request that never queued), and nothing counts it as queued."""
    scheduler = PoolScheduler(
        pool([provider("a"), provider("b", priority=1)], queue_timeout_ms=1000)
    )
    lease = lease_of(scheduler, now=0.0)
    lease_of(scheduler, now=0.0)  # b busy
    result = scheduler.fail(lease, REFUSED, 1.0)
    assert not result.retried
    assert result.decisions == []
    stats = scheduler.statistics()
    assert (stats.failovers, stats.rejected["queue_timeout"], stats.queue_depth) == (0, 0, 0)
    check_counters(scheduler)


def test_a_retry_past_its_deadline_with_a_free_slot_is_dispatched() -> None:
    """The queue timeout bounds waiting in the queue; a retry that need not wait is served."""
    scheduler = PoolScheduler(
        pool([provider("a"), provider("b", priority=1)], queue_timeout_ms=1000)
    )
    lease = lease_of(scheduler, now=0.0)
    result = scheduler.fail(lease, REFUSED, 2.0)
    assert dispatched(result.decisions) == [(lease.request.request_id, "b")]


def test_a_waiting_retry_expires_at_its_original_deadline() -> None:
    scheduler = PoolScheduler(
        pool([provider("a"), provider("b", priority=1)], queue_timeout_ms=1000)
    )
    lease = lease_of(scheduler, now=0.0)
    lease_of(scheduler, now=0.25)
    scheduler.fail(lease, REFUSED, 0.5)
    assert scheduler.next_event() == 1.0
    assert scheduler.expire(0.75) == []
    assert rejected(scheduler.expire(1.0)) == [(lease.request.request_id, "queue_timeout", False)]
    check_counters(scheduler)


def test_a_retry_waiting_without_queue_timeout_has_no_deadline() -> None:
    """Its deadline comes from the policy in force when it re-enters the queue: a timeout set
    to 0 since it first waited leaves it none (not the old one)."""
    scheduler = PoolScheduler(pool([provider("a"), provider("b")], queue_timeout_ms=1000))
    on_a = lease_of(scheduler)
    lease_of(scheduler)
    request = queued(scheduler)
    assert request.deadline == 1.0
    scheduler.release(on_a, 0.25, OK)
    assert request.lease is not None
    assert request.lease.provider_id == "a"
    scheduler.apply_policy(pool([provider("a"), provider("b")], queue_timeout_ms=0), 0.25)
    lease = request.lease
    result = scheduler.fail(lease, REFUSED, 0.5)  # b is busy: it waits
    assert result.retried
    assert request.state is RequestState.PENDING
    assert request.deadline is None
    assert scheduler.next_deadline() is None


def test_max_queue_does_not_apply_to_retries() -> None:
    scheduler = PoolScheduler(
        pool(
            [provider("a"), provider("b"), provider("c")],
            {"m": ["a", "b"], "g": ["c"]},
            max_queue=1,
        )
    )
    on_a = lease_of(scheduler)
    lease_of(scheduler)
    lease_of(scheduler, "g")
    queued(scheduler, "g")
    full = scheduler.submit("m", now=0.0)
    assert rejected(full.decisions) == [(full.request.request_id, "queue_full", False)]
    result = scheduler.fail(on_a, REFUSED, 0.0)  # b is busy: the retry waits, queue or not
    assert result.retried
    assert on_a.request.state is RequestState.PENDING
    assert scheduler.queue_depth == 2
    check_counters(scheduler)


def test_waiting_retries_are_served_oldest_first_by_arrival() -> None:
    """Two requests fail over in the reverse order of their arrival; the older is served
    first when a provider both can use frees up."""
    scheduler = PoolScheduler(
        pool([provider("a", long=0), provider("b"), provider("c"), provider("d")])
    )
    old = lease_of(scheduler)
    young = lease_of(scheduler, long=True)  # a has no long slot
    on_c, on_d = lease_of(scheduler), lease_of(scheduler)
    assert [x.provider_id for x in (old, young, on_c, on_d)] == ["a", "b", "c", "d"]
    takes_b, takes_a = queued(scheduler), queued(scheduler)
    scheduler.fail(young, REFUSED, 0.0)
    scheduler.fail(old, REFUSED, 0.0)
    assert [r.lease.provider_id for r in (takes_a, takes_b) if r.lease] == ["a", "b"]
    assert old.request.state is young.request.state is RequestState.PENDING
    assert dispatched(scheduler.release(on_c, 0.25, OK)) == [(old.request.request_id, "c")]
    assert dispatched(scheduler.release(on_d, 0.25, OK)) == [(young.request.request_id, "d")]


def test_a_waiting_retry_whose_last_untried_provider_is_ejected_fails_no_available_provider() -> (
    None
):
    scheduler = PoolScheduler(pool([provider("a"), provider("b", priority=1)]))
    warm_up = lease_of(scheduler)
    scheduler.release(warm_up, 0.0, OK)
    on_a = lease_of(scheduler)
    scheduler.release(lease_of(scheduler), 0.0, REFUSED)  # b: 1 failure of 2
    on_b = lease_of(scheduler)
    assert (on_a.provider_id, on_b.provider_id) == ("a", "b")
    result = scheduler.fail(on_a, REFUSED, 0.25)  # a: 1 failure; b busy: the retry waits
    assert result.retried
    assert on_a.request.state is RequestState.PENDING
    decisions = scheduler.release(on_b, 0.5, REFUSED)  # b ejected; a is not: no panic
    assert not panic(scheduler)
    assert rejected(decisions) == [(on_a.request.request_id, "no_available_provider", False)]
    assert on_a.request.rejection is not None
    assert "has not tried" in on_a.request.rejection.message
    assert scheduler.queue_depth == 0
    check_counters(scheduler)


@pytest.mark.parametrize("change", ["disabled", "removed"])
def test_a_waiting_retry_whose_last_untried_provider_leaves_the_policy_fails(change: str) -> None:
    scheduler = PoolScheduler(pool([provider("a"), provider("b")]))
    on_a = lease_of(scheduler)
    lease_of(scheduler)
    scheduler.fail(on_a, REFUSED, 0.0)
    assert on_a.request.state is RequestState.PENDING
    b = provider("b", enabled=change != "disabled")
    groups = {"m": ["a", "b"] if change == "disabled" else ["a"]}
    decisions = scheduler.apply_policy(pool([provider("a"), b], groups), 0.25)
    assert rejected(decisions) == [(on_a.request.request_id, "no_available_provider", True)]
    assert scheduler.statistics().rejected["config_change"] == 1
    check_counters(scheduler)


def test_a_waiting_retry_can_be_cancelled_by_its_client() -> None:
    scheduler = PoolScheduler(pool([provider("a"), provider("b")]))
    on_a = lease_of(scheduler)
    lease_of(scheduler)
    scheduler.fail(on_a, REFUSED, 0.0)
    decisions = scheduler.cancel(on_a.request, 0.25)
    assert rejected(decisions) == [(on_a.request.request_id, "client_gone", False)]
    check_counters(scheduler)


def test_fail_of_a_lease_on_a_removed_provider_still_retries() -> None:
    scheduler = PoolScheduler(pool([provider("a"), provider("b")]))
    on_a = lease_of(scheduler)
    scheduler.apply_policy(pool([provider("b")]), 0.0)
    result = scheduler.fail(on_a, REFUSED, 0.25)
    assert dispatched(result.decisions) == [(on_a.request.request_id, "b")]
    assert [p.provider_id for p in scheduler.statistics().providers] == ["b"]


# -- live policy ----------------------------------------------------------------------------------


def test_apply_policy_keeps_health_and_a_provider_disabled_then_enabled_starts_unknown() -> None:
    scheduler = PoolScheduler(pool([provider("a"), provider("b", priority=1)]))
    eject(scheduler, "a")
    scheduler.apply_policy(pool([provider("a", capacity=3), provider("b", priority=1)]), 0.25)
    a = shown(scheduler, "a")
    assert (a.health, a.ejected_until, a.ejections, a.consecutive_failures, a.capacity) == (
        "unhealthy",
        1.0,
        1,
        2,
        3,
    )
    assert scheduler.next_event() == 1.0
    scheduler.apply_policy(pool([provider("a", enabled=False), provider("b", priority=1)]), 0.5)
    assert shown(scheduler, "a").health == "disabled"
    scheduler.apply_policy(pool([provider("a"), provider("b", priority=1)]), 0.75)
    a = shown(scheduler, "a")
    assert (a.health, a.ejected_until, a.ejections, a.consecutive_failures) == (
        "unknown",
        None,
        0,
        0,
    )
    assert lease_of(scheduler, now=0.75).provider_id == "a"
    assert scheduler.expire(1.0) == []  # the old ejection's timer does nothing
    assert shown(scheduler, "a").health == "unknown"


def test_a_live_max_attempts_change_applies_to_the_next_failure() -> None:
    providers = [provider("a", capacity=2), provider("b", capacity=2, priority=1)]
    scheduler = PoolScheduler(pool(providers, max_attempts=1))
    assert not scheduler.fail(lease_of(scheduler), REFUSED, 0.0).retried
    scheduler.apply_policy(pool(providers, max_attempts=2), 0.0)
    assert scheduler.fail(lease_of(scheduler), REFUSED, 0.0).retried


def test_a_live_health_policy_change_applies_to_the_next_ejection() -> None:
    providers = [provider("a"), provider("b", priority=1)]
    scheduler = PoolScheduler(pool(providers))
    strict = HealthPolicy(failure_threshold=1, eject_ms=500, max_eject_ms=500)
    scheduler.apply_policy(pool(providers, health=strict), 0.0)
    scheduler.release(lease_of(scheduler), 0.0, REFUSED)
    assert shown(scheduler, "a").ejected_until == 0.5


def test_statistics_show_health_and_keep_the_counter_invariant_through_failovers() -> None:
    scheduler = PoolScheduler(
        pool([provider("a", probe=True), provider("b", priority=1)], queue_timeout_ms=1000)
    )
    eject(scheduler, "a")
    on_b = lease_of(scheduler)
    check_counters(scheduler)
    assert not scheduler.fail(on_b, REFUSED, 0.0).retried  # a is ejected: nothing to try
    on_b = lease_of(scheduler)
    waiting = queued(scheduler)
    scheduler.expire(0.25)
    scheduler.probed(key("a"), True, None, 0.25)
    assert waiting.lease is not None
    assert waiting.lease.provider_id == "a"
    result = scheduler.fail(waiting.lease, BAD_GATEWAY, 0.5)
    assert result.retried
    assert waiting.state is RequestState.PENDING
    check_counters(scheduler)
    scheduler.release(on_b, 0.75, OK)
    assert waiting.lease is not None
    assert waiting.lease.provider_id == "b"
    stats = scheduler.statistics()
    assert (stats.submitted, stats.admitted, stats.failovers, stats.queue_depth) == (5, 6, 1, 0)
    assert (stats.released, stats.rejected_total) == (5, 0)
    check_counters(scheduler)
    a = shown(scheduler, "a")
    assert (a.health, a.consecutive_failures, a.last_failure, a.ejections, a.probes_ok) == (
        "healthy",
        1,
        BAD_GATEWAY.reason,
        1,
        1,
    )
    b = shown(scheduler, "b")
    assert (b.health, b.consecutive_failures, b.in_flight) == ("healthy", 0, 1)
    assert scheduler.statistics().groups == (GroupStatistics("m", 2, False),)

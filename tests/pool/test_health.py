"""Unit tests of provider health and failover (SPEC §5.1) in the pure core.

First :class:`ProviderHealth` alone (times passed in), then the :class:`PoolScheduler`: ejection
and recovery as admission sees them, the half-open trial, 429 holds, panic, and ``fail()``
retrying ahead of the queue. Times are binary fractions so exact comparisons hold.
"""

from __future__ import annotations

import pytest

from iop_edge.pool import (
    OK,
    PROBE,
    Decision,
    Dispatch,
    Failure,
    GroupStatistics,
    HealthEvent,
    HealthPolicy,
    PendingRequest,
    PoolPolicy,
    PoolScheduler,
    ProviderKey,
    ProviderPolicy,
    ProviderStatistics,
    Rejection,
    RequestState,
    SlotLease,
)
from iop_edge.pool.health import ProviderHealth

POLICY = HealthPolicy(failure_threshold=2, eject_ms=1000, max_eject_ms=4000, probe_interval_ms=250)
"""Two failures eject for 1 s, then 2 s, then 4 s (the cap); probes every 0.25 s."""

REFUSED = Failure("connect", "connection refused")
BAD_GATEWAY = Failure("status_5xx", "the provider answered 502")
TIMEOUT = Failure("timeout", "no response head within 30 s")


def busy(retry_after: float | None = None) -> Failure:
    return Failure("status_429", "the provider answered 429", retry_after)


# -- ProviderHealth alone -----------------------------------------------------------------------


def ejected_health(*, can_probe: bool = False, now: float = 0.0) -> ProviderHealth:
    health = ProviderHealth(can_probe)
    for _ in range(POLICY.failure_threshold):
        health.failed(REFUSED, now, POLICY)
    assert health.ejected
    return health


def test_health_is_unknown_until_the_first_evidence() -> None:
    health = ProviderHealth(can_probe=True)
    assert (health.health, health.out, health.usable, health.next_time()) == (
        "unknown",
        False,
        True,
        None,
    )
    assert health.succeeded(0.0) is None  # unknown -> healthy is nothing to log
    assert health.health == "healthy"


def test_failure_threshold_consecutive_failures_eject_for_eject_ms() -> None:
    health = ProviderHealth(can_probe=False)
    assert health.failed(REFUSED, 0.0, POLICY) is None
    assert (health.health, health.failures, health.out) == ("unknown", 1, False)
    event = health.failed(BAD_GATEWAY, 0.5, POLICY)
    assert event == HealthEvent(
        "ejected", failures=2, reason="the provider answered 502", until=1.5
    )
    assert (health.health, health.ejected, health.out, health.usable) == (
        "unhealthy",
        True,
        True,
        False,
    )
    assert (health.ejected_until, health.ejections_total, health.next_time()) == (1.5, 1, 1.5)


def test_a_success_resets_the_consecutive_failures() -> None:
    health = ProviderHealth(can_probe=False)
    health.failed(REFUSED, 0.0, POLICY)
    health.succeeded(0.25)
    assert health.failures == 0
    assert health.failed(REFUSED, 0.5, POLICY) is None  # one in a row again, not two
    assert not health.ejected


def test_failures_while_ejected_do_not_extend_the_ejection() -> None:
    health = ejected_health()
    assert health.failed(TIMEOUT, 0.5, POLICY) is None  # a request still in flight failing
    assert (health.ejected_until, health.failures, health.ejections_total) == (1.0, 3, 1)


def test_an_answer_to_a_request_sent_before_the_ejection_changes_nothing() -> None:
    """A slow request started before the failures that ejected the provider says nothing about
    it now; one started during the ejection (a panic sends some) does."""
    health = ejected_health(now=2.0)
    assert health.succeeded(2.5, started=1.0) is None
    assert (health.ejected, health.ejected_until, health.failures) == (True, 3.0, 2)
    assert health.succeeded(2.5, started=2.25) == HealthEvent("recovered", via="request")
    assert health.health == "healthy"
    health = ejected_health(now=2.0)
    health.advance(3.0, POLICY)  # half-open: an old answer is no trial either
    assert health.succeeded(3.5, started=1.0) is None
    assert health.half_open


def test_without_probes_the_ejection_ends_half_open_with_one_trial() -> None:
    health = ejected_health(can_probe=False)
    assert health.advance(0.75, POLICY) == []
    assert health.advance(1.0, POLICY) == [HealthEvent("half_open", failures=2)]
    assert (health.health, health.half_open, health.out, health.usable) == (
        "unhealthy",
        True,
        False,
        True,
    )
    assert (health.ejected_until, health.next_time()) == (None, None)
    health.trial = "the trial lease"
    assert not health.usable  # one trial at a time


def test_half_open_trial_success_recovers_via_trial() -> None:
    health = ejected_health()
    health.advance(1.0, POLICY)
    assert health.succeeded(1.5) == HealthEvent("recovered", via="trial")
    assert (health.health, health.half_open, health.failures) == ("healthy", False, 0)


def test_half_open_failure_ejects_again_for_twice_as_long_capped_at_max_eject() -> None:
    health = ejected_health()
    untils = []
    now = 0.0
    for _ in range(4):
        now = health.ejected_until or now
        health.advance(now, POLICY)
        assert health.half_open
        event = health.failed(REFUSED, now, POLICY)  # one failure is enough when half-open
        assert event is not None
        assert event.kind == "ejected"
        untils.append(event.until)
    # 1 s, then 2 s, 4 s, and 4 s again: max_eject_ms caps the doubling.
    assert untils == [1.0 + 2.0, 3.0 + 4.0, 7.0 + 4.0, 11.0 + 4.0]
    assert health.ejections_total == 5


def test_any_failure_while_half_open_ejects_even_below_a_raised_threshold() -> None:
    health = ejected_health()  # two failures, threshold 2
    health.advance(1.0, POLICY)
    lenient = HealthPolicy(failure_threshold=5, eject_ms=1000, max_eject_ms=4000)
    event = health.failed(REFUSED, 1.0, lenient)  # 3 consecutive failures of 5
    assert event is not None
    assert event.kind == "ejected"
    assert health.ejected


def test_doubling_is_reset_by_a_request_success_not_by_a_probe() -> None:
    health = ejected_health(can_probe=True)  # 1st ejection: 1 s
    assert health.advance(0.25, POLICY) == [PROBE]
    assert health.probed(True, None, 0.5, POLICY) == HealthEvent("recovered", via="probe")
    health.failed(REFUSED, 1.0, POLICY)
    event = health.failed(REFUSED, 1.0, POLICY)
    assert event is not None
    assert event.until == 1.0 + 2.0
    assert health.advance(1.25, POLICY) == [PROBE]
    health.probed(True, None, 1.25, POLICY)
    health.succeeded(1.5)  # a real request answered: the doubling starts over
    health.failed(REFUSED, 2.0, POLICY)
    event = health.failed(REFUSED, 2.0, POLICY)
    assert event is not None
    assert event.until == 2.0 + 1.0


def test_probes_are_due_every_probe_interval_one_at_a_time() -> None:
    health = ejected_health(can_probe=True)
    assert health.next_time() == 0.25
    assert health.advance(0.125, POLICY) == []
    assert health.advance(0.25, POLICY) == [PROBE]
    assert health.advance(0.5, POLICY) == []  # the first has not come back yet
    assert health.next_time() == 1.0  # while probing only the ejection's end is due
    assert health.probed(False, "GET /models: 503", 0.5, POLICY) is None
    assert (health.next_time(), health.last_failure, health.probes_failed) == (
        0.75,
        "GET /models: 503",
        1,
    )
    assert health.advance(0.75, POLICY) == [PROBE]


def test_probe_success_recovers_at_once() -> None:
    health = ejected_health(can_probe=True)
    health.advance(0.25, POLICY)
    assert health.probed(True, None, 0.375, POLICY) == HealthEvent("recovered", via="probe")
    assert (health.health, health.ejected_until, health.out, health.next_time()) == (
        "healthy",
        None,
        False,
        None,
    )
    assert (health.probes_ok, health.probes_failed) == (1, 0)


def test_failed_probes_renew_the_ejection_at_its_end_doubled() -> None:
    health = ejected_health(can_probe=True)
    health.advance(0.75, POLICY)
    health.probed(False, "connection refused", 0.875, POLICY)
    events = health.advance(1.0, POLICY)
    assert events == [
        HealthEvent("ejected", failures=2, reason="connection refused", until=1.0 + 2.0)
    ]
    assert health.ejected
    assert not health.half_open
    assert health.next_time() == 1.25  # probing goes on


def test_probe_capable_provider_without_a_verdict_goes_half_open_and_a_late_probe_recovers_it() -> (
    None
):
    health = ejected_health(can_probe=True)
    health.advance(0.75, POLICY)  # a probe starts and is still running at the end
    assert health.advance(1.0, POLICY) == [HealthEvent("half_open", failures=2)]
    assert health.probed(True, None, 1.125, POLICY) == HealthEvent("recovered", via="probe")
    assert health.health == "healthy"


def test_a_failed_probe_while_half_open_leaves_it_to_the_trial() -> None:
    health = ejected_health(can_probe=True)
    health.advance(0.75, POLICY)
    health.advance(1.0, POLICY)
    assert health.probed(False, "refused", 1.125, POLICY) is None
    assert (health.half_open, health.ejected, health.probes_failed) == (True, False, 1)


def test_429_with_retry_after_holds_without_counting_toward_ejection() -> None:
    health = ProviderHealth(can_probe=False)
    event = health.failed(busy(retry_after=2.5), 1.0, POLICY)
    assert event == HealthEvent("held", reason="the provider answered 429", until=3.5)
    assert (health.failures, health.ejected, health.out, health.usable) == (0, False, True, False)
    assert health.health == "unknown"
    assert health.next_time() == 3.5
    assert health.failed(busy(retry_after=1.0), 2.0, POLICY) is None  # never shortened
    assert health.held_until == 3.5
    assert health.advance(3.25, POLICY) == []
    assert health.out
    assert health.advance(3.5, POLICY) == []
    assert not health.out
    assert (health.held_until, health.next_time()) == (None, None)


def test_429_hold_is_capped_at_max_eject() -> None:
    health = ProviderHealth(can_probe=False)
    event = health.failed(busy(retry_after=3600.0), 0.0, POLICY)
    assert event is not None
    assert event.until == 4.0


@pytest.mark.parametrize("retry_after", [None, 0.0])
def test_429_without_retry_after_does_not_hold(retry_after: float | None) -> None:
    health = ProviderHealth(can_probe=False)
    for _ in range(POLICY.failure_threshold + 1):
        assert health.failed(busy(retry_after), 0.0, POLICY) is None
    assert (health.out, health.held_until, health.failures) == (False, None, 0)
    assert health.last_failure == "the provider answered 429"


# -- the scheduler: helpers ------------------------------------------------------------------


def provider(
    pid: str,
    *,
    capacity: int = 1,
    long: int | None = None,
    priority: int = 0,
    enabled: bool = True,
    probe: bool = False,
) -> ProviderPolicy:
    return ProviderPolicy(
        node_id="n1",
        provider_id=pid,
        capacity=capacity,
        long_context_capacity=capacity if long is None else long,
        priority=priority,
        enabled=enabled,
        probe=probe,
    )


def pool(
    providers: list[ProviderPolicy],
    groups: dict[str, list[str]] | None = None,
    *,
    max_attempts: int = 2,
    health: HealthPolicy = POLICY,
    queue_timeout_ms: int = 0,
    max_queue: int = 16,
) -> PoolPolicy:
    """A policy; ``groups`` maps group id -> provider ids (default: one group "m" of all)."""
    if groups is None:
        groups = {"m": [p.provider_id for p in providers]}
    return PoolPolicy(
        max_queue=max_queue,
        queue_timeout_ms=queue_timeout_ms,
        providers=tuple(providers),
        groups={g: tuple(key(pid) for pid in pids) for g, pids in groups.items()},
        max_attempts=max_attempts,
        health=health,
    )


def key(pid: str) -> ProviderKey:
    return ("n1", pid)


def lease_of(
    scheduler: PoolScheduler, group: str = "m", *, long: bool = False, now: float = 0.0
) -> SlotLease:
    """Submit and return the lease; the request must be dispatched at once."""
    submission = scheduler.submit(group, long_context=long, now=now)
    assert submission.request.lease is not None, submission
    return submission.request.lease


def queued(
    scheduler: PoolScheduler, group: str = "m", *, long: bool = False, now: float = 0.0
) -> PendingRequest:
    submission = scheduler.submit(group, long_context=long, now=now)
    assert submission.request.state is RequestState.PENDING, submission
    return submission.request


def dispatched(decisions: list[Decision]) -> list[tuple[int, str]]:
    return [
        (d.request.request_id, d.lease.provider_id) for d in decisions if isinstance(d, Dispatch)
    ]


def rejected(decisions: list[Decision]) -> list[tuple[int, str, bool]]:
    return [
        (d.request.request_id, d.reason.value, d.config_change)
        for d in decisions
        if isinstance(d, Rejection)
    ]


def shown(scheduler: PoolScheduler, pid: str) -> ProviderStatistics:
    return next(p for p in scheduler.statistics().providers if p.provider_id == pid)


def panic(scheduler: PoolScheduler, group: str = "m") -> bool:
    return next(g for g in scheduler.statistics().groups if g.group_id == group).panic


def eject(scheduler: PoolScheduler, pid: str, now: float = 0.0) -> None:
    """Fail ``failure_threshold`` requests on ``pid`` (it must be the group's first choice)."""
    for _ in range(scheduler.policy.health.failure_threshold):
        lease = lease_of(scheduler, now=now)
        assert lease.provider_id == pid
        scheduler.release(lease, now, REFUSED)
    assert shown(scheduler, pid).ejected_until is not None


def check_counters(scheduler: PoolScheduler) -> None:
    stats = scheduler.statistics()
    assert stats.submitted + stats.failovers == (
        stats.admitted + stats.rejected_total + stats.queue_depth
    )


# -- ejection and recovery as admission sees them ------------------------------------------------


def test_threshold_failures_eject_and_the_provider_gets_no_new_requests() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=4), provider("b", priority=1)]))
    first = lease_of(scheduler)
    assert first.provider_id == "a"
    scheduler.release(first, 0.0, REFUSED)
    assert (shown(scheduler, "a").health, shown(scheduler, "a").consecutive_failures) == (
        "unknown",
        1,
    )
    second = lease_of(scheduler, now=0.5)
    assert second.provider_id == "a"
    assert scheduler.release(second, 0.5, REFUSED) == []
    assert scheduler.take_events() == [
        (key("a"), HealthEvent("ejected", failures=2, reason="connection refused", until=1.5))
    ]
    assert not scheduler.has_events
    # a is idle and preferred, but ejected: b serves, then the next request waits.
    assert lease_of(scheduler, now=0.5).provider_id == "b"
    waiting = queued(scheduler, now=0.5)
    assert shown(scheduler, "a").in_flight == 0
    assert scheduler.next_event() == 1.5
    assert shown(scheduler, "a") == ProviderStatistics(
        node_id="n1",
        provider_id="a",
        status="active",
        health="unhealthy",
        enabled=True,
        capacity=4,
        long_context_capacity=4,
        in_flight=0,
        long_in_flight=0,
        priority=0,
        consecutive_failures=2,
        last_failure="connection refused",
        ejected_until=1.5,
        half_open=False,
        held_until=None,
        ejections=1,
        probes_ok=0,
        probes_failed=0,
    )
    # The ejection ends (no probe): half-open, and the waiting request is its trial.
    decisions = scheduler.expire(1.5)
    assert dispatched(decisions) == [(waiting.request_id, "a")]
    assert scheduler.take_events() == [(key("a"), HealthEvent("half_open", failures=2))]
    assert (shown(scheduler, "a").health, shown(scheduler, "a").half_open) == ("unhealthy", True)


def test_a_success_of_a_request_in_flight_ends_an_ejection_at_once() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=3), provider("b", priority=1)]))
    slow = lease_of(scheduler)
    assert (slow.provider_id, lease_of(scheduler).provider_id) == ("a", "b")
    eject(scheduler, "a")  # b is full: a takes the requests that fail
    scheduler.take_events()
    scheduler.release(slow, 0.25, OK)
    assert scheduler.take_events() == [(key("a"), HealthEvent("recovered", via="request"))]
    assert (shown(scheduler, "a").health, shown(scheduler, "a").ejected_until) == ("healthy", None)


def test_probe_capable_provider_is_probed_while_ejected_and_a_probe_success_recovers_it() -> None:
    scheduler = PoolScheduler(pool([provider("a", probe=True), provider("b", priority=1)]))
    eject(scheduler, "a")
    scheduler.take_events()
    hold_b = lease_of(scheduler)
    waiting = queued(scheduler)
    assert scheduler.next_event() == 0.25
    assert scheduler.expire(0.25) == []
    assert scheduler.take_events() == [(key("a"), PROBE)]
    assert scheduler.next_event() == 1.0  # no second probe while the first runs
    decisions = scheduler.probed(key("a"), True, None, 0.375)
    assert dispatched(decisions) == [(waiting.request_id, "a")]
    assert scheduler.take_events() == [(key("a"), HealthEvent("recovered", via="probe"))]
    a = shown(scheduler, "a")
    assert (a.health, a.ejected_until, a.probes_ok, a.probes_failed, a.ejections) == (
        "healthy",
        None,
        1,
        0,
        1,
    )
    assert hold_b.provider_id == "b"


def test_failed_probes_renew_the_ejection_doubled_and_probing_goes_on() -> None:
    scheduler = PoolScheduler(pool([provider("a", probe=True), provider("b", priority=1)]))
    eject(scheduler, "a")
    scheduler.take_events()
    scheduler.expire(0.25)
    assert scheduler.take_events() == [(key("a"), PROBE)]
    scheduler.probed(key("a"), False, "GET /models: connection refused", 0.5)
    assert scheduler.take_events() == []
    assert scheduler.next_event() == 0.75
    scheduler.expire(0.75)
    assert scheduler.take_events() == [(key("a"), PROBE)]
    scheduler.probed(key("a"), False, "GET /models: connection refused", 0.875)
    scheduler.expire(1.0)
    assert scheduler.take_events() == [
        (
            key("a"),
            HealthEvent("ejected", failures=2, reason="GET /models: connection refused", until=3.0),
        )
    ]
    a = shown(scheduler, "a")
    assert (a.ejected_until, a.ejections, a.probes_failed, a.half_open) == (3.0, 2, 2, False)
    assert scheduler.next_event() == 1.25


def test_a_provider_without_probes_is_never_probed() -> None:
    scheduler = PoolScheduler(pool([provider("a"), provider("b", priority=1)]))
    eject(scheduler, "a")
    scheduler.take_events()
    assert scheduler.next_event() == 1.0  # only the end of the ejection
    scheduler.expire(0.5)
    assert scheduler.take_events() == []


def test_turning_probes_off_while_ejected_leaves_no_probe_timer_behind() -> None:
    """A probe was due at 0.25; without probes the next health time is the ejection's end,
    never a time already past (the shell would spin on it)."""
    scheduler = PoolScheduler(pool([provider("a", probe=True), provider("b", priority=1)]))
    eject(scheduler, "a")
    scheduler.take_events()
    assert scheduler.next_event() == 0.25
    scheduler.apply_policy(pool([provider("a"), provider("b", priority=1)]), 0.125)
    assert scheduler.next_event() == 1.0
    scheduler.expire(0.5)
    assert scheduler.take_events() == []  # no probe
    assert scheduler.expire(1.0) == []
    assert scheduler.take_events() == [(key("a"), HealthEvent("half_open", failures=2))]


def test_probe_result_for_an_unknown_or_disabled_provider_changes_nothing() -> None:
    scheduler = PoolScheduler(pool([provider("a"), provider("b", enabled=False)], {"m": ["a"]}))
    assert scheduler.probed(key("zzz"), True, None, 0.0) == []
    assert scheduler.probed(key("b"), True, None, 0.0) == []
    assert shown(scheduler, "b").probes_ok == 0
    assert scheduler.take_events() == []


# -- the half-open trial -----------------------------------------------------------------------


def half_open_scheduler() -> tuple[PoolScheduler, SlotLease]:
    """a (no probes) half-open at t=1.0, b busy with the returned lease."""
    scheduler = PoolScheduler(pool([provider("a", capacity=4), provider("b", priority=1)]))
    eject(scheduler, "a")
    hold_b = lease_of(scheduler)
    assert hold_b.provider_id == "b"
    scheduler.expire(1.0)
    assert shown(scheduler, "a").half_open
    scheduler.take_events()
    return scheduler, hold_b


def test_half_open_provider_gets_exactly_one_trial_request() -> None:
    scheduler, _ = half_open_scheduler()
    trial = lease_of(scheduler, now=1.0)
    assert trial.provider_id == "a"
    # a has three free slots, but only one trial at a time: the others wait.
    others = [queued(scheduler, now=1.0) for _ in range(3)]
    assert shown(scheduler, "a").in_flight == 1
    # The trial succeeds: a is healthy and its free slots go to the waiting requests at once.
    decisions = scheduler.release(trial, 1.25, OK)
    assert dispatched(decisions) == [(r.request_id, "a") for r in others]
    assert scheduler.take_events() == [(key("a"), HealthEvent("recovered", via="trial"))]
    assert (shown(scheduler, "a").health, shown(scheduler, "a").half_open) == ("healthy", False)


def test_other_requests_go_elsewhere_while_the_trial_runs() -> None:
    scheduler, hold_b = half_open_scheduler()
    trial = lease_of(scheduler, now=1.0)
    assert trial.provider_id == "a"
    scheduler.release(hold_b, 1.0, OK)
    assert lease_of(scheduler, now=1.0).provider_id == "b"


def test_half_open_trial_failure_ejects_again_for_twice_as_long() -> None:
    scheduler, _ = half_open_scheduler()
    trial = lease_of(scheduler, now=1.0)
    waiting = queued(scheduler, now=1.0)
    assert scheduler.release(trial, 1.25, TIMEOUT) == []
    assert scheduler.take_events() == [
        (key("a"), HealthEvent("ejected", failures=3, reason=TIMEOUT.reason, until=3.25))
    ]
    a = shown(scheduler, "a")
    assert (a.health, a.half_open, a.ejected_until, a.ejections) == ("unhealthy", False, 3.25, 2)
    assert waiting.state is RequestState.PENDING


@pytest.mark.parametrize(
    "outcome", [None, busy(), busy(retry_after=0.5)], ids=["client_left", "429", "429_held"]
)
def test_a_trial_that_says_nothing_about_health_lets_the_next_request_be_the_trial(
    outcome: Failure | None,
) -> None:
    """The client left (outcome None) or the trial got a 429: still half-open, and the next
    request (once a hold ends) is the trial; the provider must not stay stuck half-open."""
    scheduler, _ = half_open_scheduler()
    trial = lease_of(scheduler, now=1.0)
    waiting = queued(scheduler, now=1.0)
    decisions = scheduler.release(trial, 1.25, outcome)
    a = shown(scheduler, "a")
    assert (a.half_open, a.ejected_until, a.consecutive_failures) == (True, None, 2)
    if outcome is not None and outcome.retry_after:
        assert decisions == []
        assert scheduler.next_event() == 1.75
        decisions = scheduler.expire(1.75)
    assert dispatched(decisions) == [(waiting.request_id, "a")]
    assert queued(scheduler, now=2.0).state is RequestState.PENDING  # one trial again


# -- 429 holds ---------------------------------------------------------------------------------


def test_429_with_retry_after_holds_the_provider_out_without_counting_a_failure() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=2), provider("b", priority=1)]))
    lease = lease_of(scheduler)
    scheduler.release(lease, 0.5, busy(retry_after=1.0))
    assert scheduler.take_events() == [
        (key("a"), HealthEvent("held", reason="the provider answered 429", until=1.5))
    ]
    a = shown(scheduler, "a")
    assert (a.health, a.held_until, a.consecutive_failures, a.ejected_until, a.ejections) == (
        "unknown",
        1.5,
        0,
        None,
        0,
    )
    assert lease_of(scheduler, now=0.5).provider_id == "b"
    waiting = queued(scheduler, now=0.5)
    assert scheduler.next_event() == 1.5
    assert dispatched(scheduler.expire(1.5)) == [(waiting.request_id, "a")]
    assert shown(scheduler, "a").held_until is None


def test_429_without_retry_after_does_not_hold_the_provider() -> None:
    scheduler = PoolScheduler(pool([provider("a"), provider("b", priority=1)]))
    for now in (0.0, 0.25, 0.5):  # more than failure_threshold of them
        lease = lease_of(scheduler, now=now)
        assert lease.provider_id == "a"
        assert scheduler.release(lease, now, busy()) == []
    assert scheduler.take_events() == []
    a = shown(scheduler, "a")
    assert (a.held_until, a.ejected_until, a.consecutive_failures) == (None, None, 0)


# -- panic ---------------------------------------------------------------------------------------


def test_panic_when_every_member_is_out_requests_go_to_them_and_it_ends_when_one_recovers() -> None:
    scheduler = PoolScheduler(
        pool([provider("a", capacity=2), provider("b", capacity=2, priority=1)])
    )
    eject(scheduler, "a")
    assert not panic(scheduler)
    first = lease_of(scheduler, now=0.25)
    scheduler.release(first, 0.25, REFUSED)
    second = lease_of(scheduler, now=0.25)
    assert second.provider_id == "b"
    scheduler.release(second, 0.25, busy(retry_after=2.0))  # held counts as out too
    events = scheduler.take_events()
    assert events[-1] == ("m", HealthEvent("panic"))
    assert panic(scheduler)
    assert scheduler.statistics().groups == (GroupStatistics("m", 2, True),)
    # Health is ignored: a and b both take requests, lowest in_flight then priority.
    assert [lease_of(scheduler, now=0.5).provider_id for _ in range(4)] == ["a", "b", "a", "b"]
    # a's ejection runs out (half-open is not out): the panic is over.
    scheduler.expire(1.0)
    assert scheduler.take_events() == [
        (key("a"), HealthEvent("half_open", failures=2)),
        ("m", HealthEvent("panic_over")),
    ]
    assert not panic(scheduler)


def test_panic_is_per_group_and_a_group_not_in_panic_keeps_avoiding_the_ejected_provider() -> None:
    scheduler = PoolScheduler(
        pool(
            [provider("a", capacity=4), provider("b", priority=1)],
            {"m": ["a", "b"], "solo": ["a"]},
        )
    )
    eject(scheduler, "a")
    assert scheduler.take_events()[-1] == ("solo", HealthEvent("panic"))
    assert (panic(scheduler, "m"), panic(scheduler, "solo")) == (False, True)
    assert lease_of(scheduler, "solo").provider_id == "a"  # in panic: a is a candidate
    assert lease_of(scheduler, "m").provider_id == "b"  # not in panic: a is not
    queued(scheduler, "m")


def test_panic_ends_when_a_probe_recovers_a_member() -> None:
    scheduler = PoolScheduler(pool([provider("a", probe=True, capacity=2)]))
    eject(scheduler, "a")
    assert panic(scheduler)
    scheduler.expire(0.25)
    assert scheduler.take_events()[-1] == (key("a"), PROBE)
    scheduler.probed(key("a"), True, None, 0.5)
    assert scheduler.take_events() == [
        (key("a"), HealthEvent("recovered", via="probe")),
        ("m", HealthEvent("panic_over")),
    ]
    assert not panic(scheduler)


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

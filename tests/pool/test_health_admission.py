"""Provider health as the pure scheduler's admission sees it (SPEC §5.1): ejection and
recovery, the half-open trial, 429 holds, panic.
"""

from __future__ import annotations

import dataclasses

import pytest

from iop_edge.pool import (
    OK,
    PROBE,
    Failure,
    GroupStatistics,
    HealthEvent,
    PoolScheduler,
    ProviderStatistics,
    RequestState,
    SlotLease,
)
from tests.helpers.pool import (
    REFUSED,
    TIMEOUT,
    busy,
    dispatched,
    eject,
    key,
    lease_of,
    panic,
    pool,
    provider,
    queued,
    shown,
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


def test_an_answer_to_a_request_sent_before_the_ejection_changes_nothing() -> None:
    """A slow request that was in flight when the provider was ejected answers after: it says
    nothing about the provider now (it stays ejected, no event)."""
    scheduler = PoolScheduler(pool([provider("a", capacity=3), provider("b", priority=1)]))
    slow = lease_of(scheduler, now=0.0)
    assert (slow.provider_id, lease_of(scheduler).provider_id) == ("a", "b")
    eject(scheduler, "a", now=0.5)  # b is full: a takes the requests that fail
    scheduler.take_events()
    scheduler.release(slow, 0.75, OK)
    assert scheduler.take_events() == []
    assert (shown(scheduler, "a").health, shown(scheduler, "a").ejected_until) == ("unhealthy", 1.5)


def test_a_success_of_a_request_sent_during_the_ejection_ends_it_at_once() -> None:
    """Only a panic sends a request to an ejected provider; its answer is fresh evidence."""
    scheduler = PoolScheduler(pool([provider("a")]))
    eject(scheduler, "a", now=0.5)
    assert panic(scheduler)
    during = lease_of(scheduler, now=0.75)
    scheduler.take_events()
    scheduler.release(during, 0.875, OK)
    events = scheduler.take_events()
    assert (key("a"), HealthEvent("recovered", via="request")) in events
    assert (shown(scheduler, "a").health, shown(scheduler, "a").ejected_until) == ("healthy", None)
    assert not panic(scheduler)


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
            HealthEvent(
                "ejected",
                failures=2,
                reason="GET /models: connection refused",
                until=3.0,
                probes_trusted=True,
            ),
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


def test_a_models_panic_is_reported_once_not_again_for_its_derived_groups() -> None:
    """``m[completions]`` and ``m[embeddings]`` share m's providers and panic with it; one
    outage is one report, under ``m``. The derived groups still ignore health while in panic
    (their statistics say so, and whose model they belong to)."""
    groups = {"m": ["a", "b"], "m[completions]": ["a", "b"], "m[embeddings]": ["a"]}
    derived = {"m[completions]": "m", "m[embeddings]": "m"}
    policy = dataclasses.replace(
        pool([provider("a", capacity=2), provider("b", capacity=2, priority=1)], groups),
        derived=derived,
    )
    scheduler = PoolScheduler(policy)
    eject(scheduler, "a")  # m[embeddings] (a alone) panics: not reported, m is not in panic
    assert [e for e in scheduler.take_events() if isinstance(e[0], str)] == []
    assert panic(scheduler, "m[embeddings]")
    for _ in range(2):
        lease = lease_of(scheduler, now=0.25)
        assert lease.provider_id == "b"
        scheduler.release(lease, 0.25, REFUSED)
    assert [e for e in scheduler.take_events() if isinstance(e[0], str)] == [
        ("m", HealthEvent("panic"))
    ]
    assert scheduler.statistics().groups == (
        GroupStatistics("m", 2, True),
        GroupStatistics("m[completions]", 2, True, derived_from="m"),
        GroupStatistics("m[embeddings]", 1, True, derived_from="m"),
    )
    scheduler.expire(1.0)  # a's ejection ends: every group's panic is over, reported once
    assert [e for e in scheduler.take_events() if isinstance(e[0], str)] == [
        ("m", HealthEvent("panic_over"))
    ]


def test_a_derived_group_must_name_groups_of_the_policy() -> None:
    with pytest.raises(ValueError, match="both must be model groups"):
        dataclasses.replace(pool([provider("a")]), derived={"m[completions]": "m"})

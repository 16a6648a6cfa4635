"""Unit tests of one provider's health (SPEC §5.1): :class:`ProviderHealth` alone, times
passed in. How admission uses it is in ``test_health_admission.py``, failover in
``test_failover.py``.
"""

from __future__ import annotations

import pytest

from iop_edge.pool import (
    PROBE,
    HealthEvent,
    HealthPolicy,
)
from iop_edge.pool.health import ProviderHealth
from tests.helpers.pool import (
    BAD_GATEWAY,
    POLICY,
    REFUSED,
    TIMEOUT,
    busy,
)

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
        HealthEvent(
            "ejected", failures=2, reason="connection refused", until=1.0 + 2.0, probes_trusted=True
        )
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


def test_a_probe_result_nobody_asked_for_is_ignored() -> None:
    """A probe started for an earlier life of the provider (disabled and enabled again: a new
    state) changes and counts nothing."""
    health = ejected_health(can_probe=True)
    assert health.probed(True, None, 0.5, POLICY) is None
    assert (health.ejected, health.probes_ok, health.probes_failed) == (True, 0, 0)

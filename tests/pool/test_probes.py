"""Probes as the pure scheduler runs them (SPEC §5.1, issue 25): a provider whose probes pass
while its requests fail is no longer let back in by its probes (its ejections grow, each runs to
its end), and idle providers are probed so that a dead one is ejected before a request reaches
it. On the fake clock: times are the issue's, 10 s ejections and 2 s probes.
"""

from __future__ import annotations

from iop_edge.pool import (
    OK,
    PROBE,
    HealthEvent,
    HealthPolicy,
    PoolScheduler,
    ProviderKey,
    SlotLease,
)
from tests.helpers.pool import (
    BAD_GATEWAY,
    dispatched,
    key,
    lease_of,
    pool,
    provider,
    shown,
)

HEALTH = HealthPolicy(failure_threshold=3, eject_ms=10_000, max_eject_ms=300_000)
"""The defaults: three failures eject for 10 s, doubling up to 300 s; probes every 2 s."""


def sick_and_well() -> PoolScheduler:
    """``sick`` (probed, tried first) and ``well`` (priority 1), both of model ``m``."""
    return PoolScheduler(
        pool([provider("sick", probe=True), provider("well", priority=1)], health=HEALTH)
    )


def fail_requests(scheduler: PoolScheduler, now: float, *, count: int = 3) -> None:
    """``count`` requests go to ``sick`` at ``now`` and fail (a 502)."""
    for _ in range(count):
        lease = lease_of(scheduler, now=now)
        assert lease.provider_id == "sick"
        scheduler.release(lease, now, BAD_GATEWAY)


def answer_probes(scheduler: PoolScheduler, ok: bool, now: float) -> list[ProviderKey]:
    """Answer every probe the outbox asks for with ``ok``; the providers probed."""
    probed: list[ProviderKey] = []
    for subject, event in scheduler.take_events():
        if event == PROBE:
            assert isinstance(subject, tuple)
            probed.append(subject)
    for subject in probed:
        scheduler.probed(subject, ok, None if ok else "GET /models: connection refused", now)
    return probed


def candidate_at(scheduler: PoolScheduler, now: float) -> str:
    """Which provider a request submitted at ``now`` gets (released at once, answered)."""
    lease = lease_of(scheduler, now=now)
    scheduler.release(lease, now, OK)
    return lease.provider_id


# -- probes pass, requests fail ------------------------------------------------------------------


def test_under_probes_ok_requests_failing_the_ejections_grow_10_20_40_s_and_each_runs_to_its_end():
    """The issue's case: a probe recovers the provider after its first ejection; three
    requests fail again before any succeeded — from then on its probes are not trusted. Each
    ejection is twice as long as the one before (10, 20, 40, 80 s), probes keep passing, and
    the provider is no candidate until the ejection's very end; then one trial request decides
    (it fails, on and on)."""
    scheduler = sick_and_well()
    fail_requests(scheduler, 0.0)
    [(_, first)] = scheduler.take_events()
    assert first == HealthEvent(
        "ejected", failures=3, reason=BAD_GATEWAY.reason, until=10.0, probes_trusted=True
    )
    scheduler.expire(2.0)
    assert answer_probes(scheduler, True, 2.0) == [key("sick")]
    assert scheduler.take_events() == [(key("sick"), HealthEvent("recovered", via="probe"))]
    assert shown(scheduler, "sick").probes_trusted
    now = 2.0
    fail_requests(scheduler, now)
    lengths = []
    for _ in range(4):
        events = [e for _, e in scheduler.take_events() if isinstance(e, HealthEvent)]
        [ejected] = [e for e in events if e.kind == "ejected"]
        assert ejected.probes_trusted is False
        assert ejected.until is not None
        lengths.append(ejected.until - now)
        assert not shown(scheduler, "sick").probes_trusted
        # Every probe passes; the provider is never a candidate before the ejection's end.
        while (when := scheduler.next_event()) is not None and when < ejected.until:
            now = when
            scheduler.expire(now)
            answer_probes(scheduler, True, now)
            assert candidate_at(scheduler, now) == "well"
            assert shown(scheduler, "sick").ejected_until == ejected.until
        now = ejected.until
        scheduler.expire(now)
        assert shown(scheduler, "sick").half_open
        trial = lease_of(scheduler, now=now)
        assert trial.provider_id == "sick"
        assert candidate_at(scheduler, now) == "well"  # one trial at a time
        scheduler.release(trial, now, BAD_GATEWAY)
    assert lengths == [20.0, 40.0, 80.0, 160.0]
    assert shown(scheduler, "sick").ejections == 1 + 4 + 1  # (the last trial's ejection)


def test_a_request_success_restores_the_trust_in_probes_and_resets_the_doubling():
    scheduler = sick_and_well()
    fail_requests(scheduler, 0.0)
    scheduler.expire(2.0)
    answer_probes(scheduler, True, 2.0)
    fail_requests(scheduler, 2.0)  # distrusted, ejected until 22
    scheduler.expire(22.0)
    trial = lease_of(scheduler, now=22.0)
    scheduler.release(trial, 22.5, OK)
    events = [e for _, e in scheduler.take_events()]
    assert HealthEvent("recovered", via="trial") in events
    sick = shown(scheduler, "sick")
    assert (sick.health, sick.probes_trusted, sick.consecutive_failures) == ("healthy", True, 0)
    fail_requests(scheduler, 30.0)
    ejected = [e for _, e in scheduler.take_events() if e != PROBE and e.kind == "ejected"]
    assert ejected == [
        HealthEvent(
            "ejected", failures=3, reason=BAD_GATEWAY.reason, until=40.0, probes_trusted=True
        )
    ]
    scheduler.expire(32.0)
    answer_probes(scheduler, True, 32.0)  # trusted again: a probe ends it at once
    assert shown(scheduler, "sick").health == "healthy"


def test_failed_probes_of_a_distrusted_provider_renew_its_ejection_without_a_trial():
    scheduler = sick_and_well()
    fail_requests(scheduler, 0.0)
    scheduler.expire(2.0)
    answer_probes(scheduler, True, 2.0)
    fail_requests(scheduler, 2.0)  # distrusted, ejected until 22
    scheduler.take_events()
    scheduler.expire(20.0)
    answer_probes(scheduler, False, 20.0)  # the last probe before the end fails
    scheduler.expire(22.0)
    [(_, renewed)] = [n for n in scheduler.take_events() if n[1] != PROBE]
    assert isinstance(renewed, HealthEvent)
    assert (renewed.kind, renewed.until, renewed.probes_trusted) == ("ejected", 62.0, False)


def test_a_provider_ejected_by_its_idle_probes_keeps_its_trust():
    """Only failed *requests* after a probe's recovery say the probes lie."""
    scheduler = sick_and_well()
    scheduler.start(0.0)
    for now in (2.0, 4.0, 6.0):
        scheduler.expire(now)
        answer_probes(scheduler, False, now)
    assert shown(scheduler, "sick").ejected_until == 16.0
    scheduler.expire(8.0)
    answer_probes(scheduler, True, 8.0)
    assert shown(scheduler, "sick").health == "healthy"
    for now in (10.0, 12.0, 14.0):
        scheduler.expire(now)
        answer_probes(scheduler, False, now)
    assert shown(scheduler, "sick").probes_trusted


# -- idle probes ----------------------------------------------------------------------------------


def test_idle_providers_are_probed_every_probe_interval_once_started():
    """Before :meth:`start` nothing idle is probed; after, each provider with a health check is
    probed ``probe_interval_ms`` after the start and then after each of its probes. A probe
    success makes an unknown provider healthy."""
    scheduler = PoolScheduler(
        pool([provider("a", probe=True), provider("b", probe=True), provider("c")], health=HEALTH)
    )
    assert scheduler.next_event() is None
    scheduler.start(100.0)
    assert scheduler.next_event() == 102.0
    scheduler.expire(101.999)
    assert scheduler.take_events() == []
    scheduler.expire(102.0)
    assert answer_probes(scheduler, True, 102.5) == [key("a"), key("b")]  # never c
    assert [shown(scheduler, p).health for p in "abc"] == ["healthy", "healthy", "unknown"]
    assert scheduler.next_event() == 104.5
    scheduler.expire(104.5)
    assert answer_probes(scheduler, True, 104.5) == [key("a"), key("b")]
    assert shown(scheduler, "a").probes_ok == 2


def test_a_dead_idle_provider_is_ejected_after_failure_threshold_failed_probes():
    scheduler = sick_and_well()
    scheduler.start(0.0)
    for now in (2.0, 4.0):
        scheduler.expire(now)
        answer_probes(scheduler, False, now)
        sick = shown(scheduler, "sick")
        assert (sick.health, sick.ejected_until) == ("unknown", None)
    assert sick.consecutive_failures == 2
    scheduler.expire(6.0)
    answer_probes(scheduler, False, 6.0)
    [(subject, event)] = scheduler.take_events()
    assert subject == key("sick")
    assert event == HealthEvent(
        "ejected",
        failures=3,
        reason="GET /models: connection refused",
        until=16.0,
        probes_trusted=True,
    )
    assert candidate_at(scheduler, 6.0) == "well"  # before any request reached it


def test_an_idle_probe_success_does_not_forgive_failed_requests():
    """Probes pass, requests fail, traffic is thin: the requests' failures still add up."""
    scheduler = sick_and_well()
    scheduler.start(0.0)
    now = 0.0
    for _ in range(2):
        fail_requests(scheduler, now, count=1)
        now += 3.0
        scheduler.expire(now)
        assert answer_probes(scheduler, True, now) == [key("sick")]
        assert shown(scheduler, "sick").consecutive_failures in (1, 2)
    fail_requests(scheduler, now, count=1)
    assert shown(scheduler, "sick").ejected_until == now + 10.0


def test_failed_idle_probes_and_failed_requests_count_together_and_a_request_success_resets():
    scheduler = sick_and_well()
    scheduler.start(0.0)
    scheduler.expire(2.0)
    answer_probes(scheduler, False, 2.0)
    fail_requests(scheduler, 2.5, count=1)
    assert shown(scheduler, "sick").consecutive_failures == 2
    scheduler.release(lease_of(scheduler, now=3.0), 3.0, OK)
    assert shown(scheduler, "sick").consecutive_failures == 0
    scheduler.expire(5.0)
    answer_probes(scheduler, False, 5.0)
    scheduler.expire(7.0)
    answer_probes(scheduler, True, 7.0)  # clears the failed probe
    assert shown(scheduler, "sick").consecutive_failures == 0


def test_idle_probes_stop_while_traffic_flows_and_resume_a_probe_interval_after_it():
    scheduler = sick_and_well()
    scheduler.start(0.0)
    held: SlotLease = lease_of(scheduler, now=1.0)  # on sick, running for a long time
    for now in (2.0, 4.0, 6.0):
        scheduler.expire(now)
        assert scheduler.take_events() == []  # in flight: not idle
    scheduler.release(held, 7.0, OK)
    for now in (8.0, 8.999):
        scheduler.expire(now)
        assert scheduler.take_events() == []  # an attempt ended at 7.0
    scheduler.expire(9.0)
    assert answer_probes(scheduler, True, 9.0) == [key("sick")]
    # Requests every second: never idle for 2 s, never probed.
    for second in range(10, 20):
        scheduler.release(lease_of(scheduler, now=float(second)), float(second), OK)
        scheduler.expire(second + 0.5)
        assert scheduler.take_events() == []
    assert shown(scheduler, "sick").probes_ok == 1


def test_disabled_providers_and_those_without_a_health_check_are_never_probed():
    scheduler = PoolScheduler(
        pool([provider("off", probe=True, enabled=False), provider("cli")], health=HEALTH)
    )
    scheduler.start(0.0)
    assert scheduler.next_event() is None
    scheduler.expire(60.0)
    assert scheduler.take_events() == []


def test_a_provider_enabled_or_given_a_health_check_live_is_probed_from_then_on():
    scheduler = PoolScheduler(
        pool([provider("a"), provider("b", probe=True, enabled=False)], health=HEALTH)
    )
    scheduler.start(0.0)
    scheduler.apply_policy(pool([provider("a", probe=True), provider("b", probe=True)]), 5.0)
    assert scheduler.next_event() == 5.0 + 0.25  # (the builders' default probe interval)
    scheduler.expire(5.25)
    assert answer_probes(scheduler, True, 5.25) == [key("a"), key("b")]


def test_an_idle_probe_sent_before_an_ejection_does_not_end_it():
    """The probe left while the provider looked idle; requests then ejected it. Its success
    says nothing about the provider now."""
    scheduler = sick_and_well()
    scheduler.start(0.0)
    scheduler.expire(2.0)
    [(subject, event)] = scheduler.take_events()
    assert (subject, event) == (key("sick"), PROBE)
    fail_requests(scheduler, 2.5)
    scheduler.take_events()
    scheduler.probed(key("sick"), True, None, 3.0)
    assert scheduler.take_events() == []
    assert shown(scheduler, "sick").ejected_until == 12.5
    assert dispatched(scheduler.expire(4.5)) == []
    assert answer_probes(scheduler, True, 4.5) == [key("sick")]  # a probe of the ejection
    assert shown(scheduler, "sick").health == "healthy"


def test_the_scheduler_arms_nothing_per_request_for_idle_probes():
    """Traffic on a provider moves no timer: the next health time stays the idle check that
    was armed, which then finds the traffic and looks again a probe interval later."""
    scheduler = sick_and_well()
    scheduler.start(0.0)
    for step in range(100):
        now = step * 0.01
        scheduler.release(lease_of(scheduler, now=now), now, OK)
        assert scheduler.next_event() == 2.0
    scheduler.expire(2.0)
    assert scheduler.take_events() == []
    assert scheduler.next_event() == 0.99 + 2.0

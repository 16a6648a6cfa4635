"""Leases inherited from another process (a handover, issue 14): the scheduler counts a slot
the old process still holds as its own lease, so capacity and principals' caps stay exact
while both processes run, and releasing it hands the slot on as any release does.
"""

from __future__ import annotations

import dataclasses

from iop_edge.pool import PoolScheduler
from tests.helpers.pool import check_counters, dispatched, key, pool, provider


def test_an_inherited_lease_holds_its_slot_until_the_other_process_reports_it_done() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=2, long=1)]))
    general = scheduler.inherit(key("a"), principal="app", now=0.0)
    long = scheduler.inherit(key("a"), long_context=True, principal="app", now=0.0)
    assert general is not None
    assert long is not None
    stats = scheduler.statistics()
    (shown,) = stats.providers
    assert (shown.in_flight, shown.long_in_flight, stats.inherited) == (2, 1, 1 + 1)
    waiting = scheduler.submit("m", now=1.0).request  # the slots are held: it queues
    assert waiting.lease is None
    assert dispatched(scheduler.release(general, 2.0)) == [(waiting.request_id, "a")]
    assert scheduler.release(long, 3.0) == []
    stats = scheduler.statistics()
    assert (stats.released, stats.admitted, stats.providers[0].long_in_flight) == (2, 1, 0)
    check_counters(scheduler)


def test_a_provider_the_new_policy_lacks_or_disables_inherits_nothing() -> None:
    scheduler = PoolScheduler(pool([provider("a"), provider("off", enabled=False)]))
    assert scheduler.inherit(key("gone"), principal="app", now=0.0) is None
    assert scheduler.inherit(key("off"), principal="app", now=0.0) is None
    assert scheduler.statistics().inherited == 0


def test_inherited_leases_may_pass_the_capacity_and_count_toward_a_principals_cap() -> None:
    """Capacity 1 with two inherited leases (the new config lowered it): nothing is cancelled,
    and a new request waits until both are released. The leases count in app's
    max_in_flight too."""
    policy = dataclasses.replace(pool([provider("a", capacity=1)]), caps={"app": 2})
    scheduler = PoolScheduler(policy)
    first = scheduler.inherit(key("a"), principal="app", now=0.0)
    second = scheduler.inherit(key("a"), principal="app", now=0.0)
    assert first is not None
    assert second is not None
    (row,) = [p for p in scheduler.statistics().principals if p.principal == "app"]
    assert row.in_flight == 2
    waiting = scheduler.submit("m", now=0.0, principal="other").request
    assert waiting.lease is None
    assert scheduler.release(first, 1.0) == []  # still at capacity
    assert dispatched(scheduler.release(second, 2.0)) == [(waiting.request_id, "a")]
    check_counters(scheduler)


def test_released_is_admitted_plus_inherited_once_idle() -> None:
    """After a handover the new process releases the leases it inherited as well as those it
    granted: ``released`` passes ``admitted``, by ``inherited`` exactly once at rest — and
    ``released + in_flight == admitted + inherited`` at every step (nothing leaks)."""
    scheduler = PoolScheduler(pool([provider("a", capacity=3)]))

    def balanced() -> None:
        stats = scheduler.statistics()
        assert stats.released + stats.in_flight == stats.admitted + stats.inherited

    inherited = [scheduler.inherit(key("a"), principal="app", now=0.0) for _ in range(2)]
    balanced()
    own = scheduler.submit("m", now=0.5).request.lease
    assert own is not None
    balanced()
    for lease in (*inherited, own):
        assert lease is not None
        scheduler.release(lease, 1.0)
        balanced()
    stats = scheduler.statistics()
    assert (stats.admitted, stats.inherited, stats.released, stats.in_flight) == (1, 2, 3, 0)
    assert stats.released == stats.admitted + stats.inherited

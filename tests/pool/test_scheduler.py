"""Unit tests of the pure admission scheduler: one test per rule of SPEC §5 and §4 (live swap).

Plain sync functions driving ``now`` by hand.
"""

from __future__ import annotations

import dataclasses
import tracemalloc
from typing import Any

import pytest

from iop_edge.pool import (
    Decision,
    PendingRequest,
    PoolPolicy,
    PoolScheduler,
    Rejection,
    RejectReason,
    RequestState,
)
from tests.helpers.pool import dispatched, lease_of, pool, provider, rejected


def queued(
    scheduler: PoolScheduler, group: str = "m", *, long: bool = False, now: float = 0.0
) -> PendingRequest:
    """Submit and return the request; it must be pending."""
    submission = scheduler.submit(group, long_context=long, now=now)
    assert submission.request.state is RequestState.PENDING, submission
    assert submission.decisions == []
    return submission.request


def rejection(decision: Decision) -> Rejection:
    assert isinstance(decision, Rejection), decision
    return decision


def slots(scheduler: PoolScheduler) -> dict[str, tuple[int, int]]:
    """provider id -> (in_flight, long_in_flight)."""
    return {
        p.provider_id: (p.in_flight, p.long_in_flight) for p in scheduler.statistics().providers
    }


# -- candidates ------------------------------------------------------------------------------


def test_candidates_are_only_enabled_providers_of_the_request_group() -> None:
    scheduler = PoolScheduler(
        pool(
            [provider("a"), provider("b", enabled=False), provider("c", capacity=5)],
            {"m": ["a", "b"], "other": ["c"]},
        )
    )
    assert lease_of(scheduler).provider_id == "a"
    # b is disabled and c belongs to another group: the next request waits.
    queued(scheduler)
    assert slots(scheduler) == {"a": (1, 0), "b": (0, 0), "c": (0, 0)}


def test_a_candidate_needs_in_flight_below_capacity() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=2)]))
    lease_of(scheduler)
    lease_of(scheduler)
    queued(scheduler)
    assert slots(scheduler) == {"a": (2, 0)}


def test_long_context_request_takes_a_long_slot_and_counts_against_capacity() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=2, long=1)]))
    lease = lease_of(scheduler, long=True)
    assert lease.long_context
    assert slots(scheduler) == {"a": (1, 1)}
    lease_of(scheduler)  # the general slot left
    assert slots(scheduler) == {"a": (2, 1)}
    queued(scheduler)  # capacity is shared by both kinds


def test_long_context_request_needs_a_free_long_slot() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=3, long=1), provider("b", long=0)]))
    lease_of(scheduler, long=True)
    # a still has general slots, b has no long slot at all: a long request waits...
    long_request = queued(scheduler, long=True)
    # ...while general requests still get slots.
    assert lease_of(scheduler).provider_id == "b"
    assert lease_of(scheduler).provider_id == "a"
    assert long_request.state is RequestState.PENDING


def test_all_groups_referencing_a_provider_share_its_slots() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=2)], {"x": ["a"], "y": ["a"]}))
    lease_of(scheduler, "x")
    lease_of(scheduler, "y")
    queued(scheduler, "x")
    queued(scheduler, "y")
    assert slots(scheduler) == {"a": (2, 0)}


def test_candidate_choice_prefers_lowest_in_flight() -> None:
    scheduler = PoolScheduler(
        pool([provider("a", capacity=3, priority=0), provider("b", capacity=3, priority=5)])
    )
    assert [lease_of(scheduler).provider_id for _ in range(4)] == ["a", "b", "a", "b"]


def test_candidate_choice_among_equal_in_flight_prefers_lowest_priority_number() -> None:
    scheduler = PoolScheduler(
        pool(
            [
                provider("slow", capacity=4, priority=10),
                provider("fast", capacity=4, priority=0),
                provider("mid", capacity=4, priority=5),
            ]
        )
    )
    assert [lease_of(scheduler).provider_id for _ in range(3)] == ["fast", "mid", "slow"]


def test_candidate_choice_among_equals_rotates_round_robin() -> None:
    scheduler = PoolScheduler(pool([provider(p, capacity=9) for p in "abc"]))
    chosen = []
    for _ in range(6):
        lease = lease_of(scheduler)
        chosen.append(lease.provider_id)
        scheduler.release(lease, 0.0)  # keep in_flight equal so only the rotation decides
    assert chosen == ["a", "b", "c", "a", "b", "c"]


def test_round_robin_rotation_is_kept_per_model_group() -> None:
    scheduler = PoolScheduler(
        pool([provider(p, capacity=9) for p in "ab"], {"x": ["a", "b"], "y": ["a", "b"]})
    )

    def pick(group: str) -> str:
        lease = lease_of(scheduler, group)
        scheduler.release(lease, 0.0)
        return lease.provider_id

    # Group y's rotation does not move when x chooses, and vice versa.
    assert [pick("x"), pick("x"), pick("y"), pick("x"), pick("y")] == ["a", "b", "a", "a", "b"]


def test_round_robin_rotation_is_stable_across_a_policy_swap() -> None:
    providers = [provider(p, capacity=9) for p in "abc"]
    scheduler = PoolScheduler(pool(providers))

    def pick() -> str:
        lease = lease_of(scheduler)
        scheduler.release(lease, 0.0)
        return lease.provider_id

    assert [pick(), pick()] == ["a", "b"]
    scheduler.apply_policy(pool(providers, max_queue=3), 1.0)
    assert pick() == "c"  # the rotation carried on instead of restarting at a
    # A provider new to the group has never been chosen there: it comes first among equals.
    providers.append(provider("d", capacity=9))
    scheduler.apply_policy(pool(providers), 2.0)
    assert [pick(), pick(), pick()] == ["d", "a", "b"]


# -- queueing and refusals ---------------------------------------------------------------------


def test_no_free_candidate_queues_while_fewer_than_max_queue_pending() -> None:
    scheduler = PoolScheduler(pool([provider("a")], max_queue=2))
    lease_of(scheduler)
    queued(scheduler)
    queued(scheduler)
    assert scheduler.statistics().queue_depth == 2


def test_queue_full_rejects_at_once_and_max_queue_caps_all_groups_together() -> None:
    scheduler = PoolScheduler(
        pool([provider("a"), provider("b")], {"x": ["a"], "y": ["b"]}, max_queue=2)
    )
    lease_of(scheduler, "x")
    lease_of(scheduler, "y")
    queued(scheduler, "x")
    queued(scheduler, "y")
    submission = scheduler.submit("x", now=1.0)
    assert submission.request.state is RequestState.REJECTED
    assert rejected(submission.decisions) == [(submission.request.request_id, "queue_full", False)]
    assert rejection(submission.decisions[0]).message == (
        "the admission queue is full: 2 requests pending, max_queue is 2"
    )
    assert scheduler.statistics().rejected["queue_full"] == 1


def test_unknown_model_group_fails_model_not_found_and_never_queues() -> None:
    scheduler = PoolScheduler(pool([provider("a")]))
    submission = scheduler.submit("nope", now=0.0)
    assert rejected(submission.decisions) == [(1, "model_not_found", False)]
    assert scheduler.statistics().queue_depth == 0
    assert scheduler.statistics().rejected["model_not_found"] == 1


def test_group_without_enabled_provider_fails_no_available_provider_and_never_queues() -> None:
    scheduler = PoolScheduler(
        pool([provider("a", enabled=False)], {"m": ["a"], "empty": []}, max_queue=5)
    )
    for group in ("m", "empty"):
        submission = scheduler.submit(group, now=0.0)
        assert submission.request.state is RequestState.REJECTED
        assert rejection(submission.decisions[-1]).reason is RejectReason.NO_AVAILABLE_PROVIDER
        assert (
            rejection(submission.decisions[-1]).message
            == f"model group {group!r} has no enabled provider"
        )
    stats = scheduler.statistics()
    assert stats.queue_depth == 0
    assert stats.rejected["no_available_provider"] == 2


# -- oldest first, work conserving -------------------------------------------------------------


def test_freed_slot_goes_to_the_oldest_pending_request_the_provider_can_serve() -> None:
    scheduler = PoolScheduler(
        pool([provider("a"), provider("b")], {"x": ["a"], "y": ["a", "b"], "z": ["b"]})
    )
    lease_a = lease_of(scheduler, "x")
    lease_of(scheduler, "z")
    only_b = queued(scheduler, "z", now=1.0)  # oldest, but a cannot serve it
    older = queued(scheduler, "y", now=2.0)
    newer = queued(scheduler, "x", now=3.0)
    decisions = scheduler.release(lease_a, 4.0)
    assert dispatched(decisions) == [(older.request_id, "a")]
    assert only_b.state is newer.state is RequestState.PENDING


def test_freed_general_slot_skips_an_older_long_request_when_long_slots_are_full() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=2, long=1)]))
    lease_of(scheduler, long=True)
    general_lease = lease_of(scheduler)
    long_waiting = queued(scheduler, long=True, now=1.0)
    general_waiting = queued(scheduler, now=2.0)
    decisions = scheduler.release(general_lease, 3.0)
    assert dispatched(decisions) == [(general_waiting.request_id, "a")]
    assert long_waiting.state is RequestState.PENDING


def test_work_conserving_freed_long_slot_serves_a_waiting_long_request() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=3, long=1)]))
    long_lease = lease_of(scheduler, long=True)
    long_waiting = queued(scheduler, long=True)
    # The general slots are free and no general request waits; the long one waits for a long slot.
    decisions = scheduler.release(long_lease, 1.0)
    assert dispatched(decisions) == [(long_waiting.request_id, "a")]
    assert slots(scheduler) == {"a": (1, 1)}


def test_work_conserving_new_request_does_not_overtake_the_queue_of_its_kind() -> None:
    scheduler = PoolScheduler(pool([provider("a")]))
    lease = lease_of(scheduler)
    first = queued(scheduler, now=1.0)
    second = queued(scheduler, now=2.0)
    assert dispatched(scheduler.release(lease, 3.0)) == [(first.request_id, "a")]
    assert second.state is RequestState.PENDING


def test_lazy_queue_stays_bounded_when_requests_leave_from_the_middle() -> None:
    """5,000 requests queued and cancelled behind a head that stays: the queue compacts, so
    the cancelled requests are not kept alive (they would hold about 1 MB)."""
    scheduler = PoolScheduler(pool([provider("a")], max_queue=10_000))
    lease_of(scheduler)
    head = queued(scheduler)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(5_000):
            scheduler.cancel(queued(scheduler), 0.0)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    queue = head.queue
    assert queue is not None
    assert list(queue) == [head]
    assert grown < 200_000


def churn(scheduler: PoolScheduler, rounds: int, now: float) -> float:
    """``rounds`` of leases, queued requests, a cancel and releases; returns the new ``now``."""
    for i in range(rounds):
        now += 0.001
        leases = [lease_of(scheduler, long=j == 0, now=now) for j in range(8 - i % 2)]
        if i % 2:
            leases.append(lease_of(scheduler, now=now))
        waiting = [queued(scheduler, now=now) for _ in range(3)]
        scheduler.cancel(waiting[1], now)
        for lease in leases:
            scheduler.release(lease, now)
        for request in (waiting[0], waiting[2]):
            assert request.lease is not None
            scheduler.release(request.lease, now)
    return now


def test_candidate_and_deadline_indexes_stay_bounded_under_churn() -> None:
    """The lazy candidate and deadline indexes are compacted: once warm, 3 000 more rounds of
    churn leave the scheduler's memory within what a compacted index swings by (a few hundred
    KiB: up to ``2 * pending + 64`` deadline entries, each holding its request), where an index
    that kept its stale entries would hold over 2 MiB more (measured: 2.4 MiB with the deadline
    heap uncompacted, 5.6 MiB with the candidate heaps too)."""
    scheduler = PoolScheduler(
        pool([provider(p, capacity=2, long=1) for p in "abcd"], max_queue=4, queue_timeout_ms=1000)
    )
    now = churn(scheduler, 200, 0.0)  # warm: the indexes have reached their working size
    tracemalloc.start()
    try:
        now = churn(scheduler, 1, now)
        before, _ = tracemalloc.get_traced_memory()
        churn(scheduler, 3_000, now)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 1024 * 1024
    assert scheduler.statistics().in_flight == 0


# -- deadlines --------------------------------------------------------------------------------


def test_pending_request_expires_queue_timeout_exactly_at_its_deadline() -> None:
    scheduler = PoolScheduler(pool([provider("a")], queue_timeout_ms=1500))
    lease_of(scheduler, now=0.0)
    request = queued(scheduler, now=10.0)
    assert request.deadline == 11.5
    assert scheduler.next_deadline() == 11.5
    assert scheduler.expire(11.499) == []
    decisions = scheduler.expire(11.5)
    assert rejected(decisions) == [(request.request_id, "queue_timeout", False)]
    assert rejection(decisions[0]).message == (
        "the request waited 1.500 s in the admission queue, past queue_timeout_ms 1500"
    )
    stats = scheduler.statistics()
    assert (stats.expired, stats.rejected["queue_timeout"], stats.queue_depth) == (1, 1, 0)
    assert scheduler.next_deadline() is None


def test_nothing_is_admitted_at_or_after_its_deadline() -> None:
    scheduler = PoolScheduler(pool([provider("a")], queue_timeout_ms=1000))
    lease = lease_of(scheduler, now=0.0)
    late = queued(scheduler, now=0.0)
    on_time = queued(scheduler, now=0.5)
    # The slot frees exactly at the first deadline: that request expired, the next one gets it.
    decisions = scheduler.release(lease, 1.0)
    assert rejected(decisions) == [(late.request_id, "queue_timeout", False)]
    assert dispatched(decisions) == [(on_time.request_id, "a")]


def test_queue_timeout_zero_means_pending_requests_never_expire() -> None:
    scheduler = PoolScheduler(pool([provider("a")], queue_timeout_ms=0))
    lease_of(scheduler)
    request = queued(scheduler)
    assert request.deadline is None
    assert scheduler.next_deadline() is None
    assert scheduler.expire(1e9) == []
    assert request.state is RequestState.PENDING


# -- leases -----------------------------------------------------------------------------------


def test_lease_is_released_once_and_a_second_release_is_a_counted_no_op() -> None:
    scheduler = PoolScheduler(pool([provider("a")]))
    lease = lease_of(scheduler)
    waiting = queued(scheduler)
    assert dispatched(scheduler.release(lease, 1.0)) == [(waiting.request_id, "a")]
    assert scheduler.release(lease, 2.0) == []
    stats = scheduler.statistics()
    assert (stats.released, stats.double_releases) == (1, 1)
    assert slots(scheduler) == {"a": (1, 0)}  # the second release freed nothing


def test_release_of_a_lease_from_another_scheduler_is_refused() -> None:
    policy = pool([provider("a")])
    lease = lease_of(PoolScheduler(policy))
    with pytest.raises(ValueError, match="was not granted by this scheduler"):
        PoolScheduler(policy).release(lease, 0.0)


def test_lease_records_when_it_was_granted() -> None:
    scheduler = PoolScheduler(pool([provider("a")]))
    first = lease_of(scheduler, now=1.0)
    request = queued(scheduler, now=2.0)
    scheduler.release(first, 5.0)
    assert request.lease is not None
    assert (request.submitted_at, request.lease.granted_at) == (2.0, 5.0)
    assert (request.lease.node_id, request.lease.provider_id, request.lease.key) == (
        "n1",
        "a",
        ("n1", "a"),
    )


# -- client cancel ----------------------------------------------------------------------------


def test_client_cancel_of_a_pending_request_leaves_the_queue_counted_client_gone() -> None:
    scheduler = PoolScheduler(pool([provider("a")], queue_timeout_ms=5000))
    lease = lease_of(scheduler)
    gone = queued(scheduler, now=0.0)
    stays = queued(scheduler, now=1.0)
    decisions = scheduler.cancel(gone, 2.0)
    assert rejected(decisions) == [(gone.request_id, "client_gone", False)]
    assert scheduler.next_deadline() == 6.0  # the cancelled one's deadline is gone too
    assert dispatched(scheduler.release(lease, 3.0)) == [(stays.request_id, "a")]
    stats = scheduler.statistics()
    assert (stats.rejected["client_gone"], stats.queue_depth) == (1, 0)


def test_cancel_of_a_request_pending_in_another_scheduler_is_refused() -> None:
    policy = pool([provider("a")])
    other = PoolScheduler(policy)
    lease_of(other)
    foreign = queued(other)
    scheduler = PoolScheduler(policy)
    with pytest.raises(ValueError, match="is not pending in this scheduler"):
        scheduler.cancel(foreign, 0.0)
    assert (scheduler.statistics().queue_depth, other.statistics().queue_depth) == (0, 1)


def test_cancel_of_a_request_that_is_no_longer_pending_does_nothing() -> None:
    scheduler = PoolScheduler(pool([provider("a")]))
    lease = lease_of(scheduler)
    assert scheduler.cancel(lease.request, 1.0) == []
    assert scheduler.statistics().rejected["client_gone"] == 0
    assert slots(scheduler) == {"a": (1, 0)}


# -- live policy swap (SPEC §4) ----------------------------------------------------------------


def test_raising_capacity_dispatches_pending_requests_at_once_oldest_first() -> None:
    scheduler = PoolScheduler(pool([provider("a")]))
    lease_of(scheduler)
    waiting = [queued(scheduler, now=float(i)) for i in range(3)]
    decisions = scheduler.apply_policy(pool([provider("a", capacity=3)]), 5.0)
    assert dispatched(decisions) == [(waiting[0].request_id, "a"), (waiting[1].request_id, "a")]
    assert waiting[2].state is RequestState.PENDING


def test_enabling_a_provider_dispatches_pending_requests_at_once() -> None:
    providers = [provider("a"), provider("b", enabled=False)]
    scheduler = PoolScheduler(pool(providers))
    lease_of(scheduler)
    waiting = queued(scheduler)
    providers[1] = provider("b", enabled=True)
    assert dispatched(scheduler.apply_policy(pool(providers), 1.0)) == [(waiting.request_id, "b")]


def test_adding_a_provider_to_a_group_dispatches_pending_requests_at_once() -> None:
    providers = [provider("a"), provider("b")]
    scheduler = PoolScheduler(pool(providers, {"m": ["a"], "o": ["b"]}))
    lease_of(scheduler)
    waiting = queued(scheduler)
    decisions = scheduler.apply_policy(pool(providers, {"m": ["a", "b"], "o": ["b"]}), 1.0)
    assert dispatched(decisions) == [(waiting.request_id, "b")]


def test_lowering_capacity_below_in_flight_cancels_nothing_and_new_dispatches_wait() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=3)]))
    leases = [lease_of(scheduler) for _ in range(3)]
    assert scheduler.apply_policy(pool([provider("a", capacity=1)]), 1.0) == []
    assert slots(scheduler) == {"a": (3, 0)}
    waiting = queued(scheduler, now=2.0)
    assert scheduler.release(leases[0], 3.0) == []  # in_flight 2 > capacity 1: still waits
    assert scheduler.release(leases[1], 4.0) == []  # in_flight 1 == capacity 1
    assert dispatched(scheduler.release(leases[2], 5.0)) == [(waiting.request_id, "a")]
    assert slots(scheduler) == {"a": (1, 0)}


def test_lowering_max_queue_evicts_nothing_and_only_new_submits_see_the_limit() -> None:
    scheduler = PoolScheduler(pool([provider("a")], max_queue=3))
    lease = lease_of(scheduler)
    waiting = [queued(scheduler) for _ in range(3)]
    assert scheduler.apply_policy(pool([provider("a")], max_queue=1), 1.0) == []
    assert all(r.state is RequestState.PENDING for r in waiting)
    full = scheduler.submit("m", now=2.0).decisions
    assert rejection(full[-1]).reason is RejectReason.QUEUE_FULL
    assert dispatched(scheduler.release(lease, 3.0)) == [(waiting[0].request_id, "a")]
    assert scheduler.statistics().queue_depth == 2


def test_new_queue_timeout_recomputes_every_deadline_from_enqueue_time() -> None:
    scheduler = PoolScheduler(pool([provider("a")], queue_timeout_ms=10_000))
    lease_of(scheduler)
    old = queued(scheduler, now=0.0)
    young = queued(scheduler, now=4.0)
    decisions = scheduler.apply_policy(pool([provider("a")], queue_timeout_ms=5_000), 5.0)
    # old waited 5 s: at its new deadline exactly, so it expires now; young gets 4 + 5 = 9.
    assert rejected(decisions) == [(old.request_id, "queue_timeout", False)]
    assert young.deadline == 9.0
    assert scheduler.next_deadline() == 9.0
    scheduler.apply_policy(pool([provider("a")], queue_timeout_ms=20_000), 6.0)
    assert young.deadline == 24.0
    assert rejected(scheduler.expire(24.0)) == [(young.request_id, "queue_timeout", False)]


def test_queue_timeout_set_to_zero_removes_every_deadline() -> None:
    scheduler = PoolScheduler(pool([provider("a")], queue_timeout_ms=1000))
    lease_of(scheduler)
    request = queued(scheduler, now=0.0)
    assert scheduler.apply_policy(pool([provider("a")], queue_timeout_ms=0), 0.5) == []
    assert request.deadline is None
    assert scheduler.next_deadline() is None
    assert scheduler.expire(100.0) == []
    # And a timeout set again later counts from the original enqueue time.
    decisions = scheduler.apply_policy(pool([provider("a")], queue_timeout_ms=1000), 100.0)
    assert rejected(decisions) == [(request.request_id, "queue_timeout", False)]


def test_removed_group_fails_its_pending_model_not_found_counted_as_config_change() -> None:
    providers = [provider("a"), provider("b")]
    scheduler = PoolScheduler(pool(providers, {"x": ["a"], "y": ["b"]}))
    lease_of(scheduler, "x")
    lease_of(scheduler, "y")
    gone = queued(scheduler, "x")
    kept = queued(scheduler, "y")
    decisions = scheduler.apply_policy(pool(providers, {"y": ["b"]}), 1.0)
    assert rejected(decisions) == [(gone.request_id, "model_not_found", True)]
    assert rejection(decisions[0]).message == "model group 'x' was removed by a config change"
    assert kept.state is RequestState.PENDING
    stats = scheduler.statistics()
    assert (stats.rejected["config_change"], stats.rejected["model_not_found"]) == (1, 0)
    assert rejected(scheduler.submit("x", now=2.0).decisions) == [(5, "model_not_found", False)]


def test_group_losing_its_last_enabled_provider_fails_pending_no_available_provider() -> None:
    scheduler = PoolScheduler(pool([provider("a")], max_queue=4))
    lease = lease_of(scheduler)
    waiting = [queued(scheduler, now=float(i)) for i in range(2)]
    decisions = scheduler.apply_policy(pool([provider("a", enabled=False)], max_queue=4), 5.0)
    assert rejected(decisions) == [
        (waiting[0].request_id, "no_available_provider", True),
        (waiting[1].request_id, "no_available_provider", True),
    ]
    stats = scheduler.statistics()
    assert (stats.rejected["config_change"], stats.queue_depth) == (2, 0)
    # The existing lease is kept and released normally; the disabled provider gets no new work.
    assert slots(scheduler) == {"a": (1, 0)}
    assert scheduler.release(lease, 6.0) == []
    assert slots(scheduler) == {"a": (0, 0)}


def test_existing_leases_are_kept_across_a_policy_swap() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=2, long=1)]))
    general = lease_of(scheduler)
    long = lease_of(scheduler, long=True)
    scheduler.apply_policy(pool([provider("a", capacity=4, long=2, priority=3)]), 1.0)
    assert slots(scheduler) == {"a": (2, 1)}
    scheduler.release(long, 2.0)
    scheduler.release(general, 2.0)
    assert slots(scheduler) == {"a": (0, 0)}
    assert scheduler.statistics().released == 2


def test_lease_on_removed_provider_is_released_without_corrupting_counts() -> None:
    scheduler = PoolScheduler(pool([provider("a"), provider("b")]))
    lease_a = lease_of(scheduler)
    lease_b = lease_of(scheduler)
    scheduler.apply_policy(pool([provider("b")]), 1.0)
    stats = scheduler.statistics()
    assert [(p.provider_id, p.status, p.in_flight) for p in stats.providers] == [
        ("b", "active", 1),
        ("a", "removed", 1),
    ]
    waiting = queued(scheduler, now=2.0)
    assert scheduler.release(lease_a, 3.0) == []  # a is gone: its slot serves nobody
    assert [p.provider_id for p in scheduler.statistics().providers] == ["b"]
    assert dispatched(scheduler.release(lease_b, 4.0)) == [(waiting.request_id, "b")]
    assert scheduler.release(lease_a, 5.0) == []  # and a late second release is still counted
    assert scheduler.statistics().double_releases == 1


def test_provider_removed_then_readded_keeps_the_count_of_its_surviving_leases() -> None:
    scheduler = PoolScheduler(pool([provider("a", capacity=2), provider("b")]))
    lease = lease_of(scheduler)
    assert lease.provider_id == "a"
    scheduler.apply_policy(pool([provider("b")]), 1.0)
    scheduler.apply_policy(pool([provider("a", capacity=2), provider("b")]), 2.0)
    assert slots(scheduler) == {"a": (1, 0), "b": (0, 0)}
    scheduler.release(lease, 3.0)
    assert slots(scheduler) == {"a": (0, 0), "b": (0, 0)}


# -- statistics --------------------------------------------------------------------------------


def test_statistics_show_enabled_and_disabled_providers() -> None:
    scheduler = PoolScheduler(
        pool(
            [
                provider("a", node="gpu-1", capacity=8, long=2, priority=0),
                provider("b", node="gpu-2", capacity=3, long=1, priority=10, enabled=False),
            ]
        )
    )
    lease_of(scheduler, long=True)
    stats = scheduler.statistics()
    assert [dataclasses.astuple(p)[:10] for p in stats.providers] == [
        ("gpu-1", "a", "active", "unknown", True, 8, 2, 1, 1, 0),
        ("gpu-2", "b", "disabled", "disabled", False, 0, 0, 0, 0, 10),
    ]


def test_statistics_counters_agree_with_the_requests_fates() -> None:
    scheduler = PoolScheduler(pool([provider("a")], max_queue=2, queue_timeout_ms=1000))
    lease = lease_of(scheduler, now=0.0)
    scheduler.submit("missing", now=0.0)
    timed_out = queued(scheduler, now=0.0)
    cancelled = queued(scheduler, now=0.1)
    scheduler.submit("m", now=0.2)  # queue_full
    scheduler.cancel(cancelled, 0.3)
    scheduler.expire(1.0)
    assert timed_out.state is RequestState.REJECTED
    winner = queued(scheduler, now=1.5)
    scheduler.release(lease, 2.0)
    scheduler.release(lease, 2.0)
    assert winner.lease is not None
    stats = scheduler.statistics()
    assert stats.submitted == 6
    assert stats.admitted == 2
    assert dict(stats.rejected) == {
        "queue_full": 1,
        "principal_queue_full": 0,
        "rate_limit_exceeded": 0,
        "queue_timeout": 1,
        "no_available_provider": 0,
        "model_not_found": 1,
        "config_change": 0,
        "client_gone": 1,
        "handed_over": 0,
        "store_unavailable": 0,
    }
    assert (stats.expired, stats.rejected_total, stats.released, stats.double_releases) == (
        1,
        4,
        1,
        1,
    )
    assert (stats.queue_depth, stats.in_flight, stats.max_queue, stats.queue_timeout_ms) == (
        0,
        1,
        2,
        1000,
    )
    assert stats.submitted == stats.admitted + stats.rejected_total + stats.queue_depth


def test_statistics_is_a_frozen_snapshot() -> None:
    scheduler = PoolScheduler(pool([provider("a")]))
    before = scheduler.statistics()
    lease_of(scheduler)
    assert before.admitted == 0
    assert before.providers[0].in_flight == 0
    # The types forbid both writes already (frozen dataclass, read-only Mapping): the ignores
    # let the test check that the runtime refuses them too.
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.admitted = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        before.rejected["queue_full"] = 1  # type: ignore[index]


# -- policy --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity": 0}, "capacity 0 is below 1"),
        ({"capacity": 2, "long": 3}, "long_context_capacity 3 is outside 0..capacity"),
        ({"long": -1}, "long_context_capacity -1 is outside"),
        ({"priority": -1}, "priority -1 is negative"),
    ],
)
def test_provider_policy_checks_its_bounds(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        provider("a", **kwargs)


def test_pool_policy_checks_queue_bounds_and_group_references() -> None:
    a = provider("a")
    with pytest.raises(ValueError, match="max_queue 0 is below 1"):
        PoolPolicy(max_queue=0, queue_timeout_ms=0, providers=(a,), groups={})
    with pytest.raises(ValueError, match="queue_timeout_ms -1 is negative"):
        PoolPolicy(max_queue=1, queue_timeout_ms=-1, providers=(a,), groups={})
    with pytest.raises(ValueError, match="listed twice"):
        PoolPolicy(max_queue=1, queue_timeout_ms=0, providers=(a, a), groups={})
    with pytest.raises(ValueError, match="references provider n1/zz"):
        PoolPolicy(max_queue=1, queue_timeout_ms=0, providers=(a,), groups={"m": (("n1", "zz"),)})
    with pytest.raises(ValueError, match="lists a provider twice"):
        PoolPolicy(max_queue=1, queue_timeout_ms=0, providers=(a,), groups={"m": (a.key, a.key)})


def test_pool_policy_groups_cannot_be_changed_after_construction() -> None:
    groups: dict[str, tuple[tuple[str, str], ...]] = {"m": (("n1", "a"),)}
    policy = PoolPolicy(max_queue=1, queue_timeout_ms=0, providers=(provider("a"),), groups=groups)
    groups["other"] = ()
    assert list(policy.groups) == ["m"]
    with pytest.raises(TypeError):
        # a read-only Mapping in the types already: the test checks the runtime refuses it too
        policy.groups["x"] = ()  # type: ignore[index]


def test_pending_request_handles_compare_by_identity() -> None:
    one = PendingRequest(1, "m", False, 0.0)
    assert one != PendingRequest(1, "m", False, 0.0)
    assert {one: "waiter"}[one] == "waiter"

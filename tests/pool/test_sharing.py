"""The pure scheduler shares freed slots among principals (SPEC §5.2, :mod:`iop_edge.pool.fair`
wired into :class:`PoolScheduler`): by weight across principals, oldest first within one, a
principal at its ``max_in_flight`` skipped (not refused) until one of its leases comes back, and
live changes of weights, caps and mode.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from iop_edge.pool import Dispatch, PendingRequest, PoolPolicy, PoolScheduler, SlotLease
from tests.helpers.pool import check_counters, dispatched, pool, provider


def sharing(
    capacity: int = 1,
    *,
    weights: dict[str, float] | None = None,
    caps: dict[str, int] | None = None,
    mode: str = "principal",
) -> PoolPolicy:
    return dataclasses.replace(
        pool([provider("a", capacity=capacity)], max_queue=1000),
        weights=weights or {},
        caps=caps or {},
        fair_share=mode,  # type: ignore[arg-type]
    )


def submit(scheduler: PoolScheduler, principal: str, now: float = 0.0) -> SlotLease | None:
    """Submit a request of ``principal``; its lease when it was dispatched at once."""
    return scheduler.submit("m", now=now, principal=principal).request.lease


def serve(scheduler: PoolScheduler, lease: SlotLease, rounds: int) -> list[PendingRequest]:
    """Release the running lease ``rounds`` times; the requests its slot went to, in order."""
    served = []
    for _ in range(rounds):
        (request,) = [d.request for d in scheduler.release(lease, 1.0) if isinstance(d, Dispatch)]
        assert request.lease is not None
        lease = request.lease
        served.append(request)
    return served


def principals(requests: list[PendingRequest]) -> list[str]:
    return [r.principal for r in requests]


def test_weights_share_the_freed_slots_3_to_1() -> None:
    scheduler = PoolScheduler(sharing(weights={"batch": 1, "chat": 3}))
    running = submit(scheduler, "batch")
    assert running is not None
    for _ in range(40):
        submit(scheduler, "batch")
        submit(scheduler, "chat")
    served = Counter(principals(serve(scheduler, running, 40)))
    assert served == {"chat": 30, "batch": 10}
    check_counters(scheduler)


def test_oldest_first_within_a_principal() -> None:
    scheduler = PoolScheduler(sharing())
    running = submit(scheduler, "a")
    assert running is not None
    waiting = [scheduler.submit("m", now=0.0, principal=p).request for p in "abab"]
    served = serve(scheduler, running, 4)
    assert [r for r in served if r.principal == "a"] == [waiting[0], waiting[2]]
    assert [r for r in served if r.principal == "b"] == [waiting[1], waiting[3]]


def test_a_principal_at_its_cap_is_skipped_not_refused_and_served_when_a_lease_returns() -> None:
    scheduler = PoolScheduler(sharing(capacity=2, caps={"batch": 1}))
    first = submit(scheduler, "batch")
    assert first is not None
    waiting = scheduler.submit("m", now=0.0, principal="batch").request
    assert waiting.lease is None  # a slot is free, but batch is at its cap: it waits
    other = submit(scheduler, "chat")
    assert other is not None  # another principal takes the free slot at once
    assert scheduler.release(other, 1.0) == []  # batch still at its cap: the slot stays free
    (served,) = dispatched(scheduler.release(first, 2.0))
    assert served == (waiting.request_id, "a")
    check_counters(scheduler)


def test_a_cap_raised_live_dispatches_the_waiting_requests_at_once() -> None:
    scheduler = PoolScheduler(sharing(capacity=3, caps={"batch": 1}))
    assert submit(scheduler, "batch") is not None
    waiting = [scheduler.submit("m", now=0.0, principal="batch").request for _ in range(2)]
    assert all(r.lease is None for r in waiting)
    decisions = scheduler.apply_policy(sharing(capacity=3, caps={"batch": 3}), 1.0)
    assert dispatched(decisions) == [(r.request_id, "a") for r in waiting]


def test_mode_none_serves_in_arrival_order() -> None:
    scheduler = PoolScheduler(sharing(mode="none"))
    running = submit(scheduler, "batch")
    assert running is not None
    for principal in ["batch", "batch", "batch", "chat"]:
        submit(scheduler, principal)
    assert principals(serve(scheduler, running, 4)) == ["batch", "batch", "batch", "chat"]


def test_switching_to_fair_share_live_reorders_the_waiting_requests_without_losing_one() -> None:
    scheduler = PoolScheduler(sharing(mode="none"))
    running = submit(scheduler, "batch")
    assert running is not None
    for principal in ["batch", "batch", "batch", "chat"]:
        submit(scheduler, principal)
    assert scheduler.apply_policy(sharing(), 0.5) == []
    assert scheduler.queue_depth == 4
    assert principals(serve(scheduler, running, 4)) == ["batch", "chat", "batch", "batch"]
    check_counters(scheduler)


def test_a_principal_at_its_max_queued_is_refused_principal_queue_full() -> None:
    policy = dataclasses.replace(sharing(), queue_caps={"batch": 1})
    scheduler = PoolScheduler(policy)
    assert submit(scheduler, "batch") is not None
    assert submit(scheduler, "batch") is None  # queued: its one allowed
    refused = scheduler.submit("m", now=0.0, principal="batch").request
    assert refused.rejection is not None
    assert refused.rejection.reason.value == "principal_queue_full"
    assert submit(scheduler, "chat") is None  # another principal still queues
    stats = scheduler.statistics()
    assert (stats.queue_depth, stats.rejected["principal_queue_full"]) == (2, 1)
    check_counters(scheduler)


def test_max_requests_per_minute_refuses_with_the_seconds_until_the_next_is_allowed() -> None:
    """A bucket of 2 a minute: two at once, the third refused (30 s until a token is back),
    allowed again once it is; another principal is not limited."""
    scheduler = PoolScheduler(dataclasses.replace(sharing(capacity=10), per_minute={"batch": 2}))
    assert submit(scheduler, "batch", 0.0) is not None
    assert submit(scheduler, "batch", 0.0) is not None
    refused = scheduler.submit("m", now=0.0, principal="batch").request.rejection
    assert refused is not None
    assert (refused.reason.value, refused.retry_after) == ("rate_limit_exceeded", 30.0)
    assert submit(scheduler, "chat", 0.0) is not None
    assert scheduler.submit("m", now=29.5, principal="batch").request.rejection is not None
    assert scheduler.submit("m", now=30.25, principal="batch").request.rejection is None
    assert scheduler.statistics().rejected["rate_limit_exceeded"] == 2
    check_counters(scheduler)


def test_the_rate_bucket_refills_at_per_minute_over_60_a_second() -> None:
    scheduler = PoolScheduler(dataclasses.replace(sharing(capacity=100), per_minute={"batch": 60}))
    for _ in range(60):
        assert submit(scheduler, "batch", 0.0) is not None
    refused = scheduler.submit("m", now=0.5, principal="batch").request.rejection
    assert refused is not None
    assert refused.retry_after == 0.5
    assert submit(scheduler, "batch", 1.0) is not None  # one token back after a second


def test_statistics_show_each_known_principal_its_policy_counts_and_refusals() -> None:
    """The policy's principals are listed before their first request; one a live change
    forgets stays listed while it holds or awaits a slot, and goes once it is idle."""
    policy = dataclasses.replace(
        sharing(),
        principals=("batch", "chat", "idle"),
        weights={"chat": 3},
        caps={"batch": 2},
        queue_caps={"batch": 1},
        per_minute={"chat": 600},
    )
    scheduler = PoolScheduler(policy)
    lease = submit(scheduler, "batch")
    assert lease is not None
    assert submit(scheduler, "batch") is None
    assert submit(scheduler, "batch") is None  # refused: principal_queue_full
    rows = {p.principal: p for p in scheduler.statistics().principals}
    assert list(rows) == ["batch", "chat", "idle"]
    batch = rows["batch"]
    assert (batch.in_flight, batch.queued, batch.max_in_flight, batch.max_queued) == (1, 1, 2, 1)
    assert dict(batch.rejected) == {"principal_queue_full": 1}
    chat = rows["chat"]
    assert (chat.weight, chat.max_requests_per_minute, chat.in_flight, chat.queued) == (
        3.0,
        600,
        0,
        0,
    )
    scheduler.apply_policy(dataclasses.replace(policy, principals=("chat",)), 1.0)
    assert [p.principal for p in scheduler.statistics().principals] == ["batch", "chat"]
    (waiting,) = [d.request for d in scheduler.release(lease, 1.0) if isinstance(d, Dispatch)]
    assert waiting.lease is not None
    scheduler.release(waiting.lease, 1.0)
    assert [p.principal for p in scheduler.statistics().principals] == ["chat"]
    check_counters(scheduler)


def test_a_request_queued_only_by_its_cap_gets_the_free_slot_when_a_lease_comes_back() -> None:
    """d holds its one lease on g1's provider; its request for g0 queues beside g0's free
    provider (d is at its cap). When d's lease is released, that free slot goes to it at once
    (found by the property machine: it used to wait for an event on g0)."""
    policy = dataclasses.replace(
        pool([provider("p"), provider("r")], {"g0": ["p"], "g1": ["r"]}), caps={"d": 1}
    )
    scheduler = PoolScheduler(policy)
    first = scheduler.submit("g1", now=0.0, principal="d").request
    waiting = scheduler.submit("g0", now=0.0, principal="d").request
    assert first.lease is not None
    assert waiting.lease is None
    assert dispatched(scheduler.release(first.lease, 1.0)) == [(waiting.request_id, "p")]
    check_counters(scheduler)


def test_a_cap_lowered_live_parks_the_waiting_requests_so_a_release_serves_them() -> None:
    """One live change frees a slot (p's capacity raised) and lowers d's cap to the lease it
    holds: d's waiting request stays queued beside the free slot, and d's next release hands
    it that slot."""
    policy = pool([provider("p"), provider("r")], {"g0": ["p"], "g1": ["r"]})
    scheduler = PoolScheduler(policy)
    held = scheduler.submit("g1", now=0.0, principal="d").request
    busy = scheduler.submit("g0", now=0.0, principal="x").request
    waiting = scheduler.submit("g0", now=0.0, principal="d").request  # p is busy: it queues
    assert held.lease is not None
    assert busy.lease is not None
    assert waiting.lease is None
    changed = pool([provider("p", capacity=2), provider("r")], {"g0": ["p"], "g1": ["r"]})
    assert scheduler.apply_policy(dataclasses.replace(changed, caps={"d": 1}), 1.0) == []
    assert dispatched(scheduler.release(held.lease, 2.0)) == [(waiting.request_id, "p")]
    check_counters(scheduler)

"""Builders shared by the pure-core tests (``test_scheduler.py``, ``test_health*.py``,
``test_failover.py``): a health policy whose times are binary fractions (exact comparisons
hold), failures of each kind, and small policies, leases and views of a scheduler.
"""

from __future__ import annotations

from iop_edge.pool import (
    RETRY_CLASSES,
    Decision,
    Dispatch,
    Failure,
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

POLICY = HealthPolicy(failure_threshold=2, eject_ms=1000, max_eject_ms=4000, probe_interval_ms=250)
"""Two failures eject for 1 s, then 2 s, then 4 s (the cap); probes every 0.25 s."""

REFUSED = Failure("connect", "connection refused")
BAD_GATEWAY = Failure("status_5xx", "the provider answered 502")
TIMEOUT = Failure("timeout", "no response head within 30 s")


def busy(retry_after: float | None = None) -> Failure:
    return Failure("status_429", "the provider answered 429", retry_after)


def provider(
    pid: str,
    *,
    node: str = "n1",
    capacity: int = 1,
    long: int | None = None,
    priority: int = 0,
    enabled: bool = True,
    probe: bool = False,
    retry_on: frozenset[str] = frozenset(RETRY_CLASSES),
    remote: bool = False,
) -> ProviderPolicy:
    return ProviderPolicy(
        node_id=node,
        provider_id=pid,
        capacity=capacity,
        long_context_capacity=capacity if long is None else long,
        priority=priority,
        enabled=enabled,
        probe=probe,
        retry_on=retry_on,
        remote=remote,
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
    by_id = {p.provider_id: p.key for p in providers}
    if groups is None:
        groups = {"m": [p.provider_id for p in providers]}
    return PoolPolicy(
        max_queue=max_queue,
        queue_timeout_ms=queue_timeout_ms,
        providers=tuple(providers),
        groups={g: tuple(by_id[pid] for pid in pids) for g, pids in groups.items()},
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
    assert submission.request.state is RequestState.DISPATCHED, submission
    assert submission.request.lease is not None
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

"""Frozen snapshots of the scheduler's state, read by the admin status API and by metrics.

A snapshot costs O(providers) and never walks the queue, so a Prometheus collector can take one
at every scrape; the counters live only in the scheduler (no count is kept twice).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from iop_edge.pool.health import ProviderHealth

if TYPE_CHECKING:
    from iop_edge.pool.slots import ProviderSlot

REJECTION_COUNTERS: tuple[str, ...] = (
    "queue_full",
    "principal_queue_full",
    "rate_limit_exceeded",
    "queue_timeout",
    "no_available_provider",
    "model_not_found",
    "config_change",
    "client_gone",
    "handed_over",
    "store_unavailable",
)
"""The keys of :attr:`PoolStatistics.rejected`, in a stable order.

Every rejected request is counted under exactly one key: ``config_change`` for a pending request
dropped by a live policy swap (its error reason is still ``model_not_found`` or
``no_available_provider``), otherwise its reason. ``model_not_found`` and
``no_available_provider`` therefore count refusals at submit time, and
``no_available_provider`` also the requests failing over that lost their last untried provider.
"""

STATUS_ACTIVE = "active"
"""Provider status of an enabled provider of the policy."""
STATUS_DISABLED = "disabled"
"""Provider status (and health) of a provider disabled by the policy."""
STATUS_REMOVED = "removed"
"""Provider status of a provider gone from the policy whose leases are still held."""
HEALTH_DISCONNECTED = "disconnected"
"""Health of an enabled remote provider while its node link is down (its status: active)."""


@dataclass(frozen=True, slots=True)
class ProviderStatistics:
    """One provider's slots as the status API shows them.

    Enabled: ``status="active"``, ``health`` ``unknown`` (no evidence yet), ``healthy`` (its
    last request or probe succeeded) or ``unhealthy`` (ejected until ``ejected_until``, or
    ``half_open``: waiting for its trial request), the policy's capacities; a remote provider
    whose node link is down reads ``disconnected`` (``connected`` false; no dispatch goes to
    it, its requests queue, its health starts over when the link is back). Disabled:
    ``status="disabled"``, ``health="disabled"``, ``capacity=0`` and ``long_context_capacity=0``.
    Removed from the policy but still leased: ``status="removed"``, ``health="disabled"``,
    capacities 0, listed after the policy's providers until its last lease is released.
    ``held_elsewhere`` / ``long_held_elsewhere``: its leases held by the other edges sharing
    the pool (or a static split's reserve), counted against its capacities here.
    ``in_flight`` counts every held lease (long ones included); ``long_in_flight`` the long ones.
    Health detail: ``consecutive_failures`` (failed requests and failed idle probes since the
    last success) and ``last_failure`` (a sentence), ``held_until`` (a 429's ``Retry-After``),
    ``probes_trusted`` (false once its probes pass while its requests fail: a probe no longer
    ends its ejection, until a request succeeds), counters ``ejections``, ``probes_ok``,
    ``probes_failed`` (probes of ejected and of idle providers). Times are the scheduler's
    monotonic seconds.
    """

    node_id: str
    provider_id: str
    status: str
    health: str
    enabled: bool
    capacity: int
    long_context_capacity: int
    in_flight: int
    long_in_flight: int
    priority: int
    consecutive_failures: int = 0
    last_failure: str | None = None
    ejected_until: float | None = None
    half_open: bool = False
    held_until: float | None = None
    ejections: int = 0
    probes_ok: int = 0
    probes_failed: int = 0
    probes_trusted: bool = True
    connected: bool = True
    held_elsewhere: int = 0
    long_held_elsewhere: int = 0


@dataclass(frozen=True, slots=True)
class GroupStatistics:
    """One model group: its enabled members (connected or not), and whether it is in panic
    (every connected one of them ejected or held, so health is ignored for it).
    ``derived_from``: the model whose providers a derived group shares (its ``[completions]``
    or ``[embeddings]`` group), whose panic alone is reported; ``None`` for a model's own
    group."""

    group_id: str
    members: int
    panic: bool
    derived_from: str | None = None


@dataclass(frozen=True, slots=True)
class PrincipalStatistics:
    """One principal's share of the pool (SPEC §5.2): its policy (``None``: no such limit),
    the leases it holds and requests it has waiting now, and its refusals since start by
    reason."""

    principal: str
    weight: float
    max_in_flight: int | None
    max_queued: int | None
    max_requests_per_minute: int | None
    in_flight: int
    queued: int
    rejected: Mapping[str, int]
    in_flight_elsewhere: int = 0


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """A frozen snapshot of the scheduler.

    ``queue_depth`` is the number of pending requests (failing-over ones included). Counters
    since start: ``admitted`` counts slots granted (a request failing over gets more than one),
    ``failovers`` the requests that re-entered admission after a failed attempt, and
    ``submitted`` + ``failovers`` = ``admitted`` + sum(``rejected``) + ``queue_depth`` always
    holds; ``released`` counts first releases, ``double_releases`` the ignored repeats;
    ``inherited`` counts the leases taken over from another process (a handover), released
    like any: ``released + in_flight == admitted + inherited`` always holds, so at rest
    ``released == admitted + inherited``.
    """

    queue_depth: int
    max_queue: int
    queue_timeout_ms: int
    providers: tuple[ProviderStatistics, ...]
    submitted: int
    admitted: int
    rejected: Mapping[str, int]
    released: int
    double_releases: int
    failovers: int = 0
    inherited: int = 0
    groups: tuple[GroupStatistics, ...] = ()
    principals: tuple[PrincipalStatistics, ...] = ()

    @property
    def expired(self) -> int:
        """Pending requests that waited past their deadline (``rejected["queue_timeout"]``)."""
        return self.rejected["queue_timeout"]

    @property
    def rejected_total(self) -> int:
        """Every rejected request, whatever the reason."""
        return sum(self.rejected.values())

    @property
    def in_flight(self) -> int:
        """Leases currently held, over every provider."""
        return sum(p.in_flight for p in self.providers)


_NO_HEALTH: Final = ProviderHealth(can_probe=False)
"""What a disabled provider shows of its health: nothing (it starts ``unknown`` when enabled)."""


def provider_statistics(slot: ProviderSlot) -> ProviderStatistics:
    """The status view of one provider slot record (see :class:`ProviderStatistics`)."""
    node_id, provider_id = slot.key
    state = slot.health if slot.enabled else _NO_HEALTH
    if slot.enabled:
        status = STATUS_ACTIVE
        health = state.health.value if slot.connected else HEALTH_DISCONNECTED
        capacity, long_capacity = slot.configured, slot.long_configured
    else:
        status = STATUS_DISABLED if slot.in_policy else STATUS_REMOVED
        health, capacity, long_capacity = STATUS_DISABLED, 0, 0
    return ProviderStatistics(
        node_id=node_id,
        provider_id=provider_id,
        status=status,
        health=health,
        enabled=slot.enabled,
        capacity=capacity,
        long_context_capacity=long_capacity,
        in_flight=slot.in_flight,
        long_in_flight=slot.long_in_flight,
        priority=slot.priority,
        consecutive_failures=state.consecutive_failures,
        last_failure=state.last_failure,
        ejected_until=state.ejected_until,
        half_open=state.half_open,
        held_until=state.held_until,
        ejections=state.ejections_total,
        probes_ok=state.probes_ok,
        probes_failed=state.probes_failed,
        probes_trusted=state.probes_trusted,
        connected=slot.connected,
        held_elsewhere=slot.elsewhere,
        long_held_elsewhere=slot.long_elsewhere,
    )

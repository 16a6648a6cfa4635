"""The metrics of a pool shared by several edges (``provider_pool.shared``), read at scrape time
from :meth:`iop_edge.shared.gate.SharedGate.statistics`: the store's state, its calls, errors
and latency as this edge's client saw them, the members, and each provider's leases over every
edge as the store counts them. Registered only when the pool is shared: an edge alone exports
none of these series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from iop_edge.collectors import Family

if TYPE_CHECKING:
    from iop_edge.shared.gate import GateStatistics

__all__ = ["SHARED_FAMILIES", "SharedPoolCollector"]

SHARED_STORE_UP = Family(
    "gauge",
    "iop_edge_shared_store_up",
    "1 while the shared store answers and its counts rule admission here; 0 while it is out "
    "of reach (provider_pool.shared.on_store_down rules) and for one renewal period "
    "(lease_ttl_ms / 3) after it answers again, while the static split still holds.",
)
SHARED_STORE_CALLS = Family(
    "counter",
    "iop_edge_shared_store_calls",
    "Calls this edge made to the shared store, by operation, failed ones included.",
    ("op",),
)
SHARED_STORE_ERRORS = Family(
    "counter",
    "iop_edge_shared_store_errors",
    "Calls to the shared store that failed (refused, lost, or no answer within the bound), "
    "by operation.",
    ("op",),
)
SHARED_MEMBERS = Family(
    "gauge",
    "iop_edge_shared_members",
    "The edges sharing the pool (live members of the store at the last heartbeat; while the "
    "store is down, the last count seen: the static split's divisor).",
)
SHARED_REFUSED = Family(
    "counter",
    "iop_edge_shared_refused",
    "Dispatches of this edge the store refused because the other edges held the slot (the "
    "request waited again in its place).",
)
SHARED_LEASES_LOST = Family(
    "counter",
    "iop_edge_shared_leases_lost",
    "Leases of this edge the store no longer held at a renewal (not renewed within "
    "lease_ttl_ms): their requests were stopped.",
)
PROVIDER_LEASES = Family(
    "gauge",
    "iop_edge_provider_leases",
    "A provider's leases over every edge sharing the pool, as the store counts them, by slot "
    "(general|long, as iop_edge_provider_in_flight). Every edge exports the same count: "
    "aggregate with max, not sum. No series while the store is down.",
    ("node", "provider", "slot"),
)
_LATENCY_NAME = "iop_edge_shared_store_latency_seconds"
_LATENCY_HELP = "Round trips of this edge's calls to the shared store, failed ones included."
SHARED_FAMILIES = (
    SHARED_STORE_UP,
    SHARED_STORE_CALLS,
    SHARED_STORE_ERRORS,
    SHARED_MEMBERS,
    SHARED_REFUSED,
    SHARED_LEASES_LOST,
    PROVIDER_LEASES,
)
"""The gauges and counters :class:`SharedPoolCollector` yields, in order, before its latency
histogram."""


class SharedPoolCollector(Collector):
    """The shared pool as this edge sees it, one :class:`GateStatistics` snapshot per scrape."""

    def __init__(self, statistics: Callable[[], GateStatistics]) -> None:
        self._statistics = statistics

    def describe(self) -> Iterator[Metric]:
        """Every family :meth:`collect` yields, without samples (the gate is not read)."""
        yield from (family.empty() for family in SHARED_FAMILIES)
        yield HistogramMetricFamily(_LATENCY_NAME, _LATENCY_HELP, labels=[])

    def collect(self) -> Iterator[Metric]:
        """One snapshot of the gate and its store client."""
        stats = self._statistics()
        calls = stats.store_calls
        yield SHARED_STORE_UP.of(1 if stats.state == "up" else 0)
        made = SHARED_STORE_CALLS.empty()
        failed = SHARED_STORE_ERRORS.empty()
        for op, count in calls.calls.items():
            made.add_metric([op], count)
            failed.add_metric([op], calls.errors.get(op, 0))
        yield made
        yield failed
        yield SHARED_MEMBERS.of(stats.members)
        yield SHARED_REFUSED.of(stats.refused)
        yield SHARED_LEASES_LOST.of(stats.lost)
        leases = PROVIDER_LEASES.empty()
        if stats.state != "down":  # (the last counts seen would pass for the store's)
            for p in stats.providers:
                key = [p.node_id, p.provider_id]
                leases.add_metric([*key, "general"], p.held - p.long_held)
                leases.add_metric([*key, "long"], p.long_held)
        yield leases
        latency = HistogramMetricFamily(_LATENCY_NAME, _LATENCY_HELP, labels=[])
        buckets = [
            # (the `le` as prometheus-client's own histograms write it)
            (floatToGoString(bound), count)  # type: ignore[no-untyped-call]
            for bound, count in zip(calls.latency_buckets, calls.latency_counts, strict=True)
        ]
        buckets.append(("+Inf", calls.latency_count))
        latency.add_metric([], buckets, calls.latency_sum)
        yield latency

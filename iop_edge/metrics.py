"""Prometheus metrics (SPEC §9), on an injected registry.

Events (requests, tokens, upstream errors, reloads) are counted here as they happen. State —
queue depth, slots, enabled flags, admission rejections, the running config — is read at scrape
time from ``scheduler.statistics()`` and the supervisor by :class:`StateCollector`: one source of
truth, nothing counted twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from iop_edge.pool import PoolStatistics

if TYPE_CHECKING:
    from iop_edge.api.record import RequestRecord
    from iop_edge.handover import HandoverStatistics
    from iop_edge.listeners import ListenerStatistics
    from iop_edge.supervisor import RefreshRecord, Supervisor

UNKNOWN_MODEL: Final = "(unknown)"
_LATENCY_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
_WAIT_BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0)


class StateCollector(Collector):
    """Gauges and counters read at scrape time from the scheduler and the supervisor."""

    def __init__(
        self,
        statistics: Callable[[], PoolStatistics],
        supervisor: Callable[[], Supervisor | None],
    ) -> None:
        self._statistics = statistics
        self._supervisor = supervisor

    def collect(self) -> Iterator[Metric]:
        """One consistent snapshot per scrape."""
        stats = self._statistics()
        yield GaugeMetricFamily(
            "iop_edge_queue_depth",
            "Requests waiting in the admission queue.",
            value=stats.queue_depth,
        )
        rejected = CounterMetricFamily(
            "iop_edge_admission_rejected",
            "Requests the scheduler refused or dropped, by reason.",
            labels=["reason"],
        )
        for reason, count in sorted(stats.rejected.items()):
            rejected.add_metric([reason], count)
        yield rejected
        in_flight = GaugeMetricFamily(
            "iop_edge_provider_in_flight",
            "Requests running on a provider.",
            labels=["node", "provider", "kind"],
        )
        capacity = GaugeMetricFamily(
            "iop_edge_provider_capacity",
            "Slots of a provider (0 when disabled).",
            labels=["node", "provider", "kind"],
        )
        enabled = GaugeMetricFamily(
            "iop_edge_provider_enabled",
            "1 when the provider is a dispatch candidate.",
            labels=["node", "provider"],
        )
        up = GaugeMetricFamily(
            "iop_edge_provider_up",
            "1 unless the provider is ejected by its health (held out by a 429 counts as up).",
            labels=["node", "provider"],
        )
        ejections = CounterMetricFamily(
            "iop_edge_provider_ejections",
            "Times the provider was ejected (or its ejection renewed) for failing.",
            labels=["node", "provider"],
        )
        probes = CounterMetricFamily(
            "iop_edge_health_probes",
            "Health checks of ejected providers, by result.",
            labels=["node", "provider", "result"],
        )
        panic = GaugeMetricFamily(
            "iop_edge_model_panic",
            "1 while every enabled provider of the model group is out, ejected or held by a "
            "429 (panic: health is ignored for the group).",
            labels=["model"],
        )
        principal_in_flight = GaugeMetricFamily(
            "iop_edge_principal_in_flight",
            "Leases a principal holds, pool-wide (configured principals and anonymous only).",
            labels=["principal"],
        )
        principal_queued = GaugeMetricFamily(
            "iop_edge_principal_queued",
            "Requests of a principal waiting in the admission queue.",
            labels=["principal"],
        )
        for share in stats.principals:
            principal_in_flight.add_metric([share.principal], share.in_flight)
            principal_queued.add_metric([share.principal], share.queued)
        yield principal_in_flight
        yield principal_queued
        for p in stats.providers:
            general = p.in_flight - p.long_in_flight
            in_flight.add_metric([p.node_id, p.provider_id, "general"], general)
            in_flight.add_metric([p.node_id, p.provider_id, "long"], p.long_in_flight)
            capacity.add_metric([p.node_id, p.provider_id, "general"], p.capacity)
            capacity.add_metric([p.node_id, p.provider_id, "long"], p.long_context_capacity)
            enabled.add_metric([p.node_id, p.provider_id], 1 if p.enabled else 0)
            ejected = p.ejected_until is not None or p.half_open
            up.add_metric([p.node_id, p.provider_id], 0 if ejected else 1)
            ejections.add_metric([p.node_id, p.provider_id], p.ejections)
            probes.add_metric([p.node_id, p.provider_id, "ok"], p.probes_ok)
            probes.add_metric([p.node_id, p.provider_id, "failed"], p.probes_failed)
        for group in stats.groups:
            panic.add_metric([group.group_id], 1 if group.panic else 0)
        yield in_flight
        yield capacity
        yield enabled
        yield up
        yield ejections
        yield probes
        yield panic
        supervisor = self._supervisor()
        if supervisor is None:
            return
        info = GaugeMetricFamily(
            "iop_edge_config_info", "The running config (its content hash).", labels=["hash"]
        )
        info.add_metric([supervisor.running_hash], 1)
        yield info
        last = supervisor.last
        ok = last is None or last.result.result != "rejected"
        yield GaugeMetricFamily(
            "iop_edge_config_last_reload_successful",
            "1 when the last reload was not rejected.",
            value=1 if ok else 0,
        )
        yield GaugeMetricFamily(
            "iop_edge_config_last_reload_success_timestamp_seconds",
            "Unix time of the last reload that was not rejected (or of the start).",
            value=supervisor.last_success_at or 0,
        )
        yield GaugeMetricFamily(
            "iop_edge_config_restart_pending",
            "Config changes saved but waiting for a restart.",
            value=len(supervisor.restart_pending),
        )


class ListenerCollector(Collector):
    """The listeners' connections and what their guards refused or cut, read at scrape time
    from each :meth:`iop_edge.listeners.Listener.statistics`."""

    def __init__(self, listeners: Callable[[], Iterable[ListenerStatistics]]) -> None:
        self._listeners = listeners

    def collect(self) -> Iterator[Metric]:
        """One snapshot of every bound listener."""
        open_now = GaugeMetricFamily(
            "iop_edge_listener_connections",
            "Open client connections of a listener.",
            labels=["listener"],
        )
        limit = GaugeMetricFamily(
            "iop_edge_listener_max_connections",
            "The connection cap of a listener.",
            labels=["listener"],
        )
        events = CounterMetricFamily(
            "iop_edge_listener_connection_events",
            "Connections a listener refused at its cap, closed for a slow request head, or "
            "cut because the client took no data.",
            labels=["listener", "event"],
        )
        for stats in self._listeners():
            open_now.add_metric([stats.name], stats.open_connections)
            limit.add_metric([stats.name], stats.max_connections)
            events.add_metric([stats.name, "refused"], stats.refused)
            events.add_metric([stats.name, "header_timeout"], stats.header_timeouts)
            events.add_metric([stats.name, "write_stall"], stats.write_stalls)
        yield open_now
        yield limit
        yield events


class HandoverCollector(Collector):
    """The handover this process took over by (none: no series), read at scrape time."""

    def __init__(self, handover: Callable[[], HandoverStatistics | None]) -> None:
        self._handover = handover

    def collect(self) -> Iterator[Metric]:
        """The figures of the last handover, if this process was started by one."""
        taken = self._handover()
        if taken is None:
            return
        yield GaugeMetricFamily(
            "iop_edge_handover_timestamp_seconds",
            "Unix time this process took over from the old one (iop-edge restart).",
            value=taken.at,
        )
        yield GaugeMetricFamily(
            "iop_edge_handover_duration_seconds",
            "Seconds from the restart's start in the old process to this one accepting.",
            value=taken.duration,
        )
        yield GaugeMetricFamily(
            "iop_edge_handover_inherited_leases",
            "Provider slots the old process still held when it handed over, counted here.",
            value=taken.inherited_leases,
        )
        yield GaugeMetricFamily(
            "iop_edge_handover_inherited_leases_held",
            "Of those, the slots the old process holds still (0 once it exited).",
            value=taken.inherited_held,
        )
        yield CounterMetricFamily(
            "iop_edge_handover_relayed_requests",
            "Requests the old process relayed here (queued there, or sent on a connection "
            "kept alive with it).",
            value=taken.relayed_requests,
        )


class _RequestChildren(NamedTuple):
    """The labelled series one (model, token_ref, code) request touches."""

    requests: Any
    duration: Any
    queue_wait: Any
    first_token: Any
    prompt_tokens: Any
    completion_tokens: Any


class EdgeMetrics:
    """Every metric of SPEC §9, registered on ``registry``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        statistics: Callable[[], PoolStatistics],
        supervisor: Callable[[], Supervisor | None],
        listeners: Callable[[], Iterable[ListenerStatistics]] | None = None,
        handover: Callable[[], HandoverStatistics | None] | None = None,
    ) -> None:
        self.registry = registry
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no `_created` series
        self.requests = Counter(
            "iop_edge_requests",
            "Requests answered, by model, token and outcome code.",
            ["model", "token_ref", "code"],
            registry=registry,
        )
        self.duration = Histogram(
            "iop_edge_request_duration_seconds",
            "Whole request time, queue wait included.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.first_token = Histogram(
            "iop_edge_time_to_first_token_seconds",
            "Time to the first streamed frame (to the answer, when not streaming).",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "iop_edge_queue_wait_seconds",
            "Time from arrival to admission.",
            ["model"],
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        self.upstream_errors = Counter(
            "iop_edge_upstream_errors",
            "Failed upstream calls, by provider and kind.",
            ["node", "provider", "kind"],
            registry=registry,
        )
        self.tokens = Counter(
            "iop_edge_tokens",
            "Tokens reported by upstreams.",
            ["model", "token_ref", "direction"],
            registry=registry,
        )
        self.tokens_estimated = Counter(
            "iop_edge_tokens_estimated",
            "The part of iop_edge_tokens_total that the edge estimated (cli providers that "
            "report no usage).",
            ["model", "token_ref", "direction"],
            registry=registry,
        )
        self.failovers = Counter(
            "iop_edge_failovers",
            "Requests retried on another provider after an attempt failed before the client's "
            "first byte, by model and what failed.",
            ["model", "reason"],
            registry=registry,
        )
        self.reloads = Counter(
            "iop_edge_config_reloads",
            "Config refreshes, by trigger and result.",
            ["trigger", "result"],
            registry=registry,
        )
        registry.register(StateCollector(statistics, supervisor))
        if listeners is not None:
            registry.register(ListenerCollector(listeners))
        if handover is not None:
            registry.register(HandoverCollector(handover))
        self._children: dict[tuple[str, str, str], _RequestChildren] = {}

    def observe_request(self, record: RequestRecord) -> None:
        """Count one finished request (called once per request by the server)."""
        model = record.model if record.resolved and record.model else UNKNOWN_MODEL
        token_ref = record.principal.token_ref if record.principal else "(none)"
        key = (model, token_ref, record.code)
        children = self._children.get(key)
        if children is None:
            # Label look-ups cost more than the counting; the label sets are bounded (configured
            # models and tokens, a fixed set of codes), so each is resolved once.
            children = self._children[key] = _RequestChildren(
                self.requests.labels(model, token_ref, record.code),
                self.duration.labels(model),
                self.queue_wait.labels(model),
                self.first_token.labels(model),
                self.tokens.labels(model, token_ref, "prompt"),
                self.tokens.labels(model, token_ref, "completion"),
            )
        children.requests.inc()
        children.duration.observe(record.duration)
        if record.queue_wait is not None:
            children.queue_wait.observe(record.queue_wait)
        if record.time_to_first_token is not None:
            children.first_token.observe(record.time_to_first_token)
        if record.upstream_failure is not None and record.provider is not None:
            self.upstream_errors.labels(
                record.node or "", record.provider, record.upstream_failure
            ).inc()
        for node, provider, reason, code in record.failovers:
            self.failovers.labels(model, reason).inc()
            self.upstream_errors.labels(node, provider, code).inc()
        usage = record.usage
        if usage.prompt_tokens:
            children.prompt_tokens.inc(usage.prompt_tokens)
        if usage.completion_tokens:
            children.completion_tokens.inc(usage.completion_tokens)
        if usage.estimated:  # (cli only; a label look-up next to a process start is noise)
            for direction, count in (
                ("prompt", usage.prompt_tokens),
                ("completion", usage.completion_tokens),
            ):
                if count:
                    self.tokens_estimated.labels(model, token_ref, direction).inc(count)

    def observe_refresh(self, record: RefreshRecord) -> None:
        """Count one finished (apply-mode) refresh."""
        self.reloads.labels(record.trigger, record.result.result).inc()

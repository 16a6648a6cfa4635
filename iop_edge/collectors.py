"""The metrics read at scrape time (SPEC §9): the scheduler's state, the supervisor's running
config, the listeners' connections, the handover this process took over by, the stored
responses of ``/v1/responses`` and the remote nodes' links.

Each collector reads one snapshot (``statistics()``) per scrape and yields its families: one
source of truth, nothing counted twice. A series exists only for a thing that exists: a
configured provider, model group, principal or listener — never a placeholder.

Each collector also has ``describe()``: its families, without a sample, from the same table
:meth:`collect` fills (:class:`Family`). A registry asks ``describe()`` when a collector is
registered (for the names it must keep unique), so registering reads no snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from iop_edge.config.policy import ROUTE_UNBOUNDED, route_group, route_provider
from iop_edge.pool import PoolStatistics

if TYPE_CHECKING:
    from iop_edge.api.responses_store import ResponsesStoreStatistics
    from iop_edge.handover.channel import HandoverStatistics
    from iop_edge.link.statistics import NodeLinkStatistics
    from iop_edge.runtime.listeners import ListenerStatistics
    from iop_edge.supervisor import Supervisor, SupervisorStatistics

__all__ = [
    "Family",
    "HandoverCollector",
    "ListenerCollector",
    "NodeLinkCollector",
    "ResponsesStoreCollector",
    "StateCollector",
]


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family a collector yields: its type, name, help and label names."""

    kind: Literal["gauge", "counter"]
    name: str
    documentation: str
    labels: tuple[str, ...] = ()

    def empty(self) -> GaugeMetricFamily | CounterMetricFamily:
        """The family without samples (what ``describe()`` yields; ``collect()`` fills it)."""
        kind = GaugeMetricFamily if self.kind == "gauge" else CounterMetricFamily
        return kind(self.name, self.documentation, labels=list(self.labels))

    def of(self, value: float) -> GaugeMetricFamily | CounterMetricFamily:
        """The family of one unlabelled sample, ``value``."""
        family = self.empty()
        family.add_metric([], value)
        return family


def _gauge(name: str, documentation: str, *labels: str) -> Family:
    return Family("gauge", name, documentation, labels)


def _counter(name: str, documentation: str, *labels: str) -> Family:
    return Family("counter", name, documentation, labels)


QUEUE_DEPTH = _gauge("iop_edge_queue_depth", "Requests waiting in the admission queue.")
QUEUE_MAX = _gauge("iop_edge_queue_max", "The queue's limit (provider_pool.max_queue, live).")
ADMISSION_REJECTED = _counter(
    "iop_edge_admission_rejected", "Requests the scheduler refused or dropped, by reason.", "reason"
)
PRINCIPAL_IN_FLIGHT = _gauge(
    "iop_edge_principal_in_flight",
    "Leases a principal holds, pool-wide (configured principals and anonymous only).",
    "principal",
)
PRINCIPAL_QUEUED = _gauge(
    "iop_edge_principal_queued",
    "Requests of a principal waiting in the admission queue.",
    "principal",
)
PROVIDER_IN_FLIGHT = _gauge(
    "iop_edge_provider_in_flight",
    "Requests running on a provider, by slot (general|long); a long-context request "
    "holds a long slot and counts against the provider's capacity too.",
    "node",
    "provider",
    "slot",
)
PROVIDER_CAPACITY = _gauge(
    "iop_edge_provider_capacity",
    "Slots of a provider by slot (general: capacity, long: long_context_capacity); 0 "
    "when disabled.",
    "node",
    "provider",
    "slot",
)
PROVIDER_ENABLED = _gauge(
    "iop_edge_provider_enabled", "1 when the provider is a dispatch candidate.", "node", "provider"
)
PROVIDER_UP = _gauge(
    "iop_edge_provider_up",
    "1 unless the provider is ejected by its health (held out by a 429 counts as up) or its "
    "remote node's link is down (health disconnected).",
    "node",
    "provider",
)
PROVIDER_EJECTIONS = _counter(
    "iop_edge_provider_ejections",
    "Times the provider was ejected (or its ejection renewed) for failing.",
    "node",
    "provider",
)
HEALTH_PROBES = _counter(
    "iop_edge_health_probes",
    "Health checks of ejected and of idle providers, by result.",
    "node",
    "provider",
    "result",
)
MODEL_ENABLED_PROVIDERS = _gauge(
    "iop_edge_model_enabled_providers",
    "Enabled providers of a model group (0: its requests fail at once with "
    "no_available_provider). MODEL[completions] is the group serving /v1/completions "
    "(its openai_compat providers).",
    "model",
)
MODEL_PANIC = _gauge(
    "iop_edge_model_panic",
    "1 while every enabled provider of the model is out, ejected or held by a 429 "
    "(panic: health is ignored for it). One series per model: its /v1/completions and "
    "/v1/embeddings groups share its providers and are not reported apart.",
    "model",
)
CONFIG_INFO = _gauge("iop_edge_config_info", "The running config (its content hash).", "hash")
CONFIG_LAST_OK = _gauge(
    "iop_edge_config_last_reload_successful", "1 when the last reload was not rejected."
)
CONFIG_LAST_OK_AT = _gauge(
    "iop_edge_config_last_reload_success_timestamp_seconds",
    "Unix time of the last reload that was not rejected (or of the start).",
)
CONFIG_RESTART_PENDING = _gauge(
    "iop_edge_config_restart_pending", "Config changes saved but waiting for a restart."
)
STATE_FAMILIES = (
    QUEUE_DEPTH,
    QUEUE_MAX,
    ADMISSION_REJECTED,
    PRINCIPAL_IN_FLIGHT,
    PRINCIPAL_QUEUED,
    PROVIDER_IN_FLIGHT,
    PROVIDER_CAPACITY,
    PROVIDER_ENABLED,
    PROVIDER_UP,
    PROVIDER_EJECTIONS,
    HEALTH_PROBES,
    MODEL_ENABLED_PROVIDERS,
    MODEL_PANIC,
    CONFIG_INFO,
    CONFIG_LAST_OK,
    CONFIG_LAST_OK_AT,
    CONFIG_RESTART_PENDING,
)
"""What :class:`StateCollector` yields, in order."""


class StateCollector(Collector):
    """Gauges and counters read at scrape time from the scheduler and the supervisor.

    ``routes`` are the ``openai.model_routes[]`` models (restart-class: fixed for the process):
    the scheduler admits each as a group of one pseudo-provider ``route:MODEL``. Their slots are
    shown (``iop_edge_provider_in_flight``, and ``_capacity`` when the route has one), but no
    health series: a route has no health, no probe and no panic.
    """

    def __init__(
        self,
        statistics: Callable[[], PoolStatistics],
        supervisor: Callable[[], Supervisor],
        routes: Collection[str] = (),
    ) -> None:
        self._statistics = statistics
        self._supervisor = supervisor
        self._route_providers = frozenset(route_provider(m) for m in routes)
        self._route_groups = frozenset(route_group(m) for m in routes)

    def describe(self) -> Iterator[Metric]:
        """Every family :meth:`collect` yields, without samples (no snapshot is read)."""
        return (family.empty() for family in STATE_FAMILIES)

    def collect(self) -> Iterator[Metric]:
        """One consistent snapshot per scrape."""
        stats = self._statistics()
        yield QUEUE_DEPTH.of(stats.queue_depth)
        yield QUEUE_MAX.of(stats.max_queue)
        rejected = ADMISSION_REJECTED.empty()
        for reason, count in sorted(stats.rejected.items()):
            rejected.add_metric([reason], count)
        yield rejected
        yield from self._principals(stats)
        yield from self._providers(stats)
        yield from self._groups(stats)
        yield from _config(self._supervisor().statistics())

    @staticmethod
    def _principals(stats: PoolStatistics) -> Iterator[Metric]:
        principal_in_flight = PRINCIPAL_IN_FLIGHT.empty()
        principal_queued = PRINCIPAL_QUEUED.empty()
        for share in stats.principals:
            principal_in_flight.add_metric([share.principal], share.in_flight)
            principal_queued.add_metric([share.principal], share.queued)
        yield principal_in_flight
        yield principal_queued

    def _providers(self, stats: PoolStatistics) -> Iterator[Metric]:
        in_flight = PROVIDER_IN_FLIGHT.empty()
        capacity = PROVIDER_CAPACITY.empty()
        enabled = PROVIDER_ENABLED.empty()
        up = PROVIDER_UP.empty()
        ejections = PROVIDER_EJECTIONS.empty()
        probes = HEALTH_PROBES.empty()
        routes = self._route_providers
        for p in stats.providers:
            key = [p.node_id, p.provider_id]
            general = p.in_flight - p.long_in_flight
            in_flight.add_metric([*key, "general"], general)
            if p.provider_id in routes:
                # A route has no long slots and no health; without a capacity it has no limit.
                if p.capacity != ROUTE_UNBOUNDED:
                    capacity.add_metric([*key, "general"], p.capacity)
                enabled.add_metric(key, 1 if p.enabled else 0)
                continue
            in_flight.add_metric([*key, "long"], p.long_in_flight)
            capacity.add_metric([*key, "general"], p.capacity)
            capacity.add_metric([*key, "long"], p.long_context_capacity)
            enabled.add_metric(key, 1 if p.enabled else 0)
            ejected = p.ejected_until is not None or p.half_open
            up.add_metric(key, 0 if ejected or not p.connected else 1)
            ejections.add_metric(key, p.ejections)
            probes.add_metric([*key, "ok"], p.probes_ok)
            probes.add_metric([*key, "failed"], p.probes_failed)
        yield in_flight
        yield capacity
        yield enabled
        yield up
        yield ejections
        yield probes

    def _groups(self, stats: PoolStatistics) -> Iterator[Metric]:
        members = MODEL_ENABLED_PROVIDERS.empty()
        panic = MODEL_PANIC.empty()
        for group in stats.groups:
            if group.group_id in self._route_groups:
                continue
            members.add_metric([group.group_id], group.members)
            if group.derived_from is None:
                panic.add_metric([group.group_id], 1 if group.panic else 0)
        yield members
        yield panic


def _config(stats: SupervisorStatistics) -> Iterator[Metric]:
    info = CONFIG_INFO.empty()
    info.add_metric([stats.running_hash], 1)
    yield info
    last = stats.last
    ok = last is None or last.result.result != "rejected"
    yield CONFIG_LAST_OK.of(1 if ok else 0)
    yield CONFIG_LAST_OK_AT.of(stats.last_success_at or 0)
    yield CONFIG_RESTART_PENDING.of(len(stats.restart_pending))


LISTENER_CONNECTIONS = _gauge(
    "iop_edge_listener_connections", "Open client connections of a listener.", "listener"
)
LISTENER_MAX_CONNECTIONS = _gauge(
    "iop_edge_listener_max_connections", "The connection cap of a listener.", "listener"
)
LISTENER_CONNECTION_EVENTS = _counter(
    "iop_edge_listener_connection_events",
    "Connections a listener refused at its cap, closed for a slow request head or "
    "body, cut because the client took no data, or evicted at its cap.",
    "listener",
    "event",
)
LISTENER_FAMILIES = (LISTENER_CONNECTIONS, LISTENER_MAX_CONNECTIONS, LISTENER_CONNECTION_EVENTS)
"""What :class:`ListenerCollector` yields, in order."""


class ListenerCollector(Collector):
    """The listeners' connections and what their guards refused or cut, read at scrape time
    from each :meth:`iop_edge.runtime.listeners.Listener.statistics`."""

    def __init__(self, listeners: Callable[[], Iterable[ListenerStatistics]]) -> None:
        self._listeners = listeners

    def describe(self) -> Iterator[Metric]:
        """Every family :meth:`collect` yields, without samples (no listener is read)."""
        return (family.empty() for family in LISTENER_FAMILIES)

    def collect(self) -> Iterator[Metric]:
        """One snapshot of every bound listener."""
        open_now = LISTENER_CONNECTIONS.empty()
        limit = LISTENER_MAX_CONNECTIONS.empty()
        events = LISTENER_CONNECTION_EVENTS.empty()
        for stats in self._listeners():
            open_now.add_metric([stats.name], stats.open_connections)
            limit.add_metric([stats.name], stats.max_connections)
            events.add_metric([stats.name, "refused"], stats.refused)
            events.add_metric([stats.name, "header_timeout"], stats.header_timeouts)
            events.add_metric([stats.name, "write_stall"], stats.write_stalls)
            events.add_metric([stats.name, "evicted"], stats.evicted)
        yield open_now
        yield limit
        yield events


HANDOVER_AT = _gauge(
    "iop_edge_handover_timestamp_seconds",
    "Unix time this process took over from the old one (iop-edge restart).",
)
HANDOVER_DURATION = _gauge(
    "iop_edge_handover_duration_seconds",
    "Seconds from the restart's start in the old process to this one accepting.",
)
HANDOVER_INHERITED = _gauge(
    "iop_edge_handover_inherited_leases",
    "Provider slots the old process still held when it handed over, counted here.",
)
HANDOVER_INHERITED_HELD = _gauge(
    "iop_edge_handover_inherited_leases_held",
    "Of those, the slots the old process holds still (0 once it exited).",
)
HANDOVER_RELAYED = _counter(
    "iop_edge_handover_relayed_requests",
    "Requests the old process relayed here (queued there, or sent on a connection "
    "kept alive with it).",
)
HANDOVER_FAMILIES = (
    HANDOVER_AT,
    HANDOVER_DURATION,
    HANDOVER_INHERITED,
    HANDOVER_INHERITED_HELD,
    HANDOVER_RELAYED,
)
"""What :class:`HandoverCollector` yields, in order (nothing without a handover)."""


class HandoverCollector(Collector):
    """The handover this process took over by (none: no series), read at scrape time."""

    def __init__(self, handover: Callable[[], HandoverStatistics | None]) -> None:
        self._handover = handover

    def describe(self) -> Iterator[Metric]:
        """Every family :meth:`collect` yields after a handover, without samples."""
        return (family.empty() for family in HANDOVER_FAMILIES)

    def collect(self) -> Iterator[Metric]:
        """The figures of the last handover, if this process was started by one."""
        taken = self._handover()
        if taken is None:
            return
        yield HANDOVER_AT.of(taken.at)
        yield HANDOVER_DURATION.of(taken.duration)
        yield HANDOVER_INHERITED.of(taken.inherited_leases)
        yield HANDOVER_INHERITED_HELD.of(taken.inherited_held)
        yield HANDOVER_RELAYED.of(taken.relayed_requests)


RESPONSES_STORED = _gauge(
    "iop_edge_responses_stored",
    "Responses held for /v1/responses (previous_response_id, GET and DELETE), expired ones "
    "not yet swept included.",
)
RESPONSES_STORE_BYTES = _gauge(
    "iop_edge_responses_store_bytes",
    "Their size as the store counts it (each response's JSON and its conversation's); "
    "bounded by openai.responses_store.max_bytes.",
)
RESPONSES_EVICTED = _counter(
    "iop_edge_responses_evicted",
    "Responses dropped or refused by the store, by reason: lru (least recently used, to keep "
    "the bounds), expired (at the end of ttl_ms), too_large (larger than max_bytes alone: "
    "never stored).",
    "reason",
)
RESPONSES_FAMILIES = (RESPONSES_STORED, RESPONSES_STORE_BYTES, RESPONSES_EVICTED)
"""What :class:`ResponsesStoreCollector` yields, in order."""


class ResponsesStoreCollector(Collector):
    """The stored responses of ``/v1/responses``, read at scrape time from
    :meth:`iop_edge.api.responses_store.ResponsesStore.statistics`."""

    def __init__(self, statistics: Callable[[], ResponsesStoreStatistics]) -> None:
        self._statistics = statistics

    def describe(self) -> Iterator[Metric]:
        """Every family :meth:`collect` yields, without samples (the store is not read)."""
        return (family.empty() for family in RESPONSES_FAMILIES)

    def collect(self) -> Iterator[Metric]:
        """One snapshot of the store."""
        stats = self._statistics()
        yield RESPONSES_STORED.of(stats.items)
        yield RESPONSES_STORE_BYTES.of(stats.bytes)
        evicted = RESPONSES_EVICTED.empty()
        evicted.add_metric(["lru"], stats.evicted)
        evicted.add_metric(["expired"], stats.expired)
        evicted.add_metric(["too_large"], stats.too_large)
        yield evicted


NODE_CONNECTED = _gauge(
    "iop_edge_node_connected",
    "1 while a remote node's link is up and its payload acknowledged (remote nodes only).",
    "node",
)
NODE_RECONNECTS = _counter(
    "iop_edge_node_reconnects",
    "Links of a remote node acknowledged after its first one, in this process.",
    "node",
)
NODE_LINK_RTT = _gauge(
    "iop_edge_node_link_rtt_seconds",
    "The round trip of the link's PING (an exponentially weighted average); no series "
    "while no link is attached or before its first PONG.",
    "node",
)
NODE_LINK_BYTES = _counter(
    "iop_edge_node_link_bytes",
    "Frame bytes over every link of a remote node in this process, by direction as the edge "
    "sees it: sent (requests, credit, pings) and received (answers, streams).",
    "node",
    "direction",
)
NODE_LINK_IN_FLIGHT = _gauge(
    "iop_edge_node_link_in_flight",
    "Request streams open on a remote node's links (probes included).",
    "node",
)
NODE_LINK_VIOLATIONS = _counter(
    "iop_edge_node_link_violations",
    "Links of a remote node closed for breaking the link protocol (4400).",
    "node",
)
NODE_LINK_REFUSED = _counter(
    "iop_edge_node_link_refused",
    "Dials the node listener refused before a node was known, by reason: "
    "invalid_node_token (401), reconnecting_too_fast (429), stopping (503).",
    "reason",
)
NODE_INFO = _gauge(
    "iop_edge_node_info",
    "The agent on a remote node's link: its iop-node version and the payload generation it "
    "acknowledged (no series while the node is disconnected).",
    "node",
    "agent_version",
    "generation",
)
MAX_NODE_LABEL = 64
"""The longest label value a node's ``HELLO`` or ``ACK`` gives :data:`NODE_INFO`."""
NODE_FAMILIES = (
    NODE_CONNECTED,
    NODE_RECONNECTS,
    NODE_LINK_RTT,
    NODE_LINK_BYTES,
    NODE_LINK_IN_FLIGHT,
    NODE_LINK_VIOLATIONS,
    NODE_LINK_REFUSED,
    NODE_INFO,
)
"""What :class:`NodeLinkCollector` yields, in order."""


class NodeLinkCollector(Collector):
    """The remote nodes' links, read at scrape time from
    :meth:`iop_edge.link.edge_server.NodeLinkServer.statistics` (a local node has no link and
    no series), and the dials the node listener refused (``refused``: count by reason)."""

    def __init__(
        self,
        statistics: Callable[[], Iterable[NodeLinkStatistics]],
        refused: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self._statistics = statistics
        self._refused = refused

    def describe(self) -> Iterator[Metric]:
        """Every family :meth:`collect` yields, without samples (no link is read)."""
        return (family.empty() for family in NODE_FAMILIES)

    def collect(self) -> Iterator[Metric]:
        """One snapshot of every remote node's link."""
        connected = NODE_CONNECTED.empty()
        reconnects = NODE_RECONNECTS.empty()
        rtt = NODE_LINK_RTT.empty()
        link_bytes = NODE_LINK_BYTES.empty()
        in_flight = NODE_LINK_IN_FLIGHT.empty()
        violations = NODE_LINK_VIOLATIONS.empty()
        info = NODE_INFO.empty()
        for node in self._statistics():
            if not node.remote:
                continue
            key = [node.node_id]
            connected.add_metric(key, 1 if node.connected else 0)
            reconnects.add_metric(key, node.reconnects)
            if node.rtt is not None:
                rtt.add_metric(key, node.rtt)
            link_bytes.add_metric([*key, "sent"], node.bytes_sent)
            link_bytes.add_metric([*key, "received"], node.bytes_received)
            in_flight.add_metric(key, node.in_flight)
            violations.add_metric(key, node.violations)
            if node.connected:
                # Labels from the node's HELLO and ACK (a version and a hash, never a token),
                # cut: the node, not the edge, chose them.
                agent = (node.agent_version or "")[:MAX_NODE_LABEL]
                generation = (node.generation_acked or "")[:MAX_NODE_LABEL]
                info.add_metric([*key, agent, generation], 1)
        refused = NODE_LINK_REFUSED.empty()
        for reason, count in sorted(self._refused().items()):
            refused.add_metric([reason], count)
        yield connected
        yield reconnects
        yield rtt
        yield link_bytes
        yield in_flight
        yield violations
        yield refused
        yield info

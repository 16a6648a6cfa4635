"""Prometheus metrics (SPEC §9), on an injected registry.

Events (requests, upstream attempts, tokens, upstream errors, reloads) are counted here as
they happen, from each request's :class:`~iop_edge.api.record.RequestRecord`. State — queue
depth, slots, enabled flags, admission rejections, the running config — is read at scrape time
by the collectors of :mod:`iop_edge.collectors`: one source of truth, nothing counted twice.
The process's own figures (CPU, memory, descriptors: ``process_*``; the interpreter:
``python_info``) come from prometheus-client's collectors on the same registry.

A labelled series appears with its first value: nothing is created ahead of traffic (a
request for an unknown model leaves no token or queue-wait series behind). Each label set's
series is resolved once and kept, because label look-ups cost more than the counting.

Histogram buckets of durations reach the largest ``request_timeout_ms`` of the config the
process started with (:func:`latency_buckets`); ``request_timeout_ms`` is restart-class, so
the buckets never need to change while the process runs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from iop_edge import __version__
from iop_edge.adapters.base import DEFAULT_REQUEST_TIMEOUT_MS
from iop_edge.adapters.registry import request_timeout_ms
from iop_edge.collectors import (
    HandoverCollector,
    ListenerCollector,
    NodeLinkCollector,
    StateCollector,
)
from iop_edge.config.payload import node_payload
from iop_edge.config.policy import route_provider
from iop_edge.pool import PoolStatistics
from iop_edge.shared_collector import SharedPoolCollector

if TYPE_CHECKING:
    from iop_edge.api.record import RequestRecord
    from iop_edge.config.schema import EdgeConfig
    from iop_edge.handover.channel import HandoverStatistics
    from iop_edge.link.statistics import NodeLinkStatistics
    from iop_edge.runtime.listeners import ListenerStatistics
    from iop_edge.shared.gate import GateStatistics
    from iop_edge.supervisor import RefreshRecord, Supervisor

__all__ = ["UNKNOWN_MODEL", "EdgeMetrics", "latency_buckets", "max_request_timeout_ms"]

UNKNOWN_MODEL: Final = "(unknown)"
#: The latency buckets below any timeout; :func:`latency_buckets` extends them to the timeout.
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


def max_request_timeout_ms(config: EdgeConfig) -> int:
    """The longest ``request_timeout_ms`` an upstream call of ``config`` may run for: over
    every adapter instance and every provider (its own value over its adapter's), with the
    default (:data:`DEFAULT_REQUEST_TIMEOUT_MS`) where neither sets one."""
    longest = 0
    for node in config.nodes:
        payload = node_payload(config, node.id)
        for execution in (
            *(a.execution for a in payload.adapters),
            *(p.execution for p in payload.providers),
        ):
            longest = max(longest, request_timeout_ms(execution))
    return longest or DEFAULT_REQUEST_TIMEOUT_MS


def latency_buckets(timeout_s: float) -> tuple[float, ...]:
    """Duration buckets whose largest finite bound is ``timeout_s``: the fixed buckets below
    it, then doubling steps up to it (a request that ran to its timeout lands in the last
    bucket, not in ``+Inf``)."""
    buckets = [b for b in _LATENCY_BUCKETS if b < timeout_s]
    step = (buckets[-1] if buckets else timeout_s) * 2
    while step < timeout_s:
        buckets.append(step)
        step *= 2
    buckets.append(timeout_s)
    return tuple(buckets)


def _attempt_code(failure: str) -> str:
    """The ``code`` of an upstream attempt that failed as ``failure`` (an upstream-errors
    code): an HTTP 4xx other than 429 is the request's fault (``client_error``), any other
    status the provider's (``upstream_error``)."""
    if not failure.startswith("http_"):
        return failure
    if failure.startswith("http_4") and failure != "http_429":
        return "client_error"
    return "upstream_error"


def _error_labels(failure: str) -> tuple[str, str]:
    """``(reason, status_code)`` of ``iop_edge_upstream_errors_total`` for ``failure``."""
    if failure.startswith("http_"):
        return "status", failure[5:]
    return ("timeout" if failure == "upstream_timeout" else "error"), ""


class _RequestSeries:
    """The labelled series one (model, token_ref, code) touches, each resolved on first use."""

    __slots__ = (
        "completion_tokens",
        "duration",
        "first_token",
        "prompt_tokens",
        "queue_wait",
        "requests",
    )

    def __init__(self, requests: Any, duration: Any) -> None:
        self.requests = requests
        self.duration = duration
        self.queue_wait: Any = None
        self.first_token: Any = None
        self.prompt_tokens: Any = None
        self.completion_tokens: Any = None


class EdgeMetrics:
    """Every metric of SPEC §9, registered on ``registry``.

    ``config`` is the config the process starts with: the duration buckets reach its largest
    ``request_timeout_ms``, and its ``openai.model_routes`` (restart-class) are told apart from
    providers. ``nodes`` (with ``node_refusals``) reads the remote nodes' links, when the
    process has a node listener; ``shared`` the shared store's gate, when the pool is shared
    by several edges.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        statistics: Callable[[], PoolStatistics],
        supervisor: Callable[[], Supervisor],
        listeners: Callable[[], Iterable[ListenerStatistics]] | None = None,
        handover: Callable[[], HandoverStatistics | None] | None = None,
        *,
        config: EdgeConfig | None = None,
        nodes: Callable[[], Iterable[NodeLinkStatistics]] | None = None,
        node_refusals: Callable[[], Mapping[str, int]] = dict,
        shared: Callable[[], GateStatistics] | None = None,
    ) -> None:
        self.registry = registry
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no `_created` series
        timeout_ms = max_request_timeout_ms(config) if config else DEFAULT_REQUEST_TIMEOUT_MS
        durations = latency_buckets(timeout_ms / 1000)
        routes: Collection[str] = (
            frozenset(r.model for r in config.openai.model_routes) if config else frozenset()
        )
        self._routes = routes
        self.requests = Counter(
            "iop_edge_requests",
            "Requests answered, by model, token and outcome code.",
            ["model", "token_ref", "code"],
            registry=registry,
        )
        self.duration = Histogram(
            "iop_edge_request_duration_seconds",
            "Whole request time, queue wait and every attempt included.",
            ["model"],
            buckets=durations,
            registry=registry,
        )
        self.first_token = Histogram(
            "iop_edge_time_to_first_token_seconds",
            "Streaming requests only: time from arrival (queue wait included) to the first "
            "streamed frame.",
            ["model"],
            buckets=durations,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "iop_edge_queue_wait_seconds",
            "Time from arrival to admission.",
            ["model"],
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        self.provider_requests = Counter(
            "iop_edge_provider_requests",
            "Upstream attempts on a provider (failed-over ones included), by outcome code: "
            "ok, upstream_error, upstream_timeout, client_error (an HTTP 4xx other than 429), "
            "or how the client or the edge ended it (client_gone, client_stalled, "
            "drain_timeout).",
            ["node", "provider", "code"],
            registry=registry,
        )
        self.provider_duration = Histogram(
            "iop_edge_provider_request_duration_seconds",
            "One upstream attempt on a provider, from its start to its end (a stream's last "
            "frame, or its failure); failed-over attempts included.",
            ["node", "provider"],
            buckets=durations,
            registry=registry,
        )
        self.upstream_errors = Counter(
            "iop_edge_upstream_errors",
            "Failed upstream attempts by reason: error (connect, connection lost, broken "
            "protocol, a cli exit), timeout (request_timeout_ms, first_token_timeout_ms, "
            "stream_idle_timeout_ms), status (an HTTP error answer: status_code says which).",
            ["node", "provider", "reason", "status_code"],
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
        Info("iop_edge_build", "The iop-edge version running.", registry=registry).info(
            {"version": __version__}
        )
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        registry.register(StateCollector(statistics, supervisor, routes))
        if listeners is not None:
            registry.register(ListenerCollector(listeners))
        if handover is not None:
            registry.register(HandoverCollector(handover))
        if nodes is not None:
            registry.register(NodeLinkCollector(nodes, node_refusals))
        if shared is not None:
            registry.register(SharedPoolCollector(shared))
        self._series: dict[tuple[str, str, str], _RequestSeries] = {}
        self._attempts: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self._errors: dict[tuple[str, str, str], Any] = {}

    def observe_request(self, record: RequestRecord) -> None:
        """Count one finished request (called once per request by the server)."""
        model = record.model if record.resolved and record.model else UNKNOWN_MODEL
        token_ref = record.principal.token_ref if record.principal else "(none)"
        key = (model, token_ref, record.code)
        series = self._series.get(key)
        if series is None:
            # The label sets are bounded (configured models and tokens, a fixed set of codes).
            series = self._series[key] = _RequestSeries(
                self.requests.labels(model, token_ref, record.code),
                self.duration.labels(model),
            )
        series.requests.inc()
        series.duration.observe(record.duration)
        if record.queue_wait is not None:
            if series.queue_wait is None:
                series.queue_wait = self.queue_wait.labels(model)
            series.queue_wait.observe(record.queue_wait)
        if record.stream and record.time_to_first_token is not None:
            if series.first_token is None:
                series.first_token = self.first_token.labels(model)
            series.first_token.observe(record.time_to_first_token)
        if record.attempts:
            self._observe_attempts(record, model)
        usage = record.usage
        if usage.prompt_tokens:
            if series.prompt_tokens is None:
                series.prompt_tokens = self.tokens.labels(model, token_ref, "prompt")
            series.prompt_tokens.inc(usage.prompt_tokens)
        if usage.completion_tokens:
            if series.completion_tokens is None:
                series.completion_tokens = self.tokens.labels(model, token_ref, "completion")
            series.completion_tokens.inc(usage.completion_tokens)
        if usage.estimated:  # (cli only; a label look-up next to a process start is noise)
            for direction, count in (
                ("prompt", usage.prompt_tokens),
                ("completion", usage.completion_tokens),
            ):
                if count:
                    self.tokens_estimated.labels(model, token_ref, direction).inc(count)

    def _observe_attempts(self, record: RequestRecord, model: str) -> None:
        """One provider observation per upstream attempt: each failed-over one, then the last
        one unless the request never got another provider after failing over."""
        for failed in record.failovers:
            self.failovers.labels(model, failed.kind).inc()
            self._attempt(failed.node, failed.provider, _attempt_code(failed.code), failed.duration)
            self._upstream_error(failed.node, failed.provider, failed.code)
        if record.attempts <= len(record.failovers):
            return
        node = record.node or ""
        # A model route's attempts are its pseudo-provider's (as in the slot gauges), never
        # the adapter's name: provider ids and adapter names are different namespaces.
        provider = route_provider(model) if model in self._routes else record.provider or ""
        failure = record.upstream_failure
        code = record.code if failure is None else _attempt_code(failure)
        ended = record.started + record.duration
        self._attempt(node, provider, code, ended - record.attempt_started)
        if failure is not None:
            self._upstream_error(node, provider, failure)

    def _attempt(self, node: str, provider: str, code: str, duration: float) -> None:
        key = (node, provider, code)
        children = self._attempts.get(key)
        if children is None:
            children = self._attempts[key] = (
                self.provider_requests.labels(node, provider, code),
                self.provider_duration.labels(node, provider),
            )
        children[0].inc()
        children[1].observe(duration)

    def _upstream_error(self, node: str, provider: str, failure: str) -> None:
        key = (node, provider, failure)
        child = self._errors.get(key)
        if child is None:
            child = self._errors[key] = self.upstream_errors.labels(
                node, provider, *_error_labels(failure)
            )
        child.inc()

    def observe_refresh(self, record: RefreshRecord) -> None:
        """Count one finished (apply-mode) refresh."""
        self.reloads.labels(record.trigger, record.result.result).inc()

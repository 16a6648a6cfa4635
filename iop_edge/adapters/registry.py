"""The executors of the edge: :class:`AdapterSet` (one node's, built from its payload) and
:class:`NodeAdapters` (every node's :class:`~iop_edge.adapters.base.ExecutorSet`, what the
request path asks): an :class:`AdapterSet` for a local node, what the ``remote`` factory builds
for a remote one (:class:`iop_edge.link.remote.RemoteNode`, whose adapters run on the node and
never here). :func:`executable` is the one rule of which providers and adapters get an
executor, so that a local and a remote node refuse the same ids.

Each enabled adapter instance gets one backend (:class:`HttpBackend` for ``openai_compat`` and
``ollama``, :class:`CliTracker` for ``cli``) and one executor with its own execution settings
(for model routes). Each provider whose adapter instance is enabled gets an executor on that
instance's backend, with the provider's merged execution settings — the payload already put the
provider-first fields over the adapter's. Disabled providers get one too: ``enabled`` is a live
setting, and a provider enabled by a refresh must find its executor ready.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from iop_edge.adapters.base import DEFAULT_REQUEST_TIMEOUT_MS, Backend, Executor, ExecutorSet
from iop_edge.adapters.cli import CliExecutor
from iop_edge.adapters.cli_process import CliTracker, minimal_env
from iop_edge.adapters.deadlines import Deadlines
from iop_edge.adapters.ollama import OllamaExecutor
from iop_edge.adapters.openai_compat import OpenAICompatExecutor
from iop_edge.adapters.upstream_http import HttpBackend, HttpTarget, probe, static_headers
from iop_edge.config.payload import (
    AdapterPayload,
    NodeConfigPayload,
    ProviderPayload,
    node_payload,
)
from iop_edge.seams import Clock, ProbeResult

if TYPE_CHECKING:
    from iop_edge.config.schema import AdapterType, EdgeConfig, ExecutionFields

__all__ = [
    "AdapterSet",
    "AdapterStatistics",
    "NodeAdapters",
    "RemoteFactory",
    "build_executor",
    "executable",
    "request_timeout_ms",
]


def request_timeout_ms(execution: ExecutionFields) -> int:
    """The deadline an executor built from ``execution`` gets: its merged
    ``request_timeout_ms``, or :data:`DEFAULT_REQUEST_TIMEOUT_MS` when neither the provider nor
    its adapter sets it."""
    return execution.request_timeout_ms or DEFAULT_REQUEST_TIMEOUT_MS


def build_executor(
    kind: AdapterType,
    backend: Backend,
    execution: ExecutionFields,
    label: str,
    clock: Clock | None = None,
) -> Executor:
    """The executor of one provider (or adapter instance) of runtime type ``kind``, its
    deadlines on ``clock`` (the loop's when None)."""
    timeout_ms = request_timeout_ms(execution)
    if kind == "cli":
        assert isinstance(backend, CliTracker)
        argv = (execution.command, *(execution.args or ())) if execution.command else None
        label = f"{label}, command {execution.command!r}" if execution.command else label
        return CliExecutor(
            backend,
            f"cli {label}",
            argv,
            minimal_env(execution.env),
            execution.output_format or "text",
            timeout_ms,
            clock,
        )
    assert isinstance(backend, HttpBackend)
    target = http_target(kind, execution, label, clock)
    if kind == "ollama":
        return OllamaExecutor(backend, target, execution.context_size)
    return OpenAICompatExecutor(
        backend, target, execution.endpoint, frozenset(execution.native_apis or ())
    )


def http_target(
    kind: AdapterType, execution: ExecutionFields, label: str, clock: Clock | None = None
) -> HttpTarget:
    """Where an HTTP executor (or a health check) of runtime type ``kind`` sends requests."""
    return HttpTarget(
        label=f"{kind} {label}",
        base_url=execution.base_url,
        headers=static_headers(execution.headers),
        timeout_ms=request_timeout_ms(execution),
        clock=clock,
    )


Probe = Callable[[], Awaitable[ProbeResult]]
"""One provider's health check, ready to run."""


@dataclass(frozen=True, slots=True)
class AdapterStatistics:
    """A snapshot of one enabled adapter instance's backend (read at call time, kept nowhere)."""

    node_id: str
    adapter: str
    backend: Literal["http", "cli", "remote"]
    """``http`` (a connection pool: ``openai_compat``, ``ollama``), ``cli`` (process tracker)
    or ``remote`` (an adapter of a remote node, as its agent last reported it)."""
    live_process_groups: int
    """CLI process groups started and not yet reaped (always 0 for ``http``)."""
    kills_pending: int
    """CLI groups sent SIGTERM whose reaper still runs (always 0 for ``http``)."""


class AdapterSet:
    """All executors of one node, built from its :class:`NodeConfigPayload` alone.

    One backend per enabled adapter instance (an HTTP connection pool for ``openai_compat`` and
    ``ollama``, a process tracker for ``cli``), shared by every provider that uses the
    instance. A provider's executor uses the provider's merged execution settings (its own
    provider-first fields over its adapter's); an adapter's executor (for
    ``openai.model_routes``) uses the adapter instance's settings alone. Disabled adapters get
    no executor; disabled providers do (``enabled`` changes live), when their adapter is enabled.
    """

    def __init__(
        self,
        node_id: str,
        backends: Mapping[str, Backend],
        by_provider: Mapping[str, Executor],
        by_adapter: Mapping[str, Executor],
        probes: Mapping[str, Probe] | None = None,
    ) -> None:
        self.node_id = node_id
        self._backends = dict(backends)
        self._by_provider = dict(by_provider)
        self._by_adapter = dict(by_adapter)
        self._probes = dict(probes or {})

    @classmethod
    def from_payload(cls, payload: NodeConfigPayload, clock: Clock | None = None) -> AdapterSet:
        """Build the executors of ``payload``'s node, their deadlines and health checks bounded
        on ``clock`` (the loop's when None); no I/O happens until the first call."""
        return _build(payload, clock)

    def for_provider(self, provider_id: str) -> Executor:
        """The executor of an enabled provider of this node; :class:`KeyError` otherwise."""
        try:
            return self._by_provider[provider_id]
        except KeyError:
            known = ", ".join(sorted(self._by_provider)) or "none"
            raise KeyError(
                f"node {self.node_id!r} has no provider {provider_id!r} with an enabled "
                f"adapter; providers with one: {known}"
            ) from None

    def for_adapter(self, adapter_name: str) -> Executor:
        """The executor of an enabled adapter instance of this node (for model routes)."""
        try:
            return self._by_adapter[adapter_name]
        except KeyError:
            known = ", ".join(sorted(self._by_adapter)) or "none"
            raise KeyError(
                f"node {self.node_id!r} has no enabled adapter {adapter_name!r}; "
                f"enabled adapters: {known}"
            ) from None

    async def probe(self, provider_id: str) -> ProbeResult:
        """Run the health check of a provider of this node (its ``health_check``)."""
        check = self._probes.get(provider_id)
        if check is None:
            return False, f"provider {provider_id!r} of node {self.node_id!r} has no health check"
        return await check()

    def statistics(self) -> tuple[AdapterStatistics, ...]:
        """One snapshot per enabled adapter instance of this node, in configuration order."""
        found: list[AdapterStatistics] = []
        for name, backend in self._backends.items():
            if isinstance(backend, CliTracker):
                found.append(
                    AdapterStatistics(
                        self.node_id,
                        name,
                        "cli",
                        backend.live_process_groups,
                        backend.kills_pending,
                    )
                )
            else:
                found.append(AdapterStatistics(self.node_id, name, "http", 0, 0))
        return tuple(found)

    async def aclose(self) -> None:
        """Close pooled connections and kill CLI process groups still running; idempotent.

        Calls still in flight fail with ``upstream_error``.
        """
        for backend in self._backends.values():
            await backend.aclose()


def executable(
    payload: NodeConfigPayload,
) -> tuple[dict[str, ProviderPayload], dict[str, AdapterPayload]]:
    """The providers and adapter instances of ``payload`` that get an executor, by id and
    name in configuration order: every enabled adapter, and every provider (enabled or not:
    ``enabled`` is live) whose adapter is one of them and of the provider's type."""
    adapters = {a.name: a for a in payload.adapters if a.enabled}
    # Validation guarantees an enabled provider an enabled adapter of its own type (and a
    # refresh that enables one re-validates that); a provider without one gets no executor
    # rather than a wrong one.
    providers = {
        p.id: p
        for p in payload.providers
        if p.adapter is not None and p.adapter in adapters and adapters[p.adapter].type == p.type
    }
    return providers, adapters


def _build(payload: NodeConfigPayload, clock: Clock | None) -> AdapterSet:
    """All executors of ``payload``'s node (see :class:`AdapterSet`)."""
    providers, adapters = executable(payload)
    backends: dict[str, Backend] = {}
    by_adapter: dict[str, Executor] = {}
    for adapter in adapters.values():
        backend: Backend = (
            CliTracker(adapter.name) if adapter.type == "cli" else HttpBackend(adapter.name)
        )
        backends[adapter.name] = backend
        by_adapter[adapter.name] = build_executor(
            adapter.type, backend, adapter.execution, f"adapter {adapter.name!r}", clock
        )
    by_provider: dict[str, Executor] = {}
    probes: dict[str, Probe] = {}
    for provider in providers.values():
        name = provider.adapter
        assert name is not None  # (executable kept only providers with an adapter)
        label = f"provider {provider.id!r} (adapter {name!r})"
        backend = backends[name]
        by_provider[provider.id] = build_executor(
            provider.type, backend, provider.execution, label, clock
        )
        check = provider.health_check
        if check is not False and isinstance(backend, HttpBackend):
            target = http_target(provider.type, provider.execution, label, clock)
            probes[provider.id] = functools.partial(
                probe, backend, target, check.path, Deadlines(check.timeout_ms, clock)
            )
    return AdapterSet(payload.node_id, backends, by_provider, by_adapter, probes)


RemoteFactory = Callable[[NodeConfigPayload], ExecutorSet]
"""Builds the executor set of a remote node from its payload (the daemon's:
a :class:`iop_edge.link.remote.RemoteNode`)."""


class NodeAdapters:
    """Every node's :class:`~iop_edge.adapters.base.ExecutorSet`, built from the node payloads
    at start-up: what the request path asks for the executor of a leased provider or of a
    model route."""

    def __init__(self, sets: Mapping[str, ExecutorSet]) -> None:
        self._sets = dict(sets)

    @classmethod
    def from_config(
        cls,
        config: EdgeConfig,
        clock: Clock | None = None,
        remote: RemoteFactory | None = None,
    ) -> NodeAdapters:
        """Build each node's executors from its :class:`NodeConfigPayload` alone, their
        deadlines on ``clock`` (the loop's when None): a local node's adapters here, a remote
        node's (``token_hash_sha256`` set) by ``remote`` — never its adapters, whose ``cli``
        commands must not run on the edge. :class:`ValueError` when a node is remote and no
        factory is given."""
        sets: dict[str, ExecutorSet] = {}
        for node in config.nodes:
            payload = node_payload(config, node.id)
            if node.token_hash_sha256 is None:
                sets[node.id] = AdapterSet.from_payload(payload, clock)
            elif remote is None:
                raise ValueError(
                    f"nodes[{node.id}] is remote (token_hash_sha256 is set), and no factory of "
                    "remote nodes was given to build it"
                )
            else:
                sets[node.id] = remote(payload)
        return cls(sets)

    def provider(self, node_id: str, provider_id: str) -> Executor:
        """The executor of a provider (``KeyError`` names what exists when there is none)."""
        return self._sets[node_id].for_provider(provider_id)

    async def probe(self, key: tuple[str, str]) -> ProbeResult:
        """Run the health check of provider ``(node_id, provider_id)`` (a
        :data:`iop_edge.seams.Prober`)."""
        node_id, provider_id = key
        adapter_set = self._sets.get(node_id)
        if adapter_set is None:
            return False, f"node {node_id!r} has no adapters"
        return await adapter_set.probe(provider_id)

    def route(self, node_id: str, adapter: str) -> Executor:
        """The executor of a model route: adapter instance ``adapter`` of node ``node_id``."""
        return self._sets[node_id].for_adapter(adapter)

    def statistics(self) -> tuple[AdapterStatistics, ...]:
        """Every node's executor-set statistics, node by node."""
        return tuple(s for adapter_set in self._sets.values() for s in adapter_set.statistics())

    async def aclose(self) -> None:
        """Close every node's pooled connections and kill CLI groups still running."""
        for adapter_set in self._sets.values():
            await adapter_set.aclose()

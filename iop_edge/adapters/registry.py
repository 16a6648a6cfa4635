"""Builds an :class:`~iop_edge.adapters.base.AdapterSet` from a node payload.

Each enabled adapter instance gets one backend (:class:`HttpBackend` for ``openai_compat`` and
``ollama``, :class:`CliTracker` for ``cli``) and one executor with its own execution settings
(for model routes). Each provider whose adapter instance is enabled gets an executor on that
instance's backend, with the provider's merged execution settings — the payload already put the
provider-first fields over the adapter's. Disabled providers get one too: ``enabled`` is a live
setting, and a provider enabled by a refresh must find its executor ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from iop_edge.adapters.base import DEFAULT_REQUEST_TIMEOUT_MS, AdapterSet, Backend, Executor
from iop_edge.adapters.cli import CliExecutor
from iop_edge.adapters.cli_process import CliTracker, minimal_env
from iop_edge.adapters.ollama import OllamaExecutor
from iop_edge.adapters.openai_compat import OpenAICompatExecutor
from iop_edge.adapters.upstream_http import HttpBackend, HttpTarget, static_headers

if TYPE_CHECKING:
    from iop_edge.config.payload import NodeConfigPayload
    from iop_edge.config.schema import AdapterType, ExecutionFields

__all__ = ["build_adapter_set", "build_executor"]

_Set = TypeVar("_Set", bound=AdapterSet)


def build_executor(
    kind: AdapterType, backend: Backend, execution: ExecutionFields, label: str
) -> Executor:
    """The executor of one provider (or adapter instance) of runtime type ``kind``."""
    timeout_ms = execution.request_timeout_ms or DEFAULT_REQUEST_TIMEOUT_MS
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
        )
    assert isinstance(backend, HttpBackend)
    target = HttpTarget(
        label=f"{kind} {label}",
        base_url=execution.base_url,
        headers=static_headers(execution.headers),
        timeout_ms=timeout_ms,
    )
    if kind == "ollama":
        return OllamaExecutor(backend, target, execution.context_size)
    return OpenAICompatExecutor(backend, target, execution.endpoint)


def build_adapter_set(cls: type[_Set], payload: NodeConfigPayload) -> _Set:
    """All executors of ``payload``'s node (see the module docstring)."""
    backends: dict[str, Backend] = {}
    kinds: dict[str, AdapterType] = {}
    by_adapter: dict[str, Executor] = {}
    for adapter in payload.adapters:
        if not adapter.enabled:
            continue
        backend: Backend = (
            CliTracker(adapter.name) if adapter.type == "cli" else HttpBackend(adapter.name)
        )
        backends[adapter.name] = backend
        kinds[adapter.name] = adapter.type
        by_adapter[adapter.name] = build_executor(
            adapter.type, backend, adapter.execution, f"adapter {adapter.name!r}"
        )
    by_provider: dict[str, Executor] = {}
    for provider in payload.providers:
        name = provider.adapter
        # Validation guarantees an enabled provider an enabled adapter of its own type (and a
        # refresh that enables one re-validates that); a provider without one gets no executor
        # rather than a wrong one.
        if name is None or kinds.get(name) != provider.type:
            continue
        by_provider[provider.id] = build_executor(
            provider.type,
            backends[name],
            provider.execution,
            f"provider {provider.id!r} (adapter {name!r})",
        )
    return cls(payload.node_id, backends, by_provider, by_adapter)

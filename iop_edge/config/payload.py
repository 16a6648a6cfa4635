"""``NodeConfigPayload``: what one node needs to run its adapters, derived from the edge config.

Every node runs in-process today; the adapters are built from this payload alone, so that a
remote node agent can later receive the same payload over the wire without changing the mapper.
A payload carries only its own node's adapters and providers — never principal token hashes,
another node's data, or the edge's queue policy.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from iop_edge.config.schema import (
    EXECUTION_FIELDS,
    Adapter,
    AdapterType,
    EdgeConfig,
    ExecutionFields,
    HealthCheck,
    Node,
    NodeRuntime,
    Provider,
)
from iop_edge.errors import ConfigError, ConfigProblem


class _Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AdapterPayload(_Payload):
    """One adapter instance of the node, with its own execution settings."""

    name: str
    type: AdapterType
    enabled: bool
    execution: ExecutionFields


class ProviderPayload(_Payload):
    """One provider of the node: runtime type, adapter instance, and the execution settings to
    use — the adapter instance's values with the provider's own (provider-first) fields on top."""

    id: str
    type: AdapterType
    category: Literal["api", "cli", "local_inference"]
    adapter: str | None
    models: tuple[str, ...]
    enabled: bool
    execution: ExecutionFields
    health_check: HealthCheck | Literal[False] = False


class NodeConfigPayload(_Payload):
    """The runtime config of one node, as the edge hands it to the node's runtime."""

    edge_id: str
    node_id: str
    alias: str | None
    agent_kind: str
    runtime: NodeRuntime
    adapters: tuple[AdapterPayload, ...]
    providers: tuple[ProviderPayload, ...]


def _execution(source: ExecutionFields) -> ExecutionFields:
    return ExecutionFields(**{name: getattr(source, name) for name in EXECUTION_FIELDS})


def merged_execution(adapter: Adapter | None, provider: Provider) -> ExecutionFields:
    """Provider-first execution fields override the adapter instance's values (SPEC §3.1)."""
    values = {name: getattr(adapter, name) for name in EXECUTION_FIELDS} if adapter else {}
    for name in EXECUTION_FIELDS:
        value = getattr(provider, name)
        if value is not None:
            values[name] = value
    return ExecutionFields(**values)


def provider_payload(node: Node, provider: Provider) -> ProviderPayload:
    """Map one provider of an effective config to its payload."""
    adapter = next((a for a in node.adapters if a.name == provider.adapter), None)
    runtime_type: AdapterType = provider.type  # type: ignore[assignment]  # normalized at load
    return ProviderPayload(
        id=provider.id,
        type=runtime_type,
        category=provider.category,
        adapter=provider.adapter,
        models=provider.models,
        enabled=provider.enabled,
        execution=merged_execution(adapter, provider),
        health_check=provider.health_check or False,
    )


def node_payload(config: EdgeConfig, node_id: str) -> NodeConfigPayload:
    """Build the payload of one node of an effective config.

    Raises :class:`ConfigError` naming the known node ids when ``node_id`` is not one of them.
    """
    node = next((n for n in config.nodes if n.id == node_id), None)
    if node is None:
        known = ", ".join(n.id for n in config.nodes) or "none"
        raise ConfigError(
            [ConfigProblem("nodes", f"{node_id!r} is not a node id; known nodes: {known}")]
        )
    return NodeConfigPayload(
        edge_id=config.edge.id,
        node_id=node.id,
        alias=node.alias,
        agent_kind=node.agent_kind,
        runtime=node.runtime,
        adapters=tuple(
            AdapterPayload(name=a.name, type=a.type, enabled=a.enabled, execution=_execution(a))
            for a in node.adapters
        ),
        providers=tuple(provider_payload(node, p) for p in node.providers),
    )

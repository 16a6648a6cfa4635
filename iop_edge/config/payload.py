"""``NodeConfigPayload``: what one node needs to run its adapters, derived from the edge config.

A node's adapters are built from this payload alone: in the edge process for a local node, in
``iop-node`` for a remote one, which receives it over its link as :func:`payload_json` (and
knows it by its :func:`payload_generation`). A payload carries only its own node's adapters
and providers — never principal token hashes, another node's data, or the edge's queue policy.
"""

from __future__ import annotations

import hashlib
from typing import Final, Literal

import orjson
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
    adapter: str | None = None
    models: tuple[str, ...]
    enabled: bool
    execution: ExecutionFields
    health_check: HealthCheck | Literal[False] = False


class NodeConfigPayload(_Payload):
    """The runtime config of one node, as the edge hands it to the node's runtime."""

    edge_id: str
    node_id: str
    alias: str | None = None
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


#: The hex digits of a payload's SHA-256 that make its generation.
GENERATION_HEX_DIGITS: Final = 16


def payload_json(payload: NodeConfigPayload) -> bytes:
    """The wire form of a payload: every field (``None`` included, nothing redacted), as
    canonical JSON (sorted keys, no whitespace), so equal payloads give equal bytes.

    :meth:`NodeConfigPayload.model_validate_json` loads it back to an equal payload. It
    holds the node's credentials in clear: it goes only to that node, never to a log.
    """
    return orjson.dumps(payload.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)


def payload_generation(payload: NodeConfigPayload) -> str:
    """The identity of a payload's content: the first 16 hex digits of the SHA-256 of its
    :func:`payload_json`. Equal payloads share a generation; any change moves it."""
    return hashlib.sha256(payload_json(payload)).hexdigest()[:GENERATION_HEX_DIGITS]

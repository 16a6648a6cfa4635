"""Shared builders for the node-link tests: an edge config with remote nodes, and the edge's
node listener serving them on 127.0.0.1 (:func:`edge_links`), as the daemon builds it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from iop_edge.config import load_config
from iop_edge.config.payload import node_payload, payload_generation
from iop_edge.config.schema import EdgeConfig
from iop_edge.link.edge_server import NodeLinkServer
from iop_edge.link.handshake import LinkLimits
from iop_edge.link.remote import RemoteNode
from iop_edge.runtime.clock import MonotonicClock
from iop_edge.runtime.listeners import ConnectionLimits, Listener
from iop_edge.runtime.logs import get_logger
from iop_edge.seams import Clock
from iop_edge.tokens import token_hash

TOKENS: Final = {"n1": "iopn_test-token-of-node-one", "n2": "iopn_test-token-of-node-two"}
"""The node tokens of :func:`remote_config`'s nodes."""

LIMITS: Final = ConnectionLimits(
    keepalive_timeout=5.0, header_timeout=5.0, write_timeout=30.0, max_connections=64
)


def remote_config(
    nodes: Mapping[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]],
    *,
    local: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None,
) -> EdgeConfig:
    """A config with remote nodes ``n1``, ``n2``… (``{id: (adapters, providers)}``, tokens of
    :data:`TOKENS`), and a local node ``local`` when given; every provider serves model
    ``m``."""
    doc_nodes: list[dict[str, Any]] = []
    provider_ids: list[str] = []
    entries = [(node_id, spec, True) for node_id, spec in nodes.items()]
    if local is not None:
        entries.append(("local", local, False))
    for node_id, (adapters, providers), remote in entries:
        for provider in providers:
            provider.setdefault("models", ["m"])
            provider.setdefault(
                "category", "cli" if provider["type"] == "cli" else "local_inference"
            )
            provider_ids.append(provider["id"])
        entry: dict[str, Any] = {"id": node_id, "adapters": adapters, "providers": providers}
        if remote:
            entry["token_hash_sha256"] = token_hash(TOKENS[node_id])
        doc_nodes.append(entry)
    doc = {
        "models": [{"id": "m", "context_window_tokens": 8192, "providers": provider_ids}],
        "nodes": doc_nodes,
    }
    return load_config(yaml.safe_dump(doc, sort_keys=False))


def openai_node(base_url: str, pid: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One ``openai_compat`` adapter ``oa`` at ``base_url`` and its provider ``pid``."""
    return (
        [{"name": "oa", "type": "openai_compat", "base_url": base_url}],
        [{"id": pid, "type": "openai_compat", "adapter": "oa"}],
    )


@dataclass
class EdgeLinks:
    """The node listener of a test edge: the server, its listener, the remote nodes and
    every ``(node, connected)`` they told (``states``)."""

    server: NodeLinkServer
    listener: Listener
    nodes: dict[str, RemoteNode]
    states: list[tuple[str, bool]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``GET /link``'s URL."""
        return self.listener.url.replace("https://", "wss://").replace("http://", "ws://") + "/link"


@contextlib.asynccontextmanager
async def edge_links(
    config: EdgeConfig,
    *,
    clock: Clock | None = None,
    limits: LinkLimits | None = None,
    heartbeat_ms: int = 2000,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[EdgeLinks]:
    """The edge's node listener for ``config``'s remote nodes on 127.0.0.1 (port 0), closed
    after."""
    clock = clock if clock is not None else MonotonicClock()
    states: list[tuple[str, bool]] = []
    nodes = {}
    for node in config.nodes:
        if node.token_hash_sha256 is None:
            continue
        payload = node_payload(config, node.id)
        nodes[node.id] = RemoteNode(
            payload,
            clock=clock,
            heartbeat_ms=heartbeat_ms,
            generation=payload_generation(payload),
            on_state=lambda node_id, up: states.append((node_id, up)),
        )
    hashes = {n.token_hash_sha256: n.id for n in config.nodes if n.token_hash_sha256}
    server = NodeLinkServer(
        nodes,
        hashes,
        edge_id=config.edge.id,
        edge_version="test",
        heartbeat_ms=heartbeat_ms,
        clock=clock,
        limits=limits,
    )
    listener = await Listener.bind(
        "nodes",
        server.build_app(),
        "127.0.0.1:0",
        LIMITS,
        clock=clock,
        log=get_logger(),
        ssl_context=ssl_context,
    )
    links = EdgeLinks(server, listener, nodes, states)
    try:
        yield links
    finally:
        await server.close()
        listener.stop_accepting()
        await listener.drain(asyncio.get_running_loop().time() + 5)
        await listener.close()


def small_limits(**changes: int) -> LinkLimits:
    """:class:`LinkLimits` with ``changes``."""
    return dataclasses.replace(LinkLimits(), **changes)

"""The scrape-time collectors describe themselves (issue 26): registering one reads no
snapshot, and ``describe()`` names exactly the families ``collect()`` yields."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector, DuplicateTimeseries

from iop_edge.api.responses_store import ResponsesStore, ResponsesStoreStatistics
from iop_edge.collectors import (
    HandoverCollector,
    ListenerCollector,
    NodeLinkCollector,
    ResponsesStoreCollector,
    StateCollector,
)
from iop_edge.config import parse_config
from iop_edge.config.policy import pool_policy
from iop_edge.link.statistics import NodeLinkStatistics
from iop_edge.pool import PoolScheduler, PoolStatistics
from iop_edge.runtime.logs import get_logger
from iop_edge.supervisor import Supervisor
from iop_edge.testing.clock import FakeClock
from tests.helpers import doc_for, dump


@dataclass(frozen=True)
class Listener:
    """The fields of a listener's statistics the collector reads."""

    name: str = "openai"
    max_connections: int = 8
    open_connections: int = 2
    refused: int = 1
    header_timeouts: int = 0
    write_stalls: int = 0
    evicted: int = 0


@dataclass(frozen=True)
class Handover:
    """The fields of a handover's statistics the collector reads."""

    at: float = 1.0
    duration: float = 0.25
    inherited_leases: int = 3
    inherited_held: int = 1
    relayed_requests: int = 2


class Reads:
    """Getters that count their calls (a snapshot read)."""

    def __init__(self, tmp_path: Path) -> None:
        self.calls: list[str] = []
        doc = doc_for()
        config = parse_config(doc)
        path = tmp_path / "edge.yaml"
        path.write_text(dump(doc))
        self._pool = PoolScheduler(pool_policy(config))
        self._supervisor = Supervisor(
            path, config, apply=lambda config: None, env={}, log=get_logger()
        )

    def statistics(self) -> PoolStatistics:
        self.calls.append("pool")
        return self._pool.statistics()

    def supervisor(self) -> Supervisor:
        self.calls.append("supervisor")
        return self._supervisor

    def listeners(self) -> Iterable[Any]:
        self.calls.append("listeners")
        return [Listener()]

    def handover(self) -> Any:
        self.calls.append("handover")
        return Handover()

    def responses(self) -> ResponsesStoreStatistics:
        self.calls.append("responses")
        store = ResponsesStore(max_items=2, max_bytes=1000, ttl=60.0, clock=FakeClock())
        store.put("resp_1", "team", b"{}", [])
        return store.statistics()

    def nodes(self) -> Iterable[NodeLinkStatistics]:
        self.calls.append("nodes")
        return [NodeLinkStatistics("gpu", remote=True, connected=True, rtt=0.002)]

    def collectors(self) -> list[Collector]:
        return [
            StateCollector(self.statistics, self.supervisor, routes=()),
            ListenerCollector(self.listeners),
            HandoverCollector(self.handover),
            ResponsesStoreCollector(self.responses),
            NodeLinkCollector(self.nodes),
        ]


@pytest.mark.parametrize("auto_describe", [True, False], ids=["auto_describe", "plain"])
def test_registering_a_collector_reads_no_snapshot(tmp_path: Path, auto_describe: bool) -> None:
    """With ``describe()`` the registry learns the names without calling ``collect()``: no
    statistics() is read at registration, whatever the registry's ``auto_describe``; the
    first scrape reads each snapshot once."""
    reads = Reads(tmp_path)
    registry = CollectorRegistry(auto_describe=auto_describe)
    for collector in reads.collectors():
        registry.register(collector)
    assert reads.calls == []
    scraped = {m.name: m for m in registry.collect()}  # what a scrape reads
    assert reads.calls == ["pool", "supervisor", "listeners", "handover", "responses", "nodes"]
    assert scraped["iop_edge_queue_depth"].samples[0].value == 0


def families(metrics: Iterable[Any]) -> list[tuple[str, str, str]]:
    return [(m.name, m.type, m.documentation) for m in metrics]


def test_describe_names_the_families_collect_yields(tmp_path: Path) -> None:
    """Same families in the same order, with their types and help; without samples."""
    for collector in Reads(tmp_path).collectors():
        described = list(collector.describe())  # type: ignore[attr-defined]
        assert [m.samples for m in described] == [[] for _ in described]
        assert families(described) == families(collector.collect())


def test_a_second_collector_of_the_same_families_is_refused_at_registration(
    tmp_path: Path,
) -> None:
    """The names ``describe()`` gives are held unique by the registry (without it a plain
    registry registered no names, and a family twice on one scrape went unnoticed)."""
    reads = Reads(tmp_path)
    registry = CollectorRegistry()
    registry.register(ListenerCollector(reads.listeners))
    with pytest.raises(DuplicateTimeseries):
        registry.register(ListenerCollector(reads.listeners))
    assert reads.calls == []


def test_the_responses_store_collector_reads_the_store_s_statistics() -> None:
    """Items and bytes held as gauges; what the store dropped or refused, by reason."""
    clock = FakeClock()
    store = ResponsesStore(max_items=2, max_bytes=100, ttl=10.0, clock=clock)
    store.put("resp_a", "team", b"x" * 40, [])  # 42 bytes: the response and "[]"
    store.put("resp_b", "team", b"x" * 40, [])
    store.put("resp_c", "team", b"x" * 40, [])  # evicts resp_a (lru)
    store.put("resp_big", "team", b"x" * 200, [])  # too large
    clock.advance(10.0)
    assert store.get("resp_b", "team") is None  # expired
    registry = CollectorRegistry()
    registry.register(ResponsesStoreCollector(store.statistics))
    assert registry.get_sample_value("iop_edge_responses_stored") == 1
    assert registry.get_sample_value("iop_edge_responses_store_bytes") == 42
    evicted = {
        reason: registry.get_sample_value("iop_edge_responses_evicted_total", {"reason": reason})
        for reason in ("lru", "expired", "too_large")
    }
    assert evicted == {"lru": 1, "expired": 1, "too_large": 1}


def test_the_node_link_collector_shows_remote_nodes_only() -> None:
    """Issue 29 item 10: a series per remote node (a local node has no link); the round trip
    once measured, the agent's info only while its link is up; bytes by direction as the
    edge sees them; the listener's refusals by reason. Label values come from the node's
    ``HELLO`` and are cut, since the node chose them."""
    nodes = [
        NodeLinkStatistics("local", remote=False, connected=True),
        NodeLinkStatistics(
            "gpu",
            remote=True,
            connected=True,
            agent_version="0.2.0",
            generation="0123456789abcdef",
            generation_acked="0123456789abcdef",
            in_flight=3,
            reconnects=2,
            rtt=0.0015,
            bytes_sent=1000,
            bytes_received=5000,
            violations=1,
        ),
        NodeLinkStatistics(
            "lab",
            remote=True,
            connected=False,
            agent_version="x" * 300,
            generation="fedcba9876543210",
            bytes_sent=7,
            bytes_received=9,
            last_down_reason="heartbeat",
        ),
    ]
    registry = CollectorRegistry()
    refused = {"invalid_node_token": 4, "reconnecting_too_fast": 1}
    registry.register(NodeLinkCollector(lambda: nodes, lambda: refused))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in registry.collect()
        for s in metric.samples
    }
    gpu, lab = (("node", "gpu"),), (("node", "lab"),)
    assert samples == {
        ("iop_edge_node_connected", gpu): 1,
        ("iop_edge_node_connected", lab): 0,
        ("iop_edge_node_reconnects_total", gpu): 2,
        ("iop_edge_node_reconnects_total", lab): 0,
        ("iop_edge_node_link_rtt_seconds", gpu): 0.0015,
        ("iop_edge_node_link_bytes_total", (("direction", "sent"), *gpu)): 1000,
        ("iop_edge_node_link_bytes_total", (("direction", "received"), *gpu)): 5000,
        ("iop_edge_node_link_bytes_total", (("direction", "sent"), *lab)): 7,
        ("iop_edge_node_link_bytes_total", (("direction", "received"), *lab)): 9,
        ("iop_edge_node_link_in_flight", gpu): 3,
        ("iop_edge_node_link_in_flight", lab): 0,
        ("iop_edge_node_link_violations_total", gpu): 1,
        ("iop_edge_node_link_violations_total", lab): 0,
        ("iop_edge_node_link_refused_total", (("reason", "invalid_node_token"),)): 4,
        ("iop_edge_node_link_refused_total", (("reason", "reconnecting_too_fast"),)): 1,
        (
            "iop_edge_node_info",
            (("agent_version", "0.2.0"), ("generation", "0123456789abcdef"), *gpu),
        ): 1,
    }
    nodes[2] = dataclasses.replace(nodes[2], connected=True, generation_acked="f" * 16)
    (info,) = (m for m in registry.collect() if m.name == "iop_edge_node_info")
    lab_info = next(s for s in info.samples if s.labels["node"] == "lab")
    assert lab_info.labels["agent_version"] == "x" * 64

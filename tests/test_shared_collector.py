"""The shared pool's metrics: the store's state, calls, errors and latency, the members, what
the store refused and lost, and each provider's leases over every edge — read at scrape time
from the gate's statistics, exported only when the pool is shared. Against a real daemon and a
real ``redis-server`` (killed and started again), and on a snapshot's exact values."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from iop_edge.shared.gate import GateStatistics, ProviderShare
from iop_edge.shared.records import LATENCY_BUCKETS, StoreStatistics
from iop_edge.shared.store import OPS
from iop_edge.shared_collector import SharedPoolCollector
from iop_edge.testing.redis_server import RedisServer
from tests.helpers import doc_for, edge_on, wait_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples_of(metrics: Iterable[Any]) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in metrics for s in m.samples}


async def scrape(url: str) -> tuple[Samples, str]:
    """Every sample of ``/metrics``, and its text."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        text = await response.text()
    return samples_of(text_string_to_metric_families(text)), text


def statistics(state: str = "up") -> GateStatistics:
    """A gate's snapshot: two providers, calls of two operations (one failed), three latencies
    (0.3 ms, 2 ms, 0.7 s)."""
    ops: list[str] = list(OPS)
    calls = dict.fromkeys(ops, 0) | {"acquire": 3, "renew": 1}
    errors = dict.fromkeys(ops, 0) | {"renew": 1}
    counts = tuple(sum(1 for s in (0.0003, 0.002, 0.7) if s <= bound) for bound in LATENCY_BUCKETS)
    return GateStatistics(
        instance_id="a1b2c3d4e5f6",
        store="redis://:***@127.0.0.1:6379/0",
        state=state,  # type: ignore[arg-type]
        on_store_down="static_split",
        lease_ttl_ms=10000,
        members=3,
        down_since=None if state == "up" else 12.5,
        providers=(ProviderShare("n1", "gpu", 4, 1, 2, 0), ProviderShare("n1", "cpu", 0, 0, 0, 0)),
        leases=2,
        refused=5,
        lost=1,
        store_calls=StoreStatistics(
            calls=calls,
            errors=errors,
            latency_buckets=LATENCY_BUCKETS,
            latency_counts=counts,
            latency_sum=0.7023,
            latency_count=3,
            last_error=None,
        ),
    )


def test_the_collector_exports_the_gate_s_snapshot() -> None:
    """Store up 1; calls and errors per operation (every one, zeros included); members,
    refused, lost; the leases of every edge by slot, as the in-flight gauges split them
    (general: held less the long ones); the latency histogram with the store's buckets."""
    snapshot = statistics()
    registry = CollectorRegistry()
    registry.register(SharedPoolCollector(lambda: snapshot))
    samples = samples_of(registry.collect())
    gpu, cpu = (("node", "n1"), ("provider", "gpu")), (("node", "n1"), ("provider", "cpu"))
    assert samples[("iop_edge_shared_store_up", ())] == 1
    assert samples[("iop_edge_shared_members", ())] == 3
    assert samples[("iop_edge_shared_refused_total", ())] == 5
    assert samples[("iop_edge_shared_leases_lost_total", ())] == 1
    for op in OPS:
        made = {"acquire": 3, "renew": 1}.get(op, 0)
        assert samples[("iop_edge_shared_store_calls_total", (("op", op),))] == made
        failed = 1 if op == "renew" else 0
        assert samples[("iop_edge_shared_store_errors_total", (("op", op),))] == failed
    leases = {k: v for k, v in samples.items() if k[0] == "iop_edge_provider_leases"}
    assert leases == {
        ("iop_edge_provider_leases", (*gpu, ("slot", "general"))): 3,
        ("iop_edge_provider_leases", (*gpu, ("slot", "long"))): 1,
        ("iop_edge_provider_leases", (*cpu, ("slot", "general"))): 0,
        ("iop_edge_provider_leases", (*cpu, ("slot", "long"))): 0,
    }
    bucket = "iop_edge_shared_store_latency_seconds_bucket"
    assert samples[(bucket, (("le", "0.0005"),))] == 1
    assert samples[(bucket, (("le", "0.001"),))] == 1
    assert samples[(bucket, (("le", "0.0025"),))] == 2
    assert samples[(bucket, (("le", "0.5"),))] == 2
    assert samples[(bucket, (("le", "1.0"),))] == 3
    assert samples[(bucket, (("le", "+Inf"),))] == 3
    assert samples[("iop_edge_shared_store_latency_seconds_count", ())] == 3
    assert samples[("iop_edge_shared_store_latency_seconds_sum", ())] == 0.7023


def test_the_store_down_or_recovering_is_0_and_its_stale_counts_are_not_exported() -> None:
    """Down: the leases last seen are not the store's now — no ``iop_edge_provider_leases``;
    recovering (the split kept one more renewal period): up 0, the store's counts again."""
    for state, up, leases in (("down", 0, False), ("recovering", 0, True)):
        registry = CollectorRegistry()
        registry.register(SharedPoolCollector(partial(statistics, state)))
        samples = samples_of(registry.collect())
        assert samples[("iop_edge_shared_store_up", ())] == up, state
        assert any(name == "iop_edge_provider_leases" for name, _ in samples) is leases, state


def test_describe_names_the_families_collect_yields_and_reads_nothing() -> None:
    reads: list[str] = []

    def snapshot() -> GateStatistics:
        reads.append("gate")
        return statistics()

    collector = SharedPoolCollector(snapshot)
    described = [(m.name, m.type, m.documentation) for m in collector.describe()]
    assert reads == []
    assert described == [(m.name, m.type, m.documentation) for m in collector.collect()]
    assert reads == ["gate"]


async def test_an_edge_alone_exports_no_shared_series(tmp_path: Path) -> None:
    async with edge_on(tmp_path, doc_for()) as edge:
        samples, _ = await scrape(edge.daemon.metrics_url)
    names = {name for name, _ in samples}
    assert not {n for n in names if n.startswith("iop_edge_shared_")}
    assert "iop_edge_provider_leases" not in names


async def test_the_metrics_follow_the_store_up_down_and_back(tmp_path: Path) -> None:
    """A daemon holding one lease: up 1, its lease in the store's count, one member, calls
    timed; the store killed: up 0, the failure counted under its operation, no lease series;
    started again: up 1 and the lease counted again (written back). No password anywhere."""
    with RedisServer(password=secrets.token_hex(8)) as store:
        password = store.password
        assert password
        pool = {"max_queue": 8, "queue_timeout_ms": 30000}
        doc = doc_for(provider_pool=pool | {"shared": {"store": store.url, "lease_ttl_ms": 1000}})
        async with edge_on(tmp_path, doc) as edge:
            daemon = edge.daemon
            gate = daemon.scheduler.gate
            assert gate is not None
            lease = await daemon.scheduler.admit("echo")
            try:
                cat = (("node", "local"), ("provider", "cat"))
                up, text = await scrape(daemon.metrics_url)
                assert up[("iop_edge_shared_store_up", ())] == 1
                assert up[("iop_edge_shared_members", ())] == 1
                assert up[("iop_edge_provider_leases", (*cat, ("slot", "general")))] == 1
                assert up[("iop_edge_provider_leases", (*cat, ("slot", "long")))] == 0
                assert up[("iop_edge_shared_store_calls_total", (("op", "acquire"),))] == 1
                assert up[("iop_edge_shared_store_errors_total", (("op", "acquire"),))] == 0
                assert up[("iop_edge_shared_store_latency_seconds_count", ())] >= 3
                errors_before = sum(v for (n, _), v in up.items() if n.endswith("_errors_total"))
                assert errors_before == 0

                store.kill()
                await wait_for(lambda: gate.statistics().state == "down")
                down, text_down = await scrape(daemon.metrics_url)
                assert down[("iop_edge_shared_store_up", ())] == 0
                failed = {
                    dict(labels)["op"]: value
                    for (name, labels), value in down.items()
                    if name == "iop_edge_shared_store_errors_total" and value
                }
                # the background work that found the store gone (no request was made meanwhile)
                assert failed
                assert "acquire" not in failed
                assert not any(name == "iop_edge_provider_leases" for name, _ in down)
                assert down[("iop_edge_shared_members", ())] == 1  # (the split's divisor)

                store.start()
                await wait_for(lambda: gate.statistics().state == "up")
                back, text_back = await scrape(daemon.metrics_url)
                assert back[("iop_edge_shared_store_up", ())] == 1
                assert back[("iop_edge_provider_leases", (*cat, ("slot", "general")))] == 1
            finally:
                lease.release()  # (else the stop waits for it to drain)
    assert password not in text + text_down + text_back

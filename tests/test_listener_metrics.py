"""The listeners' connection figures on ``/metrics`` (issue 10 item 4): what an operator graphs
and alerts on when clients exhaust connections — open connections, the cap, refusals."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import wait_for
from tests.test_supervisor import doc_for, edge_on


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics`` as ``(name, sorted labels) -> value``."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_a_refused_connection_is_counted_with_the_open_ones_and_the_cap(tmp_path):
    doc = doc_for()
    doc["openai"] |= {"max_connections": 1}
    async with edge_on(tmp_path, doc) as edge:
        listener = edge.daemon.listeners["openai"]
        _, held = await asyncio.open_connection(listener.host, listener.port)
        await wait_for(lambda: listener.statistics().open_connections == 1)
        reader, writer = await asyncio.open_connection(listener.host, listener.port)
        async with asyncio.timeout(10):  # bounds a broken run, never a timing
            answer = await reader.read()
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert b"too_many_connections" in answer
        samples = await scrape(edge.daemon.metrics_url)
        held.close()
    openai = (("listener", "openai"),)
    assert samples[("iop_edge_listener_connections", openai)] == 1
    assert samples[("iop_edge_listener_max_connections", openai)] == 1
    refused = (("event", "refused"), ("listener", "openai"))
    assert samples[("iop_edge_listener_connection_events_total", refused)] == 1
    stalls = (("event", "write_stall"), ("listener", "openai"))
    assert samples[("iop_edge_listener_connection_events_total", stalls)] == 0
    # the scrape itself is a connection of the metrics listener
    assert samples[("iop_edge_listener_connections", (("listener", "metrics"),))] == 1


async def test_metrics_are_served_by_prometheus_clients_own_handler(tmp_path):
    """Content negotiation comes with it: a scraper asking for OpenMetrics gets OpenMetrics,
    one asking for nothing gets the text format (issue 11)."""
    async with edge_on(tmp_path, doc_for()) as edge:
        url = edge.daemon.metrics_url
        openmetrics = {"Accept": "application/openmetrics-text; version=1.0.0"}
        async with aiohttp.ClientSession() as session:
            async with session.get(url, headers=openmetrics) as response:
                negotiated = response.headers["Content-Type"], await response.text()
            async with session.get(url) as response:
                plain = response.headers["Content-Type"], await response.text()
    content_type, body = negotiated
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith("# EOF\n")
    content_type, body = plain
    assert content_type.startswith("text/plain; version=0.0.4")
    names = {f.name for f in text_string_to_metric_families(body)}
    assert {"iop_edge_queue_depth", "iop_edge_listener_connections"} <= names

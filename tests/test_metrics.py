"""What ``/metrics`` shows an operator: every metric family of the spec with its type and the
values a few requests leave (SPEC metrics), and the listeners' connection figures (issue 10
item 4): open connections, the cap, refusals."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import doc_for, edge_on, wait_for


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


async def test_metrics_parse_and_have_every_metric_of_the_spec(tmp_path):
    async with FakeOpenAI() as fake, edge_on(tmp_path, doc_for(fake)) as edge:
        async with openai.AsyncOpenAI(
            base_url=edge.daemon.openai_url, api_key="x", max_retries=0
        ) as client:
            await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "count these words"}]
            )
            stream = await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            async for _ in stream:
                pass
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(
                    model="nope", messages=[{"role": "user", "content": "x"}]
                )
        fake.enqueue(FakeBehavior(status=500))
        async with openai.AsyncOpenAI(
            base_url=edge.daemon.openai_url, api_key="x", max_retries=0
        ) as client:
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "x"}]
                )
        async with aiohttp.ClientSession() as session, session.get(edge.daemon.metrics_url) as r:
            text = await r.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    expected = {
        "iop_edge_requests": "counter",
        "iop_edge_request_duration_seconds": "histogram",
        "iop_edge_time_to_first_token_seconds": "histogram",
        "iop_edge_queue_depth": "gauge",
        "iop_edge_queue_wait_seconds": "histogram",
        "iop_edge_admission_rejected": "counter",
        "iop_edge_provider_in_flight": "gauge",
        "iop_edge_provider_capacity": "gauge",
        "iop_edge_provider_enabled": "gauge",
        "iop_edge_upstream_errors": "counter",
        "iop_edge_tokens": "counter",
        "iop_edge_config_info": "gauge",
        "iop_edge_config_last_reload_successful": "gauge",
        "iop_edge_config_last_reload_success_timestamp_seconds": "gauge",
        "iop_edge_config_reloads": "counter",
        "iop_edge_config_restart_pending": "gauge",
    }
    assert {name: families[name].type for name in expected} == expected
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families.values()
        for s in family.samples
    }

    def requests(model: str, code: str) -> float:
        labels = (("code", code), ("model", model), ("token_ref", "anonymous"))
        return samples[("iop_edge_requests_total", labels)]

    assert requests("chat", "ok") == 2
    assert requests("(unknown)", "model_not_found") == 1  # an unknown id is never a label
    assert requests("chat", "upstream_error") == 1
    assert (
        samples[
            (
                "iop_edge_upstream_errors_total",
                (
                    ("node", "local"),
                    ("provider", "up"),
                    ("reason", "status"),
                    ("status_code", "500"),
                ),
            )
        ]
        == 1
    )
    assert (
        samples[
            (
                "iop_edge_tokens_total",
                (("direction", "prompt"), ("model", "chat"), ("token_ref", "anonymous")),
            )
        ]
        >= 3
    )
    assert (
        samples[
            (
                "iop_edge_provider_capacity",
                (("node", "local"), ("provider", "up"), ("slot", "general")),
            )
        ]
        == 2
    )
    assert samples[("iop_edge_provider_enabled", (("node", "local"), ("provider", "up")))] == 1
    assert samples[("iop_edge_request_duration_seconds_count", (("model", "chat"),))] == 3

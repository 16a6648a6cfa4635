"""What ``/metrics`` shows an operator: every metric family of the spec with its type and the
values a few requests leave (SPEC metrics), and the listeners' connection figures (issue 10
item 4): open connections, the cap, refusals."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import iop_edge
from iop_edge.adapters.base import UpstreamReply, Usage
from iop_edge.link import calls
from iop_edge.link.protocol import Frame, Kind
from iop_edge.metrics import latency_buckets
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.hostile_node import DialRefused, ScriptedNode
from tests.helpers import doc_for, dump, edge_on, wait_for
from tests.helpers.links import TOKENS
from tests.helpers.remote_nodes import (
    REMOTE_MODEL,
    REMOTE_NODE,
    REMOTE_PROVIDER,
    answering_node,
    link_url,
    node_connected,
    with_remote_node,
)

#: The node's answer to the one request of the remote-node test.
ANSWER = UpstreamReply(200, b'{"choices":[]}', Usage(1, 1))


async def scrape_text(url: str) -> str:
    """``/metrics`` as it is."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return await response.text()


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics`` as ``(name, sorted labels) -> value``."""
    text = await scrape_text(url)
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


# --- issue 15: per-provider attempts, honest labels, no series ahead of traffic ---------------


def samples_of(metrics: dict[str, float], name: str) -> dict[str, float]:
    """The samples of one metric name in :meth:`Edge.metrics`, keyed as there."""
    return {k: v for k, v in metrics.items() if k == name or k.startswith(name + "[")}


async def test_no_series_exists_before_its_first_value(tmp_path):
    """A fresh daemon shows no request, attempt or token series; a request for an unknown
    model leaves its request count and duration only (no token, queue-wait or first-token
    series); a plain answer observes no time to first token — only a stream does."""
    async with FakeOpenAI() as fake, edge_on(tmp_path, doc_for(fake)) as edge:
        fresh = await edge.metrics()
        async with openai.AsyncOpenAI(
            base_url=edge.daemon.openai_url, api_key="x", max_retries=0
        ) as client:
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(
                    model="nope", messages=[{"role": "user", "content": "x"}]
                )
            unknown = await edge.metrics()
            await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "plain"}]
            )
            plain = await edge.metrics()
            stream = await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "streamed"}], stream=True
            )
            async for _ in stream:
                pass
            streamed = await edge.metrics()
    event_series = (
        "iop_edge_requests_total",
        "iop_edge_request_duration_seconds_count",
        "iop_edge_time_to_first_token_seconds_count",
        "iop_edge_queue_wait_seconds_count",
        "iop_edge_tokens_total",
        "iop_edge_provider_requests_total",
        "iop_edge_upstream_errors_total",
        "iop_edge_failovers_total",
        "iop_edge_config_reloads_total",
    )
    assert [name for name in event_series if samples_of(fresh, name)] == []
    assert [k for k in unknown if "(unknown)" in k and "_bucket" not in k] == [
        "iop_edge_requests_total[('code', 'model_not_found'), ('model', '(unknown)'), "
        "('token_ref', 'anonymous')]",
        "iop_edge_request_duration_seconds_count[('model', '(unknown)')]",
        "iop_edge_request_duration_seconds_sum[('model', '(unknown)')]",
    ]
    assert not samples_of(plain, "iop_edge_time_to_first_token_seconds_count")
    assert samples_of(streamed, "iop_edge_time_to_first_token_seconds_count") == {
        "iop_edge_time_to_first_token_seconds_count[('model', 'chat')]": 1
    }


async def test_process_figures_build_info_and_the_queue_limit_are_exported(tmp_path):
    """prometheus-client's process and platform collectors are on the daemon's registry; the
    version runs as ``iop_edge_build_info``; ``iop_edge_queue_max`` follows a live change."""
    async with edge_on(tmp_path, doc_for()) as edge:
        before = await edge.metrics()
        doc = doc_for()
        doc["provider_pool"]["max_queue"] = 20
        edge.path.write_text(dump(doc))
        assert (await edge.supervisor.refresh("api")).result == "applied"
        after = await edge.metrics()
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"):
        assert before[name] > 0, name
    assert [k for k in before if k.startswith("python_info")]
    assert before[f"iop_edge_build_info[('version', '{iop_edge.__version__}')]"] == 1
    assert (before["iop_edge_queue_max"], after["iop_edge_queue_max"]) == (8, 20)


def test_duration_buckets_end_at_the_timeout():
    assert latency_buckets(600.0)[-3:] == (120.0, 300.0, 600.0)
    assert latency_buckets(3600.0)[-5:] == (300.0, 600.0, 1200.0, 2400.0, 3600.0)
    assert latency_buckets(30.0)[-3:] == (10.0, 20.0, 30.0)
    assert latency_buckets(0.001) == (0.001,)


@pytest.mark.parametrize(("timeout_ms", "largest"), [(None, 600.0), (900_000, 900.0)])
async def test_duration_buckets_reach_the_largest_configured_request_timeout(
    tmp_path, timeout_ms, largest
):
    """The request, first-token and attempt histograms' largest finite bucket is the longest
    ``request_timeout_ms`` of the config (600 s, the default, when none is set)."""
    async with FakeOpenAI() as fake:
        doc = doc_for(fake)
        if timeout_ms is not None:
            doc["nodes"][0]["providers"][1]["request_timeout_ms"] = timeout_ms
        async with edge_on(tmp_path, doc) as edge:
            async with openai.AsyncOpenAI(
                base_url=edge.daemon.openai_url, api_key="x", max_retries=0
            ) as client:
                stream = await client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "hi"}], stream=True
                )
                async for _ in stream:
                    pass
            samples = await scrape(edge.daemon.metrics_url)
    for name in (
        "iop_edge_request_duration_seconds_bucket",
        "iop_edge_time_to_first_token_seconds_bucket",
        "iop_edge_provider_request_duration_seconds_bucket",
    ):
        bounds = sorted(
            float(dict(labels)["le"])
            for (sample_name, labels) in samples
            if sample_name == name and dict(labels)["le"] != "+Inf"
        )
        assert bounds[-1] == largest, name


async def test_a_model_route_shows_its_slots_and_attempts_but_no_health(tmp_path):
    """A ``model_routes[]`` entry is admitted on a pseudo-provider ``route:MODEL``: its
    in-flight slots and its attempts are shown under that name (never under the adapter's
    name), but it has no health, probes, panic or (without a capacity) slot limit."""
    async with FakeOpenAI() as fake:
        doc = doc_for(fake)
        doc["openai"]["model_routes"] = [
            {"model": "legacy", "adapter": "oa", "target": "fake-model"}
        ]
        async with edge_on(tmp_path, doc) as edge:
            async with openai.AsyncOpenAI(
                base_url=edge.daemon.openai_url, api_key="x", max_retries=0
            ) as client:
                await client.chat.completions.create(
                    model="legacy", messages=[{"role": "user", "content": "hi"}]
                )
            metrics = await edge.metrics()
    route = [
        k for k in metrics if ("route:legacy" in k or "legacy[route]" in k) and "_bucket" not in k
    ]
    labels = "[('node', 'local'), ('provider', 'route:legacy')]"
    assert route == [
        "iop_edge_provider_requests_total[('code', 'ok'), ('node', 'local'), "
        "('provider', 'route:legacy')]",
        f"iop_edge_provider_request_duration_seconds_count{labels}",
        f"iop_edge_provider_request_duration_seconds_sum{labels}",
        "iop_edge_provider_in_flight[('node', 'local'), ('provider', 'route:legacy'), "
        "('slot', 'general')]",
        f"iop_edge_provider_enabled{labels}",
    ]
    assert [k for k in metrics if "'oa'" in k] == []


async def test_a_model_left_without_an_enabled_provider_shows_zero(tmp_path):
    """``iop_edge_model_enabled_providers`` (what IopEdgeModelNoProvider alerts on) drops to 0
    when a live refresh disables the group's only provider."""
    async with edge_on(tmp_path, doc_for()) as edge:
        before = await edge.metrics()
        doc = doc_for()
        doc["nodes"][0]["providers"][0]["enabled"] = False
        edge.path.write_text(dump(doc))
        assert (await edge.supervisor.refresh("api")).result == "applied"
        after = await edge.metrics()
    key = "iop_edge_model_enabled_providers[('model', 'echo')]"
    assert (before[key], after[key]) == (1, 0)


async def test_a_remote_node_s_link_is_exported_while_it_comes_and_goes(tmp_path):
    """Issue 29 item 10: series for the remote node only (none for the local one); connected
    0 and its provider down before the node dials; connected, the agent's info, the round
    trip, bytes by direction and the request in flight once it serves; back to 0 with the
    bytes kept when it goes, a reconnect counted when it comes back; a dial with a wrong
    token counted by reason — and no token in any label."""
    async with edge_on(tmp_path, with_remote_node(doc_for())) as edge:
        daemon = edge.daemon
        far = (("node", REMOTE_NODE), ("provider", REMOTE_PROVIDER))
        n1 = (("node", REMOTE_NODE),)
        before = await scrape(daemon.metrics_url)
        assert before[("iop_edge_node_connected", n1)] == 0
        assert before[("iop_edge_node_reconnects_total", n1)] == 0
        assert before[("iop_edge_provider_up", far)] == 0  # disconnected: out of the pool
        assert before[("iop_edge_provider_up", (("node", "local"), ("provider", "cat")))] == 1
        nodes = {dict(labels).get("node") for (name, labels) in before if "_node_" in name}
        assert nodes == {REMOTE_NODE}  # (none for the local node)
        assert not any(name == "iop_edge_node_link_rtt_seconds" for name, _ in before)
        assert not any(name == "iop_edge_node_info" for name, _ in before)

        with pytest.raises(DialRefused):
            await ScriptedNode.dial(link_url(daemon), "iopn_not-a-token-of-this-edge")
        async with answering_node(daemon) as node, aiohttp.ClientSession() as http:
            await wait_for(lambda: daemon.node_statistics()[1].rtt is not None)
            asked = asyncio.create_task(
                http.post(
                    daemon.openai_url + "/chat/completions",
                    json={"model": REMOTE_MODEL, "messages": [{"role": "user", "content": "hi"}]},
                )
            )
            req = await node.next_frame()
            assert req is not None
            assert req.kind is Kind.REQ
            up = await scrape(daemon.metrics_url)
            meta = calls.reply_meta(ANSWER)
            await node.node.send(
                Frame(Kind.RESP_REPLY, stream=req.stream, meta=meta, data=ANSWER.body)
            )
            await asked
        await wait_for(lambda: not node_connected(daemon))
        down = await scrape(daemon.metrics_url)
        async with answering_node(daemon):
            again = await scrape(daemon.metrics_url)
        text = await scrape_text(daemon.metrics_url)

    assert up[("iop_edge_node_connected", n1)] == 1
    assert up[("iop_edge_provider_up", far)] == 1
    assert up[("iop_edge_node_link_in_flight", n1)] == 1
    assert 0 < up[("iop_edge_node_link_rtt_seconds", n1)] < 15
    generation = daemon.node_statistics()[1].generation
    assert generation is not None
    info = (("agent_version", "test"), ("generation", generation), *n1)
    assert up[("iop_edge_node_info", info)] == 1
    sent, received = (
        up[("iop_edge_node_link_bytes_total", (("direction", d), *n1))]
        for d in ("sent", "received")
    )
    assert sent > 0
    assert received > 0
    refused = (("reason", "invalid_node_token"),)
    assert up[("iop_edge_node_link_refused_total", refused)] == 1

    assert down[("iop_edge_node_connected", n1)] == 0
    assert down[("iop_edge_provider_up", far)] == 0
    assert down[("iop_edge_node_link_in_flight", n1)] == 0
    assert down[("iop_edge_node_link_bytes_total", (("direction", "sent"), *n1))] >= sent
    assert not any(name == "iop_edge_node_info" for name, _ in down)
    assert again[("iop_edge_node_connected", n1)] == 1
    assert again[("iop_edge_node_reconnects_total", n1)] == 1
    assert TOKENS[REMOTE_NODE] not in text

"""Provider ejection and recovery (SPEC §5.1, issue 12), end to end: a dead provider under
load, probes (on the fake clock and on the real one), the half-open trial of a cli provider,
panic, and live refresh of the health settings. The pieces shared with ``test_failover.py``
are in ``tests/helpers/provider_group.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import Edge, dump, edge_on, wait_for
from tests.helpers.provider_group import (
    HTTP_FAULTS,
    PROBE_PATHS,
    START,
    Answer,
    admin_status,
    agent,
    all_released,
    chat,
    failovers,
    group_doc,
    http_provider,
    log_events,
    probed,
    provider,
    running,
    sample,
    sdk_for,
    sick_and_well,
)
from tests.helpers.upstreams import closed_port

# --- ejection under load, probes and recovery ------------------------------------------------


async def load(sdk: openai.AsyncOpenAI, requests: int, concurrency: int) -> list[str]:
    """Send ``requests`` chats, ``concurrency`` at a time; return every failure's text."""
    remaining = iter(range(requests))
    failures: list[str] = []

    async def worker() -> None:
        for index in remaining:
            try:
                answer = await chat(sdk, f"request {index}")
            except openai.APIError as exc:
                failures.append(repr(exc))
            else:
                if answer != Answer("well", f"request {index}"):
                    failures.append(repr(answer))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return failures


async def test_a_dead_provider_of_two_costs_no_client_a_failure_and_gets_only_probes(tmp_path):
    """Issue 12's done-when: one provider of two answers 503 to everything. 1,000 requests at
    concurrency 8 see 0 failures; the dead one is ejected after ``failure_threshold`` failed
    attempts plus at most what it already had in flight (capacity 8: 7 more), and from then on
    it gets health probes (which fail) but not one generation request."""
    async with (
        FakeOpenAI(behavior=FakeBehavior(status=503)) as dead,
        FakeOpenAI() as well_fake,
    ):
        dead.listing = FakeBehavior(status=503)
        doc = group_doc(
            http_provider("dead", "openai_compat", dead.base_url, capacity=8),
            http_provider("well", "openai_compat", well_fake.base_url, capacity=8),
            eject_ms=60000,
            probe_interval_ms=1000,
        )
        async with running(tmp_path, doc) as (edge, clock), sdk_for(edge) as sdk:
            failures = await load(sdk, 500, 8)
            ejected = provider(edge, "dead")
            received = dead.total_requests
            for probes in (1, 2, 3):
                clock.advance(1.0)
                await probed(edge, "dead", failed=probes)
            failures += await load(sdk, 500, 8)
            metrics = await edge.metrics()
            stats = await all_released(edge)
            dead_now = provider(edge, "dead")
        probes_seen = [r.path for r in dead.requests if r.method == "GET"]
    assert failures == []
    assert ejected.health == "unhealthy"
    assert (ejected.ejections, ejected.ejected_until) == (1, START + 60)
    assert 3 <= received <= 3 + 7
    assert dead.total_requests == received  # nothing after the ejection but probes
    assert probes_seen == ["/v1/models"] * 3
    assert (dead_now.health, dead_now.ejections, dead_now.probes_failed) == ("unhealthy", 1, 3)
    assert well_fake.total_requests == 1000
    assert failovers(metrics) == {"status_5xx": received}
    assert (stats.submitted, stats.failovers) == (1000, received)
    assert metrics[sample("iop_edge_provider_up", node="n1", provider="dead")] == 0
    assert metrics[sample("iop_edge_provider_ejections_total", node="n1", provider="dead")] == 1
    failed = sample("iop_edge_health_probes_total", node="n1", provider="dead", result="failed")
    assert metrics[failed] == 3


async def test_a_provider_ejected_while_down_is_recovered_by_a_probe_and_serves_again(
    tmp_path, log_stream
):
    """Nothing listens on the sick provider's port: two refused attempts eject it (threshold 2)
    for 10 s; a probe while it is down fails; started again on the same port, the next probe
    (one ``probe_interval_ms`` later, well within ``eject_ms + probe_interval_ms``) makes it
    healthy and it serves the next request. The log has the ejection and the recovery."""
    port = closed_port()
    async with FakeOpenAI() as well_fake:
        doc = group_doc(
            http_provider("sick", "openai_compat", f"http://127.0.0.1:{port}/v1"),
            http_provider("well", "openai_compat", well_fake.base_url, priority=1),
            failure_threshold=2,
            probe_interval_ms=2000,
        )
        async with running(tmp_path, doc) as (edge, clock), sdk_for(edge) as sdk:
            for _ in range(2):
                assert (await chat(sdk, "while down")).provider == "well"
            ejected = provider(edge, "sick")
            assert (await chat(sdk, "ejected")).provider == "well"  # not even tried
            down_status = await admin_status(edge)
            clock.advance(2.0)
            await probed(edge, "sick", failed=1)
            async with FakeOpenAI(port=port) as back:
                clock.advance(2.0)
                await wait_for(lambda: provider(edge, "sick").health == "healthy")
                recovered = provider(edge, "sick")
                answer = await chat(sdk, "back again")
                metrics = await edge.metrics()
                await all_released(edge)
            assert back.total_requests == 1
            assert [r.path for r in back.requests] == ["/v1/models", "/v1/chat/completions"]
    assert (ejected.health, ejected.consecutive_failures) == ("unhealthy", 2)
    assert ejected.ejected_until == START + 10
    [sick_status] = [p for p in down_status["providers"] if p["id"] == "sick"]
    assert sick_status["health"] == "unhealthy"
    assert sick_status["consecutive_failures"] == 2
    assert "cannot connect" in sick_status["last_failure"]
    assert sick_status["ejected_until"] is not None
    assert (recovered.ejected_until, recovered.probes_ok, recovered.probes_failed) == (None, 1, 1)
    assert answer == Answer("sick", "back again")
    assert metrics[sample("iop_edge_provider_up", node="n1", provider="sick")] == 1
    for result, count in (("ok", 1), ("failed", 1)):
        key = sample("iop_edge_health_probes_total", node="n1", provider="sick", result=result)
        assert metrics[key] == count
    [ejection] = log_events(log_stream, "provider_ejected")
    assert (ejection["node"], ejection["provider"]) == ("n1", "sick")
    assert (ejection["consecutive_failures"], ejection["ejected_for_s"]) == (2, 10.0)
    assert "cannot connect" in ejection["reason"]
    [recovery] = log_events(log_stream, "provider_recovered")
    assert (recovery["provider"], recovery["via"]) == ("sick", "probe")


async def test_probes_run_on_the_real_clock_too(tmp_path):
    """The same recovery on the daemon's real clock (no FakeClock): the probe timer is armed
    on the event loop and fires by itself (``probe_interval_ms`` 50: the wait is a bound)."""
    async with sick_and_well("openai_compat", HTTP_FAULTS["503"]) as (sick, well, sick_fake, _):
        assert sick_fake is not None
        doc = group_doc(sick, well, failure_threshold=1, eject_ms=60000, probe_interval_ms=50)
        async with edge_on(tmp_path, doc, watch=False) as edge, sdk_for(edge) as sdk:
            assert (await chat(sdk, "hello")).provider == "well"
            sick_fake.behavior = FakeBehavior()
            await wait_for(lambda: provider(edge, "sick").health == "healthy")
            assert (await chat(sdk, "again")).provider == "sick"
            await all_released(edge)
    # The probe that recovered it (then idle probes, every 50 ms while it has no traffic).
    assert {r.path for r in sick_fake.requests if r.method == "GET"} == {"/v1/models"}


@pytest.mark.parametrize("kind", ["openai_compat", "ollama"])
async def test_a_probe_carries_the_providers_headers_and_fails_on_an_error_status(tmp_path, kind):
    """SPEC §5.1: a probe is ``GET`` of the type's health path with the provider's configured
    ``headers``; a probe answered 503 by a server that is up fails (still ejected), the next
    one answered 200 recovers the provider."""
    headers = {"x-edge-probe": "from-config", "Authorization": "Bearer sk-upstream"}
    async with sick_and_well(kind, HTTP_FAULTS["503"]) as (sick, well, sick_fake, _):
        assert sick_fake is not None
        sick_fake.listing = FakeBehavior(status=503)
        doc = group_doc(
            {**sick, "headers": headers}, well, failure_threshold=1, probe_interval_ms=500
        )
        async with running(tmp_path, doc) as (edge, clock), sdk_for(edge) as sdk:
            assert (await chat(sdk, "hello")).provider == "well"
            assert provider(edge, "sick").health == "unhealthy"
            clock.advance(0.5)
            await probed(edge, "sick", failed=1)
            assert provider(edge, "sick").health == "unhealthy"
            sick_fake.listing = FakeBehavior()
            clock.advance(0.5)
            await wait_for(lambda: provider(edge, "sick").health == "healthy")
            await all_released(edge)
        probes = [r for r in sick_fake.requests if r.method == "GET"]
    assert [r.path for r in probes] == [PROBE_PATHS[kind]] * 2
    for probe in probes:
        assert probe.headers["x-edge-probe"] == "from-config"
        assert probe.headers["Authorization"] == "Bearer sk-upstream"


async def test_an_ejected_cli_provider_gets_one_half_open_trial_after_eject_ms(
    tmp_path, log_stream
):
    """A cli provider has no health check: when its ejection ends it is half-open and the next
    request is its trial. A failed trial ejects it again for twice as long; a successful one
    makes it healthy at once. (Its ``retry_on`` lets an exit before any output fail over.)"""
    failing = "[[fake-cli: --exit-code 3 --stderr boom]] hello"
    async with FakeOpenAI() as well_fake:
        doc = group_doc(
            agent("sick", retry_on=["connect", "5xx"]),
            http_provider("well", "openai_compat", well_fake.base_url, priority=1),
            failure_threshold=2,
            eject_ms=5000,
        )
        async with running(tmp_path, doc) as (edge, clock), sdk_for(edge) as sdk:
            for _ in range(2):
                assert (await chat(sdk, failing)).provider == "well"
            first = provider(edge, "sick")
            assert (await chat(sdk, "ejected")).provider == "well"
            clock.advance(5.0)
            half_open = provider(edge, "sick")
            assert (await chat(sdk, failing)).provider == "well"  # the trial fails over
            again = provider(edge, "sick")
            clock.advance(10.0)
            answer = await chat(sdk, "trial")
            healed = provider(edge, "sick")
            await all_released(edge)
    assert (first.health, first.ejected_until) == ("unhealthy", START + 5)
    assert (half_open.health, half_open.half_open, half_open.ejected_until) == (
        "unhealthy",
        True,
        None,
    )
    assert (again.half_open, again.ejected_until, again.ejections) == (False, START + 5 + 10, 2)
    assert answer == Answer("sick", "trial")
    assert (healed.health, healed.consecutive_failures, healed.half_open) == ("healthy", 0, False)
    assert [e["ejected_for_s"] for e in log_events(log_stream, "provider_ejected")] == [5.0, 10.0]
    assert len(log_events(log_stream, "provider_half_open")) == 2
    [recovery] = log_events(log_stream, "provider_recovered")
    assert (recovery["provider"], recovery["via"]) == ("sick", "trial")


async def test_a_group_whose_providers_are_all_ejected_panics_and_still_serves_them(
    tmp_path, log_stream
):
    """SPEC §5.1 panic: both providers fail twice (threshold 2) and are ejected; the group
    ignores health rather than lock the model out — requests still go to them (the client gets
    the upstream's error, not ``no_available_provider``) — and status and metrics show it.
    One recovering ends the panic. The model's /v1/completions and /v1/embeddings groups share
    its providers and panic with it, but one outage is one report: one log line each way, one
    ``iop_edge_model_panic`` series (so one alert), under the model."""
    async with (
        FakeOpenAI(behavior=FakeBehavior(status=503, error_code="overloaded")) as a_fake,
        FakeOpenAI(behavior=FakeBehavior(status=503, error_code="overloaded")) as b_fake,
    ):
        doc = group_doc(
            http_provider("a", "openai_compat", a_fake.base_url),
            http_provider("b", "openai_compat", b_fake.base_url, priority=1),
            failure_threshold=2,
        )
        async with running(tmp_path, doc) as (edge, clock), sdk_for(edge) as sdk:
            for _ in range(2):
                with pytest.raises(openai.InternalServerError):
                    await chat(sdk, "hello")
            status = await admin_status(edge)
            metrics = await edge.metrics()
            before = (a_fake.total_requests, b_fake.total_requests)
            with pytest.raises(openai.InternalServerError) as caught:
                await chat(sdk, "in panic")
            during = (a_fake.total_requests, b_fake.total_requests)
            clock.advance(2.0)  # the first probes: both fakes list their models
            await wait_for(lambda: provider(edge, "a").health == "healthy")
            await wait_for(lambda: provider(edge, "b").health == "healthy")
            after = await admin_status(edge)
            metrics_after = await edge.metrics()
            await all_released(edge)
    # Both providers are passthrough, so the /v1/completions and /v1/embeddings groups of m
    # panic with it.
    groups = {"m": None, "m[completions]": "m", "m[embeddings]": "m"}
    assert [p["health"] for p in status["providers"]] == ["unhealthy", "unhealthy"]
    assert status["models"] == [
        {"id": g, "providers": 2, "panic": True, "derived_from": d} for g, d in groups.items()
    ]
    assert panic_series(metrics) == {"m": 1}
    assert before == (2, 2)
    assert (caught.value.status_code, caught.value.code) == (503, "overloaded")
    assert during == (3, 3)  # both tried, as if health were off
    assert [m["panic"] for m in after["models"]] == [False] * 3
    assert panic_series(metrics_after) == {"m": 0}
    assert [e["model"] for e in log_events(log_stream, "model_panic")] == ["m"]
    assert [e["model"] for e in log_events(log_stream, "model_panic_over")] == ["m"]


def panic_series(metrics: dict[str, float]) -> dict[str, float]:
    """``iop_edge_model_panic`` by model: every series there is."""
    prefix = "iop_edge_model_panic[('model', '"
    return {k[len(prefix) : -3]: v for k, v in metrics.items() if k.startswith(prefix)}


# --- live refresh ----------------------------------------------------------------------------


async def refresh(edge: Edge, doc: dict[str, Any]) -> None:
    """Save ``doc`` as the config file and have the daemon apply it (the admin API)."""
    edge.path.write_text(dump(doc))
    async with (
        aiohttp.ClientSession() as session,
        session.post(edge.daemon.console_url + "/admin/config/refresh?mode=apply") as response,
    ):
        assert response.status == 200
    record = await edge.next_record()
    assert record.result.result == "applied", record.result


async def test_failover_and_health_settings_change_live(tmp_path):
    """``provider_pool.failover.*`` and ``provider_pool.health.*`` are live (SPEC §5.1):
    ``max_attempts: 1`` turns failover off for the next request, and a lower
    ``failure_threshold`` ejects at the next failure the provider that already has that many."""
    async with sick_and_well("openai_compat", HTTP_FAULTS["503"]) as (sick, well, _, _):
        doc = group_doc(sick, well, failure_threshold=5)
        async with running(tmp_path, doc) as (edge, _), sdk_for(edge) as sdk:
            assert (await chat(sdk, "one")).provider == "well"
            doc["provider_pool"]["failover"]["max_attempts"] = 1
            await refresh(edge, doc)
            with pytest.raises(openai.InternalServerError):
                await chat(sdk, "two")
            doc["provider_pool"]["failover"]["max_attempts"] = 2
            doc["provider_pool"]["health"]["failure_threshold"] = 3
            await refresh(edge, doc)
            assert provider(edge, "sick").health == "unknown"  # two failures, no new verdict
            assert (await chat(sdk, "three")).provider == "well"
            ejected = provider(edge, "sick")
            await all_released(edge)
    assert (ejected.health, ejected.consecutive_failures, ejected.ejections) == ("unhealthy", 3, 1)


async def test_a_live_refresh_keeps_health_and_a_re_enabled_provider_starts_unknown(tmp_path):
    """SPEC §4 and §5.1: a live change (a capacity) keeps the ejected provider ejected, until
    the same time; disabling it shows ``disabled``, and enabling it again starts it
    ``unknown``, with no failure remembered — and it gets requests again."""
    async with sick_and_well("openai_compat", HTTP_FAULTS["503"]) as (sick, well, sick_fake, _):
        assert sick_fake is not None
        doc = group_doc(sick, well, failure_threshold=1)
        async with running(tmp_path, doc) as (edge, _), sdk_for(edge) as sdk:
            assert (await chat(sdk, "hello")).provider == "well"
            ejected = provider(edge, "sick")
            doc["nodes"][0]["providers"][0]["capacity"] = 3
            await refresh(edge, doc)
            kept = provider(edge, "sick")
            doc["nodes"][0]["providers"][0]["enabled"] = False
            await refresh(edge, doc)
            disabled = provider(edge, "sick")
            doc["nodes"][0]["providers"][0]["enabled"] = True
            await refresh(edge, doc)
            [enabled] = [p for p in (await admin_status(edge))["providers"] if p["id"] == "sick"]
            sick_fake.behavior = FakeBehavior()
            answer = await chat(sdk, "again")
            await all_released(edge)
    assert (ejected.health, ejected.ejected_until) == ("unhealthy", START + 10)
    assert (kept.capacity, kept.health, kept.ejected_until) == (3, "unhealthy", START + 10)
    assert kept.consecutive_failures == 1
    assert (disabled.status, disabled.health) == ("disabled", "disabled")
    assert (enabled["health"], enabled["consecutive_failures"], enabled["ejected_until"]) == (
        "unknown",
        0,
        None,
    )
    assert enabled["last_failure"] is None
    assert answer == Answer("sick", "again")

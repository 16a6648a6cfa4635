"""Health probes end to end (SPEC §5.1, issue 25), as an operator sees them: a daemon on a fake
clock, real upstreams on 127.0.0.1 (a closed port is a dead one), the ``openai`` SDK.

- Idle providers are probed: a dead provider nobody sends a request to is ejected by its
  failed probes before a request reaches it, a live one shows healthy, and the probes stop
  while requests flow.
- A provider whose probes pass while its requests fail is no longer let back by its probes:
  each ejection, twice as long as the one before, runs to its end, and the log says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import Edge, wait_for
from tests.helpers.provider_group import (
    admin_status,
    agent,
    all_released,
    chat,
    group_doc,
    http_provider,
    log_events,
    provider,
    running,
    sample,
    sdk_for,
)
from tests.helpers.upstreams import closed_port


def probed(edge: Edge, pid: str, *, ok: int, failed: int) -> Callable[[], bool]:
    """Whether provider ``pid`` has had exactly ``ok`` passed and ``failed`` failed probes."""

    def done() -> bool:
        shown = provider(edge, pid)
        return (shown.probes_ok, shown.probes_failed) == (ok, failed)

    return done


def probes(fake: FakeOpenAI) -> int:
    """The health checks ``fake`` has answered."""
    return sum(1 for r in fake.requests if r.method == "GET")


async def test_a_dead_idle_provider_is_ejected_before_any_request_and_a_live_one_is_healthy(
    tmp_path, log_stream
):
    """No request at all: every 2 s (``probe_interval_ms``) each provider with a health check
    is probed. The dead one (nothing listens on its port) fails three probes and is ejected;
    the live one is healthy; the cli provider (no health check) is never probed. Then, while a
    request runs on the live one and until 2 s after it ended, the live one is not probed."""
    async with FakeOpenAI() as live_fake:
        dead_url = f"http://127.0.0.1:{closed_port()}/v1"
        doc = group_doc(
            http_provider("dead", "openai_compat", dead_url),
            http_provider("live", "openai_compat", live_fake.base_url, priority=1),
            agent("cli", priority=2),
        )
        async with running(tmp_path, doc) as (edge, clock), sdk_for(edge) as sdk:
            assert [provider(edge, p).health for p in ("dead", "live", "cli")] == ["unknown"] * 3
            for failed in (1, 2, 3):
                clock.advance(2.0)
                await wait_for(probed(edge, "dead", ok=0, failed=failed))
                await wait_for(probed(edge, "live", ok=failed, failed=0))
            dead, live, cli = (provider(edge, p) for p in ("dead", "live", "cli"))
            metrics = await edge.metrics()
            assert live_fake.total_requests == 0  # no request reached anyone
            # Traffic on live: not probed while its request runs, nor 2 s after it ended.
            live_fake.enqueue(FakeBehavior(hold=True))
            holding = asyncio.create_task(chat(sdk, "a long answer"))
            await live_fake.wait_in_flight(1)
            before = probes(live_fake)
            for _ in range(3):
                clock.advance(2.0)
            live_fake.release()
            assert (await holding).provider == "live"
            clock.advance(1.999)
            quiet = probes(live_fake)
            clock.advance(0.001)
            await wait_for(lambda: probes(live_fake) == before + 1)
            await all_released(edge)
    assert (dead.health, dead.ejected_until, dead.consecutive_failures) == (
        "unhealthy",
        1000.0 + 6 + 10,
        3,
    )
    assert "cannot connect" in (dead.last_failure or "")
    assert (live.health, live.probes_failed) == ("healthy", 0)
    assert (cli.health, cli.probes_ok, cli.probes_failed) == ("unknown", 0, 0)
    assert metrics[sample("iop_edge_provider_up", node="n1", provider="dead")] == 0
    assert metrics[sample("iop_edge_provider_up", node="n1", provider="live")] == 1
    [ejected] = log_events(log_stream, "provider_ejected")
    assert (ejected["provider"], ejected["consecutive_failures"]) == ("dead", 3)
    assert "cannot connect" in ejected["reason"]
    assert quiet == before  # nothing while it served, nor in the 2 s after
    assert live_fake.total_requests == 1


async def test_a_provider_whose_probes_pass_but_requests_fail_stays_out_for_each_whole_ejection(
    tmp_path, log_stream
):
    """Its health check answers, its chat requests get 503. A probe ends the first ejection;
    three failed requests eject it again — from then on probes no longer end its ejections:
    20 s, all of it (probes keep passing), then one trial request; it fails, 40 s. The log and
    the status say so."""
    async with FakeOpenAI(behavior=FakeBehavior(status=503)) as sick, FakeOpenAI() as well:
        doc = group_doc(
            http_provider("sick", "openai_compat", sick.base_url),
            http_provider("well", "openai_compat", well.base_url, priority=1),
        )
        async with running(tmp_path, doc) as (edge, clock), sdk_for(edge) as sdk:
            for _ in range(3):  # each fails over to well
                assert (await chat(sdk, "hello")).provider == "well"
            clock.advance(2.0)  # the first ejection's first probe passes
            await wait_for(lambda: provider(edge, "sick").health == "healthy")
            for _ in range(3):
                assert (await chat(sdk, "again")).provider == "well"
            second = provider(edge, "sick")
            status = await admin_status(edge)
            for n in range(9):  # up to 2 s before its end: nine probes, each passed
                clock.advance(2.0)
                await wait_for(probed(edge, "sick", ok=2 + n, failed=0))
            assert (await chat(sdk, "still out")).provider == "well"
            kept_out = provider(edge, "sick")
            clock.advance(2.0)  # the end: half-open, the next request is the trial
            assert (await chat(sdk, "the trial")).provider == "well"  # it failed over
            third = provider(edge, "sick")
            await all_released(edge)
    assert (second.ejected_until, second.probes_trusted) == (1000.0 + 2 + 20, False)
    [shown] = [p for p in status["providers"] if p["id"] == "sick"]
    assert shown["probes_trusted"] is False
    assert (kept_out.health, kept_out.ejected_until) == ("unhealthy", 1022.0)
    assert kept_out.probes_ok == 1 + 9
    assert (third.ejected_until, third.probes_trusted) == (1022.0 + 40, False)
    lines = log_events(log_stream, "provider_ejected")
    assert [(e["ejected_for_s"], e["probes_trusted"]) for e in lines] == [
        (10.0, True),
        (20.0, False),
        (40.0, False),
    ]
    assert lines[0]["message"] == "ejected for up to 10 s: a passing health check ends it early"
    assert lines[1]["message"] == (
        "probes pass but requests fail: ejected for the full 20 s, then one trial request"
    )
    assert [e["via"] for e in log_events(log_stream, "provider_recovered")] == ["probe"]


async def test_a_provider_without_a_health_check_says_so_when_ejected(tmp_path, log_stream):
    """``no health check``: its ejection runs its full length, then one trial request."""
    failing = "[[fake-cli: --exit-code 3 --stderr boom]] hello"
    async with FakeOpenAI() as well:
        doc = group_doc(
            agent("sick", retry_on=["connect", "5xx"]),
            http_provider("well", "openai_compat", well.base_url, priority=1),
        )
        async with running(tmp_path, doc) as (edge, _), sdk_for(edge) as sdk:
            for _ in range(3):
                assert (await chat(sdk, failing)).provider == "well"
            await all_released(edge)
    [line] = log_events(log_stream, "provider_ejected")
    assert line["probes_trusted"] is None
    assert line["message"] == "no health check: ejected for the full 10 s, then one trial request"

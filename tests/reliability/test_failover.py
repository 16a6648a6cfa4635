"""Provider failover (SPEC §5.1, issue 12), end to end, as a client and an operator see it:
the ``openai`` SDK against a real daemon on 127.0.0.1, fake upstreams on real sockets and the
fake agent as a real subprocess. Each fault that counts as a provider failure fails over before
the first byte, through each adapter, streaming and not; what is not retried is returned as it
is. The pieces shared with ``test_ejection.py`` are in ``tests/helpers/provider_group.py``; every test ends by
checking that each lease was released exactly once.
"""

# ruff: noqa: E501 - the fault table reads best one row per line

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import openai
import pytest

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import pass_deadline, wait_for
from tests.helpers.provider_group import (
    CLI_FAULTS,
    HTTP_FAULTS,
    SHORT_MS,
    START,
    Answer,
    Fault,
    all_released,
    chat,
    failovers,
    group_doc,
    http_provider,
    log_events,
    provider,
    running,
    sample,
    sdk_for,
    sick_and_well,
)

# --- each fault fails over before the first byte ---------------------------------------------


FAULT_ROWS = [
    pytest.param(kind, name, fault, stream, id=f"{kind}-{name}{'-stream' if stream else ''}")
    for kind, faults in (("openai_compat", HTTP_FAULTS), ("ollama", HTTP_FAULTS), ("cli", CLI_FAULTS))
    for name, fault in faults.items()
    for stream in (False, True)
]  # fmt: skip


@pytest.mark.parametrize(("kind", "name", "fault", "stream"), FAULT_ROWS)
async def test_a_provider_failure_before_the_first_byte_fails_over_to_a_healthy_provider(
    tmp_path, log_stream, kind, name, fault, stream
):
    """SPEC §5.1 failover: the row's fault on the provider tried first, with a healthy second
    provider and ``max_attempts: 2`` — the client gets the healthy provider's answer; the
    failure counts toward the sick provider's health (a 429 only holds it out, for its
    ``Retry-After``); ``iop_edge_failovers_total`` counts the row's reason; the request's log
    line names the failed attempt."""
    async with sick_and_well(kind, fault) as (sick, well, sick_fake, well_fake):
        async with running(tmp_path, group_doc(sick, well)) as (edge, clock), sdk_for(edge) as sdk:
            deadline = None
            if fault.reason == "timeout":  # the sick one's request_timeout_ms, on the fake clock
                arrived = lambda: sick_fake is None or sick_fake.total_requests == 1  # noqa: E731
                due = START + SHORT_MS / 1000
                deadline = asyncio.create_task(pass_deadline(clock, due, arrived))
            answer = await chat(sdk, "hello edge", stream=stream)
            if deadline is not None:
                await deadline  # the sick attempt failed at its deadline, not before
            metrics = await edge.metrics()
            stats = await all_released(edge)
            health = provider(edge, "sick")
            assert provider(edge, "well").health == "healthy"
        if sick_fake is not None and well_fake is not None:
            assert sick_fake.total_requests == (0 if fault.refused else 1)
            assert well_fake.total_requests == 1
    assert answer == Answer("well", "hello edge")
    assert failovers(metrics) == {fault.reason: 1}
    errors = sample(
        "iop_edge_upstream_errors_total", node="n1", provider="sick", **fault.error_labels
    )
    assert metrics[errors] == 1
    assert (stats.submitted, stats.admitted, stats.failovers) == (1, 2, 1)
    assert health.health == "unknown"  # one failure of three: not ejected
    assert health.ejected_until is None
    assert health.last_failure
    if fault.reason == "status_429":
        assert "429" in health.last_failure
        assert health.consecutive_failures == 0  # a 429 does not count toward ejection
        assert health.held_until == (START + 7 if fault.behavior.retry_after else None)
    else:
        assert health.consecutive_failures == 1
        assert health.held_until is None
    [line] = log_events(log_stream, "request")
    assert (line["status"], line["provider"], line["attempts"]) == (200, "well", 2)
    assert line["failed_over"] == [f"n1/sick: {fault.reason}"]


async def test_a_provider_held_by_a_429_gets_no_request_until_its_retry_after_ends(
    tmp_path, log_stream
):
    """A 429 with ``Retry-After: 7`` holds the provider out for exactly 7 s (not an ejection:
    ``iop_edge_provider_up`` stays 1), then it serves again."""
    async with (
        FakeOpenAI(behavior=FakeBehavior(status=429, retry_after="7")) as sick_fake,
        FakeOpenAI() as well_fake,
    ):
        doc = group_doc(
            http_provider("sick", "openai_compat", sick_fake.base_url),
            http_provider("well", "openai_compat", well_fake.base_url, priority=1),
        )
        async with running(tmp_path, doc) as (edge, clock), sdk_for(edge) as sdk:
            assert (await chat(sdk, "one")).provider == "well"
            assert (await chat(sdk, "two")).provider == "well"  # held: not tried
            assert sick_fake.total_requests == 1
            metrics = await edge.metrics()
            sick_fake.behavior = FakeBehavior()
            clock.advance(6.999)
            assert (await chat(sdk, "three")).provider == "well"
            clock.advance(0.001)
            assert provider(edge, "sick").held_until is None
            assert (await chat(sdk, "four")).provider == "sick"
            await all_released(edge)
    assert metrics[sample("iop_edge_provider_up", node="n1", provider="sick")] == 1
    [held] = log_events(log_stream, "provider_held")
    assert (held["provider"], held["held_for_s"]) == ("sick", 7.0)
    assert "429" in held["reason"]


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_legacy_completions_fail_over_like_chat(tmp_path, stream):
    """``POST /v1/completions`` (the passthrough providers of ``m``) fails over the same way."""
    async with (
        sick_and_well("openai_compat", HTTP_FAULTS["503"]) as (sick, well, _, well_fake),
        running(tmp_path, group_doc(sick, well)) as (edge, _),
        sdk_for(edge) as sdk,
    ):
        if stream:
            raw_stream = await sdk.completions.with_raw_response.create(
                model="m", prompt="hello edge", stream=True
            )
            chunks = raw_stream.parse()
            text = "".join([c.choices[0].text async for c in chunks if c.choices])
            answer = Answer(raw_stream.headers.get("x-iop-provider"), text)
        else:
            raw = await sdk.completions.with_raw_response.create(model="m", prompt="hello edge")
            answer = Answer(raw.headers.get("x-iop-provider"), raw.parse().choices[0].text)
        metrics = await edge.metrics()
        await all_released(edge)
        assert provider(edge, "sick").consecutive_failures == 1
    assert well_fake is not None
    assert [r.path for r in well_fake.requests] == ["/v1/completions"]
    assert answer == Answer("well", "hello edge")
    assert failovers(metrics) == {"status_5xx": 1}


# --- what is not retried ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_a_4xx_of_the_upstream_is_returned_as_is_and_counts_as_an_answer(tmp_path, stream):
    """SPEC §5.1: a 400 is the client's fault — returned with its status and code, never
    retried, and the provider that said it is healthy."""
    async with sick_and_well("openai_compat") as (sick, well, sick_fake, well_fake):
        assert sick_fake is not None
        assert well_fake is not None
        sick_fake.behavior = FakeBehavior(status=400, error_code="bad_field")
        async with running(tmp_path, group_doc(sick, well)) as (edge, _), sdk_for(edge) as sdk:
            with pytest.raises(openai.BadRequestError) as caught:
                await chat(sdk, "hello", stream=stream)
            metrics = await edge.metrics()
            stats = await all_released(edge)
            health = provider(edge, "sick")
        assert (sick_fake.total_requests, well_fake.total_requests) == (1, 0)
    assert caught.value.code == "bad_field"
    assert caught.value.response.headers["x-iop-provider"] == "sick"
    assert (health.health, health.consecutive_failures) == ("healthy", 0)
    assert failovers(metrics) == {}
    assert (stats.admitted, stats.failovers) == (1, 0)


MID_STREAM = [
    pytest.param("openai_compat", Fault("protocol", FakeBehavior(fault="reset", fault_after=2)), id="openai_compat-reset"),
    pytest.param("openai_compat", Fault("protocol", FakeBehavior(fault="error", fault_after=2)), id="openai_compat-error-event"),
    pytest.param("ollama", Fault("protocol", FakeBehavior(fault="reset", fault_after=2)), id="ollama-reset"),
    pytest.param("cli", Fault("exit", options=("--answer-then-exit", "--exit-code", "3")), id="cli-exit-after-output"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "fault"), MID_STREAM)
async def test_a_fault_after_the_first_chunk_ends_the_stream_without_failover(
    tmp_path, kind, fault
):
    """SPEC §5.1: after the client's first byte there is no failover — the stream ends with
    the error event as before — and the failure still counts toward the provider's health."""
    async with sick_and_well(kind, fault) as (sick, well, _, well_fake):
        async with running(tmp_path, group_doc(sick, well)) as (edge, _), sdk_for(edge) as sdk:
            with pytest.raises(openai.APIError) as caught:
                await chat(sdk, "one two three four", stream=True)
            metrics = await edge.metrics()
            stats = await all_released(edge)
            health = provider(edge, "sick")
            assert provider(edge, "well").health == "unknown"  # never asked
        if well_fake is not None:
            assert well_fake.total_requests == 0
    assert not isinstance(caught.value, openai.APIStatusError)  # an event, after a 200
    assert health.consecutive_failures == 1
    assert failovers(metrics) == {}
    assert (stats.admitted, stats.failovers) == (1, 0)


async def test_max_attempts_1_turns_failover_off(tmp_path):
    """``failover.max_attempts: 1``: the upstream's 503 reaches the client; the healthy
    provider is never asked."""
    async with sick_and_well("openai_compat", HTTP_FAULTS["503"]) as (sick, well, sick_fake, well_fake):  # fmt: skip
        assert sick_fake is not None
        assert well_fake is not None
        doc = group_doc(sick, well, max_attempts=1)
        async with running(tmp_path, doc) as (edge, _), sdk_for(edge) as sdk:
            with pytest.raises(openai.InternalServerError) as caught:
                await chat(sdk, "hello")
            metrics = await edge.metrics()
            stats = await all_released(edge)
            health = provider(edge, "sick")
        assert (sick_fake.total_requests, well_fake.total_requests) == (1, 0)
    assert caught.value.status_code == 503
    assert caught.value.response.headers["x-iop-provider"] == "sick"
    assert health.consecutive_failures == 1
    assert failovers(metrics) == {}
    assert stats.failovers == 0


async def test_an_upstream_429_reaches_the_client_with_its_retry_after(tmp_path):
    """With no other provider to try, the upstream's 429 is the answer, and its
    ``Retry-After`` (whole seconds, rounded up) goes with it."""
    async with sick_and_well("openai_compat", HTTP_FAULTS["429-retry-after"]) as (sick, well, *_):
        doc = group_doc(sick, well, max_attempts=1)
        async with running(tmp_path, doc) as (edge, _), sdk_for(edge) as sdk:
            with pytest.raises(openai.RateLimitError) as caught:
                await chat(sdk, "hello")
            await all_released(edge)
    assert caught.value.response.headers["Retry-After"] == "7"
    assert caught.value.response.headers["x-iop-provider"] == "sick"


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_with_no_untried_provider_left_the_last_upstream_error_is_returned(tmp_path, stream):
    """Both providers fail (``max_attempts: 3``, two providers): after the second there is no
    untried candidate, and the client gets the second's error as it was."""
    async with (
        FakeOpenAI(behavior=FakeBehavior(status=503, error_code="first")) as first,
        FakeOpenAI(behavior=FakeBehavior(status=502, error_code="second")) as second,
    ):
        doc = group_doc(
            http_provider("a", "openai_compat", first.base_url),
            http_provider("b", "openai_compat", second.base_url, priority=1),
            max_attempts=3,
        )
        async with running(tmp_path, doc) as (edge, _), sdk_for(edge) as sdk:
            with pytest.raises(openai.APIStatusError) as caught:
                await chat(sdk, "hello", stream=stream)
            metrics = await edge.metrics()
            stats = await all_released(edge)
            failures = [provider(edge, p).consecutive_failures for p in ("a", "b")]
        assert (first.total_requests, second.total_requests) == (1, 1)
    assert (caught.value.status_code, caught.value.code) == (502, "second")
    assert caught.value.response.headers["x-iop-provider"] == "b"
    assert failures == [1, 1]
    assert failovers(metrics) == {"status_5xx": 1}
    for pid, status in (("a", "503"), ("b", "502")):
        key = sample(
            "iop_edge_upstream_errors_total",
            node="n1",
            provider=pid,
            reason="status",
            status_code=status,
        )
        assert metrics[key] == 1
    assert (stats.admitted, stats.failovers) == (2, 1)


@pytest.mark.parametrize("end", ["queue-timeout", "client-gone"])
async def test_a_request_waiting_for_its_retry_keeps_its_arrival_time_and_can_leave(
    tmp_path, log_stream, end
):
    """The retry of a failed attempt waits for a slot like a queued request, but its
    ``queue_timeout_ms`` counts from when the client sent it (SPEC §5.1), not from the
    failure; a client that leaves while it waits takes it out of the queue. Either way every
    lease comes back exactly once, and the failed attempt is in the request's log line and
    the metrics."""
    async with FakeOpenAI() as well_fake, FakeOpenAI() as sick_fake:
        well_fake.enqueue(FakeBehavior(hold=True))
        sick_fake.behavior = FakeBehavior(hold=True, status=503)
        doc = group_doc(
            http_provider("well", "openai_compat", well_fake.base_url, capacity=1),
            http_provider("sick", "openai_compat", sick_fake.base_url, capacity=1, priority=1),
        )
        async with running(tmp_path, doc) as (edge, clock), sdk_for(edge) as sdk:
            scheduler = edge.daemon.scheduler
            holding = asyncio.create_task(chat(sdk, "holding the healthy slot"))
            await well_fake.wait_in_flight(1)
            retried = asyncio.create_task(chat(sdk, "arrives at START"))
            await sick_fake.wait_in_flight(1)
            clock.advance(10.0)
            sick_fake.release()  # its 503 comes 10 s after the request arrived
            await wait_for(lambda: scheduler.statistics().queue_depth == 1)
            if end == "queue-timeout":
                clock.advance(19.999)
                assert scheduler.statistics().queue_depth == 1
                clock.advance(0.001)
                with pytest.raises(openai.InternalServerError) as caught:
                    await retried
                assert (caught.value.status_code, caught.value.code) == (503, "queue_timeout")
            else:
                retried.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await retried
                await wait_for(lambda: scheduler.statistics().queue_depth == 0)
            well_fake.release()
            assert (await holding).provider == "well"
            stats = await all_released(edge)
            await wait_for(lambda: len(log_events(log_stream, "request")) == 2)
            metrics = await edge.metrics()
    rejected = "queue_timeout" if end == "queue-timeout" else "client_gone"
    assert stats.rejected[rejected] == 1
    assert (stats.submitted, stats.admitted, stats.failovers) == (2, 2, 1)
    assert well_fake.total_requests == 1
    [line] = [e for e in log_events(log_stream, "request") if e["code"] == rejected]
    assert (line["provider"], line["failed_over"]) == ("sick", ["n1/sick: status_5xx"])
    assert line["attempts"] == 1  # the retry never reached a provider
    assert failovers(metrics) == {"status_5xx": 1}
    errors = sample(
        "iop_edge_upstream_errors_total",
        node="n1",
        provider="sick",
        reason="status",
        status_code="503",
    )
    assert metrics[errors] == 1


# --- retry_on: what may run twice is not retried ----------------------------------------------


def side_effect_agent(pid: str, ran: Path, **fields: Any) -> dict[str, Any]:
    """A cli provider whose command does its work (appends its id to ``ran``), then exits 1
    before any output: a failure before the first byte, after the side effect."""
    return {
        "id": pid,
        "type": "cli",
        "category": "cli",
        "adapter": "shell",
        "command": "/bin/sh",
        "args": ["-c", f'echo {pid} >> "{ran}"; exit 1'],
        "models": ["fake-model"],
        **fields,
    }


@pytest.mark.parametrize("retry_on", [None, ["connect", "5xx"]], ids=["default", "connect-5xx"])
async def test_a_cli_failure_after_its_side_effect_runs_once_unless_retry_on_says_5xx(
    tmp_path, log_stream, retry_on
):
    """Issue 25: three cli providers, ``max_attempts: 3``, each command appends to a file and
    exits 1 before any output. By default (``retry_on: [connect]``) the side effect runs once
    and the client gets that provider's ``upstream_error``; with ``retry_on: [connect, 5xx]``
    the request fails over and the work runs on each provider."""
    ran = tmp_path / "ran.txt"
    fields = {} if retry_on is None else {"retry_on": retry_on}
    agents = [side_effect_agent(f"agent-{n}", ran, **fields) for n in range(3)]
    async with running(tmp_path, group_doc(*agents, max_attempts=3)) as (edge, _):
        async with sdk_for(edge) as sdk:
            with pytest.raises(openai.InternalServerError) as caught:
                await chat(sdk, "do it once")
        metrics = await edge.metrics()
        stats = await all_released(edge)
        failures = [provider(edge, a["id"]).consecutive_failures for a in agents]
    runs = ran.read_text().split()
    assert (caught.value.status_code, caught.value.code) == (502, "upstream_error")
    [line] = log_events(log_stream, "request")
    if retry_on is None:
        assert runs == ["agent-0"]
        assert failures == [1, 0, 0]  # not retried, still counted for its health
        assert (stats.admitted, stats.failovers, line["attempts"]) == (1, 0, 1)
        assert failovers(metrics) == {}
    else:
        assert sorted(runs) == ["agent-0", "agent-1", "agent-2"]
        assert failures == [1, 1, 1]
        assert (stats.admitted, stats.failovers, line["attempts"]) == (3, 2, 3)
        assert failovers(metrics) == {"exit": 2}

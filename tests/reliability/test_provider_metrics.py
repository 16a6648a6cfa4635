"""Per-provider metrics of upstream attempts (issue 15): one count and one duration per
attempt on the provider it ran on, failed-over attempts included, on the fake clock; a 4xx
answer is the request's fault, not the provider's."""

from __future__ import annotations

import asyncio

import openai
import pytest

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers.provider_group import (
    chat,
    group_doc,
    http_provider,
    running,
    sample,
    sdk_for,
)


def samples_of(metrics: dict[str, float], name: str) -> dict[str, float]:
    """The samples of one metric name in :meth:`Edge.metrics`, keyed as there."""
    return {k: v for k, v in metrics.items() if k == name or k.startswith(name + "[")}


async def test_each_upstream_attempt_is_counted_and_timed_on_its_provider(tmp_path):
    """One observation per upstream attempt, the failed-over one included: the sick
    provider's 503 after 2 s and the healthy provider's answer after 3 s, on the fake clock."""
    async with FakeOpenAI() as sick_fake, FakeOpenAI() as well_fake:
        sick_fake.behavior = FakeBehavior(hold=True, status=503)
        well_fake.behavior = FakeBehavior(hold=True)
        doc = group_doc(
            http_provider("sick", "openai_compat", sick_fake.base_url),
            http_provider("well", "openai_compat", well_fake.base_url, priority=1),
        )
        async with running(tmp_path, doc) as (edge, clock), sdk_for(edge) as sdk:
            answer = asyncio.create_task(chat(sdk, "two attempts"))
            await sick_fake.wait_in_flight(1)
            clock.advance(2.0)
            sick_fake.release()
            await well_fake.wait_in_flight(1)
            clock.advance(3.0)
            well_fake.release()
            assert (await answer).provider == "well"
            metrics = await edge.metrics()
    attempts = "iop_edge_provider_requests_total"
    assert samples_of(metrics, attempts) == {
        sample(attempts, node="n1", provider="sick", code="upstream_error"): 1,
        sample(attempts, node="n1", provider="well", code="ok"): 1,
    }
    duration = "iop_edge_provider_request_duration_seconds"
    assert metrics[sample(duration + "_sum", node="n1", provider="sick")] == 2.0
    assert metrics[sample(duration + "_sum", node="n1", provider="well")] == 3.0
    assert metrics[sample(duration + "_bucket", node="n1", provider="sick", le="1.0")] == 0
    assert metrics[sample(duration + "_bucket", node="n1", provider="sick", le="2.5")] == 1
    assert samples_of(metrics, "iop_edge_upstream_errors_total") == {
        sample(
            "iop_edge_upstream_errors_total",
            node="n1",
            provider="sick",
            reason="status",
            status_code="503",
        ): 1
    }
    assert metrics[sample("iop_edge_request_duration_seconds_sum", model="m")] == 5.0


async def test_a_4xx_answer_counts_as_the_clients_error_not_the_providers(tmp_path):
    """A provider answering 400 did its job: its attempt is ``client_error`` (not in the
    provider error rate), while the upstream-errors counter says what came back."""
    async with FakeOpenAI(behavior=FakeBehavior(status=400)) as fake:
        doc = group_doc(http_provider("picky", "openai_compat", fake.base_url))
        async with running(tmp_path, doc) as (edge, _), sdk_for(edge) as sdk:
            with pytest.raises(openai.BadRequestError):
                await chat(sdk, "bad")
            metrics = await edge.metrics()
    attempts = "iop_edge_provider_requests_total"
    assert samples_of(metrics, attempts) == {
        sample(attempts, node="n1", provider="picky", code="client_error"): 1
    }
    errors = "iop_edge_upstream_errors_total"
    assert samples_of(metrics, errors) == {
        sample(errors, node="n1", provider="picky", reason="status", status_code="400"): 1
    }

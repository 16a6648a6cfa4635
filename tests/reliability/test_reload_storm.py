"""Reload storm under load: live refreshes and rejected files while SDK clients keep asking.

The full-size storm (100 live refreshes, 20 rejected files) is ``bench/soak.py --storm``; the
suite runs the same scenario smaller.
"""

from __future__ import annotations

import json

import openai

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.reload_storm import (
    SteadyLoad,
    cli_status,
    expected_policy,
    run_reload_storm,
    status_matches,
    storm_plan,
    watched_edge,
)

WORKERS = 6


async def test_reload_storm_under_load_fails_no_request_and_ends_on_the_last_good_file(
    tmp_path, fake_oa, fake_ol, log_stream
):
    """24 live refreshes (capacity, priority, enabled toggles, max_queue, queue_timeout_ms) and
    6 rejected files — half through the file watcher, half through the admin API — while six
    SDK clients stream and ask without pause. The load is sized so that the policy never calls
    for a failure (see ``storm_states``): zero failed requests, every good file applied, every
    bad file rejected with errors that name a path, no slot or process leaked, and the final
    policy, config hash, ``/admin/status`` and ``iop-edge status`` equal the last good file
    (the storm ends on a bad one)."""
    # A little upstream latency keeps requests in flight (and queued) across each refresh.
    fake_oa.behavior = fake_ol.behavior = FakeBehavior(latency=0.002)
    steps = storm_plan(fake_oa.base_url, fake_ol.base_url, good=24, bad=6, workers=WORKERS)
    assert not steps[-1].good
    first = next(s for s in steps if s.good)
    async with watched_edge(tmp_path, {}, text=first.text) as edge:
        async with openai.AsyncOpenAI(
            base_url=edge.daemon.openai_url, api_key="x", max_retries=0
        ) as client:
            load = SteadyLoad(client, ["chat", "chat", "echo"], WORKERS)
            load.start()
            await load.progress(WORKERS)
            report = await run_reload_storm(edge, steps[1:], load)
        status = await cli_status(edge.daemon.console_url)
        last_good = [s for s in steps if s.good][-1]
        stats = edge.daemon.scheduler.statistics()

    assert report.request_failures == []
    assert report.misjudged == []
    assert (report.refreshes_applied, report.files_rejected) == (23, 6)
    assert report.unnamed_errors == []
    assert report.leaks == {}
    assert report.final_policy_matches
    assert report.final_hash_matches
    assert report.admin_status_matches
    assert status_matches(status, expected_policy(last_good.text))
    assert report.requests_ok >= len(steps)  # at least one request finished per step
    assert stats.rejected_total == 0
    # the queue was really exercised while policies were swapped under it
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    waited = [r for r in lines if r["event"] == "request" and (r["queue_wait_ms"] or 0) > 0]
    assert waited
    assert all(r["status"] == 200 for r in lines if r["event"] == "request")
    assert (stats.submitted, stats.released) == (stats.admitted, stats.admitted)

"""Bad configs: a Hypothesis fuzzer saves broken files to the watched config while requests flow.

Candidates are half unrelated mutated documents (``tests.strategies.mutated_docs``) and half
near misses of the running file (its own keys deleted, retyped, misspelt, duplicated, or the
text truncated or broken). The long run is ``bench/soak.py --fuzz N``.
"""

from __future__ import annotations

import openai

from iop_edge.testing.config_fuzz import fuzz_texts, run_config_fuzz
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.reload_storm import SteadyLoad, StormState, storm_doc, watched_edge
from tests.helpers import dump

BASE_STATE = StormState(
    capacity=(2, 2, 2), priority=(0, 1, 2), enabled=(True, True, True), max_queue=16,
    queue_timeout_ms=30000,
)  # fmt: skip


async def test_mutated_configs_never_crash_the_daemon_and_every_rejection_names_a_path(
    tmp_path, fake_oa, fake_ol
):
    """24 fuzzed files saved one after the other while four SDK clients keep asking: each is
    judged (rejected, or accepted and then reverted), every error of a rejection has a
    non-empty path or is a whole-document error (``FILE:LINE:COL: YAML syntax error``, an
    empty document), a rejection never changes the running config, no request fails, nothing
    leaks, and the daemon still answers at the end."""
    fake_oa.behavior = fake_ol.behavior = FakeBehavior(latency=0.001)
    base = storm_doc(fake_oa.base_url, fake_ol.base_url, BASE_STATE)
    texts = fuzz_texts(base, 24)
    assert len(texts) >= 20
    async with (
        watched_edge(tmp_path, base) as edge,
        openai.AsyncOpenAI(base_url=edge.daemon.openai_url, api_key="x", max_retries=0) as client,
    ):
        load = SteadyLoad(client, ["chat", "echo"], 4)
        load.start()
        await load.progress(4)
        report = await run_config_fuzz(edge, texts, load, restore=dump(base))

    assert report.candidates == len(texts)
    assert report.rejected >= len(texts) // 2  # every near miss at least
    assert report.unnamed_errors == []
    assert report.running_changed_on_rejection == 0
    assert report.request_failures == []
    assert report.leaks == {}
    assert report.still_serving

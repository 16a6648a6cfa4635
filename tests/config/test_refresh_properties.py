"""Properties of refresh classification over generated configs."""

from __future__ import annotations

from hypothesis import given

from iop_edge.config.refresh import RefreshResult, classify, refresh
from iop_edge.testing.strategies import edited_pairs, valid_docs
from tests.helpers.config import load


@given(valid_docs())
def test_classifying_a_config_against_itself_finds_nothing(doc):
    config = load(doc)
    assert classify(config, config).entries == []
    result = refresh(config, config, mode="apply").result
    assert (result.result, result.report, result.errors) == ("applied", [], [])


@given(edited_pairs())
def test_after_applying_the_live_part_only_restart_entries_remain(pair):
    before, after = (load(doc) for doc in pair)
    outcome = refresh(before, after, mode="apply")
    remaining = classify(outcome.running, after).entries
    if outcome.result.errors:  # the live part could not stand alone: nothing was applied
        assert outcome.running == before
        assert not any(e.applied for e in outcome.result.report)
    else:
        assert all(e.change_class == "restart" for e in remaining)
        restart_paths = {e.path for e in outcome.result.report if e.change_class == "restart"}
        assert {e.path for e in remaining} == restart_paths


@given(edited_pairs())
def test_the_result_json_round_trips(pair):
    before, after = (load(doc) for doc in pair)
    result = refresh(before, after, mode="apply").result
    assert RefreshResult.model_validate(result.to_json()) == result

"""``nodes[].providers[].first_token_timeout_ms`` / ``.stream_idle_timeout_ms`` (issue 25):
optional, positive, off when omitted, live on a refresh, and carried to the request path by the
catalog."""

from __future__ import annotations

import copy

import pytest
import yaml

from iop_edge.adapters import StreamBounds
from iop_edge.api.catalog import build_catalog
from iop_edge.config.refresh import refresh
from tests.helpers.config import base_doc, load, problem_at, provider

FIELDS = ("first_token_timeout_ms", "stream_idle_timeout_ms")


@pytest.mark.parametrize("field", FIELDS)
def test_omitted_is_off_and_a_positive_value_is_kept(field: str) -> None:
    assert getattr(load(base_doc()).nodes[0].providers[0], field) is None
    doc = base_doc()
    provider(doc)[field] = 1500
    assert getattr(load(doc).nodes[0].providers[0], field) == 1500


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", [0, -5, "10s", 1.5])
def test_a_bad_value_is_refused_naming_the_path(field: str, value: object) -> None:
    doc = base_doc()
    provider(doc)[field] = value
    assert problem_at(doc, f"nodes[gpu-1].providers[vllm-a].{field}")


@pytest.mark.parametrize("field", FIELDS)
def test_a_change_is_live_and_applied(field: str) -> None:
    before = base_doc()
    after = copy.deepcopy(before)
    provider(after)[field] = 2000
    outcome = refresh(load(before), yaml.safe_dump(after), mode="apply")
    assert outcome.result.result == "applied"
    [entry] = outcome.result.report
    assert (entry.path, entry.change_class, entry.applied, entry.new) == (
        f"nodes[gpu-1].providers[vllm-a].{field}",
        "live",
        True,
        2000,
    )
    assert outcome.running is not None
    assert getattr(outcome.running.nodes[0].providers[0], field) == 2000


def test_the_catalog_carries_the_bounds_of_the_providers_that_set_them() -> None:
    doc = base_doc()
    assert build_catalog(load(doc)).stream_bounds == {}
    provider(doc)["first_token_timeout_ms"] = 1000
    assert build_catalog(load(doc)).stream_bounds == {"vllm-a": StreamBounds(1000, None)}

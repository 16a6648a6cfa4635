"""``openai.responses_store`` (issue 28): the bounds of the stored responses of
``/v1/responses`` — defaults 1,000 items / 64 MiB / 1 h, positive integers within sensible
bounds, ``max_bytes`` >= ``openai.max_body_bytes``, and live on a refresh."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from iop_edge.config.refresh import refresh
from tests.helpers.config import base_doc, load, problem_at, problems

PATH = "openai.responses_store"


def with_store(**fields: Any) -> dict[str, Any]:
    """The base document with ``openai.responses_store`` set to ``fields``."""
    doc = base_doc()
    doc.setdefault("openai", {})["responses_store"] = fields
    return doc


def test_the_defaults_are_1000_items_64_mib_and_one_hour() -> None:
    store = load(base_doc()).openai.responses_store
    assert (store.max_items, store.max_bytes, store.ttl_ms) == (1000, 64 * 2**20, 3_600_000)


def test_given_values_are_kept_and_the_others_defaulted() -> None:
    store = load(with_store(max_items=10, ttl_ms=5000)).openai.responses_store
    assert (store.max_items, store.max_bytes, store.ttl_ms) == (10, 64 * 2**20, 5000)


@pytest.mark.parametrize("field", ["max_items", "max_bytes", "ttl_ms"])
@pytest.mark.parametrize(
    ("value", "says"),
    [
        (0, "0 is not positive; max_items must be > 0"),
        (-1, "-1 is not positive; max_items must be > 0"),
        ("100", "valid integer"),
        (1.5, "valid integer"),
        (True, "valid integer"),
    ],
)
def test_a_value_that_is_not_a_positive_integer_is_refused_at_its_path(
    field: str, value: object, says: str
) -> None:
    message = problem_at(with_store(**{field: value}), f"{PATH}.{field}")
    assert says.replace("max_items", field) in message


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("max_items", 1_000_001, "1000001 is above 1000000; max_items must be <= 1000000"),
        ("ttl_ms", 2_592_000_001, "2592000001 is above 2592000000; ttl_ms must be <= 2592000000"),
    ],
)
def test_a_value_above_its_bound_is_refused_naming_the_value_and_the_rule(
    field: str, value: int, says: str
) -> None:
    assert says in problem_at(with_store(**{field: value}), f"{PATH}.{field}")


def test_the_largest_values_within_the_bounds_are_accepted() -> None:
    store = load(with_store(max_items=1_000_000, ttl_ms=2_592_000_000)).openai.responses_store
    assert (store.max_items, store.ttl_ms) == (1_000_000, 2_592_000_000)


def test_an_unknown_key_is_refused_at_its_path() -> None:
    assert problem_at(with_store(max_entries=5), f"{PATH}.max_entries")


def test_max_bytes_below_the_body_limit_is_refused_naming_both() -> None:
    """The store must hold one request of the largest accepted body."""
    doc = with_store(max_bytes=1024)
    message = problem_at(doc, f"{PATH}.max_bytes")
    assert "1024 is below openai.max_body_bytes 8388608" in message
    assert "max_bytes >= max_body_bytes" in message
    doc["openai"]["max_body_bytes"] = 1024
    assert load(doc).openai.responses_store.max_bytes == 1024


def test_every_problem_of_the_section_is_reported_at_once() -> None:
    found = {p.path for p in problems(with_store(max_items=0, max_bytes=-1, ttl_ms=0))}
    assert {f"{PATH}.max_items", f"{PATH}.max_bytes", f"{PATH}.ttl_ms"} <= found


@pytest.mark.parametrize(
    ("field", "value"), [("max_items", 5), ("max_bytes", 2**30), ("ttl_ms", 1)]
)
def test_a_change_is_live_and_applied(field: str, value: int) -> None:
    before = base_doc()
    after = copy.deepcopy(before)
    after.setdefault("openai", {})["responses_store"] = {field: value}
    outcome = refresh(load(before), yaml.safe_dump(after), mode="apply")
    assert (outcome.result.result, outcome.result.errors) == ("applied", [])
    [entry] = outcome.result.report
    assert (entry.path, entry.change_class, entry.applied, entry.new) == (
        f"{PATH}.{field}",
        "live",
        True,
        value,
    )
    assert getattr(outcome.running.openai.responses_store, field) == value


def test_a_live_change_below_the_running_body_limit_is_not_applied() -> None:
    """``max_body_bytes`` is restart-class: a smaller store alone would break the rule in the
    running config, so the refresh applies nothing and says why."""
    before = base_doc()
    after = copy.deepcopy(before)
    after.setdefault("openai", {}).update(max_body_bytes=1024, responses_store={"max_bytes": 1024})
    outcome = refresh(load(before), yaml.safe_dump(after), mode="apply")
    assert outcome.result.result == "restart_required"
    [error] = outcome.result.errors
    assert error.path == f"{PATH}.max_bytes"
    assert "no live change was applied" in error.message
    assert outcome.running.openai.responses_store.max_bytes == 64 * 2**20

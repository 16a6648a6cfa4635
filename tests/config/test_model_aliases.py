"""``models[].aliases``: the rules of each alias at load, and its reload class (issue 27)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from iop_edge.config.refresh import refresh
from tests.helpers.config import base_doc, load, problem_at, problems

RULE = "model ids, aliases and route ids must all be distinct"


def two_groups(*aliases: str, other: tuple[str, ...] = ()) -> dict[str, Any]:
    """base_doc() with model ``chat`` answering to ``aliases`` and a second group ``code``
    (on the same provider) answering to ``other``."""
    doc = base_doc()
    doc["models"][0]["aliases"] = list(aliases)
    doc["models"].append(
        {
            "id": "code",
            "context_window_tokens": 8192,
            "providers": ["vllm-a"],
            "aliases": list(other),
        }
    )
    return doc


def with_route(doc: dict[str, Any], route_id: str) -> dict[str, Any]:
    """``doc`` with a model route ``route_id``."""
    doc["openai"] = {"model_routes": [{"model": route_id, "adapter": "vllm-main", "target": "x"}]}
    return doc


def test_aliases_are_optional_and_kept_in_their_order():
    assert load(base_doc()).models[0].aliases == ()
    config = load(two_groups("claude-sonnet-4-5", "claude-sonnet-4-5-20250929"))
    assert config.models[0].aliases == ("claude-sonnet-4-5", "claude-sonnet-4-5-20250929")
    assert config.models[1].aliases == ()


@pytest.mark.parametrize("bad", ["", "two words", "tab\there", "a[1]", "x]"])
def test_an_alias_follows_the_model_id_character_rules(bad):
    """The same rule as ``models[].id``: non-empty, no whitespace, no square brackets."""
    message = problem_at(two_groups("fine", bad), "models[chat].aliases[1]")
    assert message == (
        f"{bad!r} is not a valid model id; aliases must be non-empty, without whitespace or "
        "square brackets"
    )


@pytest.mark.parametrize("bad", [7, None, ["nested"]])
def test_an_alias_is_a_string(bad):
    message = problem_at(two_groups(bad), "models[chat].aliases[0]")
    assert "valid string" in message


def test_aliases_is_a_list():
    doc = base_doc()
    doc["models"][0]["aliases"] = "claude"
    assert "valid tuple" in problem_at(doc, "models[chat].aliases")


def test_an_alias_equal_to_its_own_group_id_is_refused():
    message = problem_at(two_groups("chat"), "models[chat].aliases[0]")
    assert message == f"'chat' is this group's own id (models[chat].id); {RULE}"


def test_an_alias_equal_to_another_groups_id_is_refused_naming_that_group():
    """Whether the other group comes before or after the alias's own."""
    message = problem_at(two_groups("code"), "models[chat].aliases[0]")
    assert message == f"'code' is the id of models[code]; {RULE}"
    message = problem_at(two_groups(other=("chat",)), "models[code].aliases[0]")
    assert message == f"'chat' is the id of models[chat]; {RULE}"


def test_an_alias_listed_twice_in_one_group_is_refused_naming_the_first():
    message = problem_at(two_groups("claude", "opus", "claude"), "models[chat].aliases[2]")
    assert message == f"'claude' is already an alias at models[chat].aliases[0]; {RULE}"


def test_an_alias_of_two_groups_is_refused_naming_the_first():
    doc = two_groups("x", "claude", other=("claude",))
    message = problem_at(doc, "models[code].aliases[0]")
    assert message == f"'claude' is already an alias at models[chat].aliases[1]; {RULE}"
    assert [p.path for p in problems(doc)] == ["models[code].aliases[0]"]  # (reported once)


def test_an_alias_equal_to_a_route_id_is_refused_naming_the_route():
    doc = with_route(two_groups("legacy"), "legacy")
    message = problem_at(doc, "models[chat].aliases[0]")
    assert message == f"'legacy' is the id of openai.model_routes[legacy]; {RULE}"
    assert [p.path for p in problems(doc)] == ["models[chat].aliases[0]"]


def test_every_alias_problem_is_reported_at_once():
    doc = with_route(two_groups("chat", "fine", "code", "r", other=("ok", "ok")), "r")
    assert [p.path for p in problems(doc)] == [
        "models[chat].aliases[0]",
        "models[chat].aliases[2]",
        "models[chat].aliases[3]",
        "models[code].aliases[1]",
    ]


def test_an_allow_list_may_name_an_alias_and_still_refuses_unknown_names():
    """An alias is a name of its group: an allow-list may name the group by it (the catalog
    then admits every name of the group: tests/api/test_model_aliases.py)."""
    doc = two_groups("claude")
    doc["openai"] = {
        "principal_tokens": [
            {"token_ref": "app", "token_hash_sha256": "c" * 64, "principal_ref": "team"}
        ]
    }
    doc["provider_pool"]["principals"] = [{"ref": "team", "models": ["claude"]}]
    assert load(doc).provider_pool.principals[0].models == ("claude",)
    doc["provider_pool"]["principals"][0]["models"] = ["claud"]
    message = problem_at(doc, "provider_pool.principals[team].models")
    assert message.startswith("'claud' is no model id, alias or route id of this config")
    assert "did you mean 'claude'?" in message


# --- reload ---------------------------------------------------------------------------------


def refreshed(before: dict[str, Any], after: dict[str, Any]) -> Any:
    return refresh(load(before), yaml.safe_dump(after), mode="apply")


def test_adding_changing_or_removing_aliases_is_live():
    before = two_groups("claude")
    after = copy.deepcopy(before)
    after["models"][0]["aliases"] = ["claude", "claude-opus"]
    after["models"][1]["aliases"] = ["coder"]
    outcome = refreshed(before, after)
    result = outcome.result
    assert (result.result, result.errors) == ("applied", [])
    assert [(e.path, e.change_class, e.applied, e.old, e.new) for e in result.report] == [
        ("models[chat].aliases", "live", True, ["claude"], ["claude", "claude-opus"]),
        ("models[code].aliases", "live", True, [], ["coder"]),
    ]
    assert result.changed_models == ["chat", "code"]
    assert [m.aliases for m in outcome.running.models] == [("claude", "claude-opus"), ("coder",)]
    back = refreshed(after, before)
    assert [m.aliases for m in back.running.models] == [("claude",), ()]


def test_a_live_alias_that_collides_with_a_route_kept_until_restart_is_not_applied():
    """The candidate drops route ``legacy`` (restart-class: it stays until a restart) and
    gives its name to a group (live): the running config with only the live change would
    have both, so nothing live is applied and the problem names both places."""
    before = with_route(two_groups(), "legacy")
    after = two_groups("legacy")
    outcome = refreshed(before, after)
    result = outcome.result
    assert result.result == "restart_required"
    (error,) = result.errors
    assert error.path == "models[chat].aliases[0]"
    assert error.message.startswith(f"'legacy' is the id of openai.model_routes[legacy]; {RULE}")
    assert "no live change was applied" in error.message
    assert outcome.running == load(before)

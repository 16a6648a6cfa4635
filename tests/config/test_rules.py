"""One test per rule of SPEC §3.1, named after the rule; valid and invalid sides both."""

from __future__ import annotations

from typing import Any

import pytest

from iop_edge.config.payload import node_payload
from tests.helpers.config import (
    HASH_A,
    HASH_B,
    base_doc,
    load,
    node,
    problem_at,
    problems,
    provider,
)

# --- principals and auth --------------------------------------------------------------------


def token(
    ref: str, digest: str, principal: str = "team-a", alias: str | None = None
) -> dict[str, str]:
    """A principal_tokens entry."""
    entry = {"token_ref": ref, "token_hash_sha256": digest, "principal_ref": principal}
    if alias is not None:
        entry["principal_alias"] = alias
    return entry


def test_principal_tokens_hold_only_a_sha256_hash_never_a_raw_token():
    doc = base_doc()
    doc["openai"] = {"principal_tokens": [{**token("app", HASH_A), "token": "raw-secret"}]}
    assert problem_at(doc, "openai.principal_tokens[app].token").startswith("unknown key 'token'")
    # A raw token pasted where its hash belongs is not quoted back (reports reach logs).
    doc["openai"] = {"principal_tokens": [token("app", "sk-raw-token-pasted-by-mistake")]}
    message = problem_at(doc, "openai.principal_tokens[app].token_hash_sha256")
    assert "<redacted> (str) is not a SHA-256 hex digest" in message
    assert "64 hexadecimal characters" in message
    assert "sk-raw-token" not in message


def test_principal_token_hash_is_normalized_to_lowercase():
    doc = base_doc()
    doc["openai"] = {"principal_tokens": [token("app", "AB" * 32)]}
    assert load(doc).openai.principal_tokens[0].token_hash_sha256 == "ab" * 32


def test_token_ref_is_non_empty_and_unique():
    doc = base_doc()
    doc["openai"] = {"principal_tokens": [token("", HASH_A)]}
    assert "is not a valid identifier" in problem_at(doc, "openai.principal_tokens[0].token_ref")
    doc["openai"] = {"principal_tokens": [token("app", HASH_A), token("app", HASH_B)]}
    message = problem_at(doc, "openai.principal_tokens[app].token_ref")
    assert message == "'app' is used by entries 0 and 1; token_ref must be unique"


def test_a_token_hash_may_not_appear_twice():
    doc = base_doc()
    doc["openai"] = {"principal_tokens": [token("app", HASH_A), token("other", HASH_A.upper())]}
    message = problem_at(doc, "openai.principal_tokens[other].token_hash_sha256")
    assert "same hash as openai.principal_tokens[app]" in message
    assert HASH_A not in message  # the report names the token_ref, never the hash


def test_principal_ref_is_non_empty_and_alias_optional():
    doc = base_doc()
    doc["openai"] = {"principal_tokens": [token("app", HASH_A, principal="  ")]}
    assert "must be a non-empty string" in problem_at(
        doc, "openai.principal_tokens[app].principal_ref"
    )
    doc["openai"] = {"principal_tokens": [token("app", HASH_A)]}
    assert load(doc).openai.principal_tokens[0].principal_alias is None


def test_several_tokens_may_share_one_principal():
    doc = base_doc()
    doc["openai"] = {
        "principal_tokens": [
            token("app-chat", HASH_A, "team-a", "Team A"),
            token("app-batch", HASH_B, "team-a", "Team A"),
        ]
    }
    tokens = load(doc).openai.principal_tokens
    assert [t.token_ref for t in tokens] == ["app-chat", "app-batch"]
    assert {t.principal_ref for t in tokens} == {"team-a"}


def test_provider_auth_is_disabled_by_default_and_defaults_its_fields_when_enabled():
    assert load(base_doc()).openai.provider_auth.enabled is False
    doc = base_doc()
    doc["openai"] = {"provider_auth": {"enabled": True}}
    auth = load(doc).openai.provider_auth
    assert (auth.enabled, auth.from_header, auth.target_header, auth.scheme, auth.required) == (
        True,
        "X-IOP-Provider-Authorization",
        "Authorization",
        "Bearer",
        True,
    )
    doc["openai"] = {"provider_auth": {"enabled": True, "from_header": "bad header"}}
    assert "not a valid HTTP header name" in problem_at(doc, "openai.provider_auth.from_header")


def test_no_principal_tokens_is_allowed_only_on_a_loopback_listener():
    for address in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080"):
        doc = base_doc()
        doc["openai"] = {"listen": address}
        load(doc)
    doc = base_doc()
    doc["openai"] = {"listen": "0.0.0.0:8080"}
    message = problem_at(doc, "openai.listen")
    assert "'0.0.0.0:8080' is not a loopback address" in message
    assert "allow_anonymous" in message
    doc["openai"]["allow_anonymous"] = True
    load(doc)
    doc["openai"] = {"listen": "0.0.0.0:8080", "principal_tokens": [token("app", HASH_A)]}
    load(doc)


# --- routing catalog ------------------------------------------------------------------------


def test_a_route_id_equal_to_a_model_id_is_an_error():
    doc = base_doc()
    doc["openai"] = {"model_routes": [{"model": "chat", "adapter": "vllm-main", "target": "x"}]}
    assert "separate namespaces" in problem_at(doc, "openai.model_routes[chat].model")


def test_a_route_maps_an_external_model_to_an_adapter_and_target():
    doc = base_doc()
    doc["openai"] = {
        "model_routes": [{"model": "legacy-gpt", "adapter": "vllm-main", "target": "gpt-4o"}]
    }
    route = load(doc).openai.model_routes[0]
    assert (route.model, route.adapter, route.target, route.node) == (
        "legacy-gpt",
        "vllm-main",
        "gpt-4o",
        "gpu-1",
    )
    doc["openai"]["model_routes"][0]["adapter"] = "nope"
    assert "names no adapter instance" in problem_at(doc, "openai.model_routes[legacy-gpt].adapter")


def test_a_route_adapter_present_on_several_nodes_needs_a_node():
    doc = base_doc()
    doc["nodes"].append({"id": "gpu-2", "adapters": [dict(node(doc)["adapters"][0])]})
    doc["openai"] = {"model_routes": [{"model": "r", "adapter": "vllm-main", "target": "t"}]}
    assert "several nodes (gpu-1, gpu-2)" in problem_at(doc, "openai.model_routes[r].adapter")
    doc["openai"]["model_routes"][0]["node"] = "gpu-2"
    assert load(doc).openai.model_routes[0].node == "gpu-2"


def test_models_reference_provider_ids():
    doc = base_doc()
    doc["models"][0]["providers"] = ["vllm-b"]
    message = problem_at(doc, "models[chat].providers[vllm-b]")
    assert message.startswith("'vllm-b' is not the id of any nodes[].providers[] entry")
    assert "did you mean 'vllm-a'?" in message


def test_a_provider_listed_twice_in_one_model_is_an_error():
    doc = base_doc()
    doc["models"][0]["providers"] = ["vllm-a", "vllm-a"]
    assert "listed twice" in problem_at(doc, "models[chat].providers[vllm-a]")


def test_model_ids_are_unique():
    doc = base_doc()
    doc["models"].append(dict(doc["models"][0]))
    assert "model ids must be unique" in problem_at(doc, "models[chat].id")


def test_generation_policy_bounds():
    doc = base_doc()
    doc["models"][0].update(
        {"default_max_tokens": 100, "min_max_tokens": 200, "default_thinking_token_budget": 0}
    )
    assert problem_at(doc, "models[chat].min_max_tokens") == (
        "200 is above default_max_tokens 100; min_max_tokens <= default_max_tokens"
    )
    doc["models"][0].update({"default_max_tokens": 9000, "min_max_tokens": 16})
    assert "above context_window_tokens 8192" in problem_at(doc, "models[chat].default_max_tokens")
    doc["models"][0].update({"default_max_tokens": 1024, "context_window_tokens": 0})
    assert problem_at(doc, "models[chat].context_window_tokens") == (
        "0 is not positive; context_window_tokens must be > 0"
    )
    doc["models"][0].update({"context_window_tokens": 8192})
    model = load(doc).models[0]
    assert (model.default_max_tokens, model.min_max_tokens) == (1024, 16)
    assert model.default_thinking_token_budget == 0


def test_one_model_may_mix_openai_compatible_and_normalized_providers():
    doc = base_doc()
    node(doc)["providers"].append(
        {
            "id": "ollama-b",
            "type": "ollama",
            "category": "local_inference",
            "adapter": "ollama-local",
            "models": ["qwen3:32b"],
            "capacity": 1,
            "priority": 10,
        }
    )
    doc["models"][0]["providers"] = ["vllm-a", {"id": "ollama-b", "target": "qwen3:32b"}]
    refs = load(doc).models[0].providers
    assert [(r.id, r.target) for r in refs] == [("vllm-a", "chat"), ("ollama-b", "qwen3:32b")]


def test_target_is_the_group_id_when_the_provider_lists_it_else_its_only_model():
    doc = base_doc()
    provider(doc)["models"] = ["other", "chat"]
    assert load(doc).models[0].providers[0].target == "chat"
    provider(doc)["models"] = ["upstream-name"]
    assert load(doc).models[0].providers[0].target == "upstream-name"


def test_an_ambiguous_target_is_an_error_and_an_explicit_target_wins():
    doc = base_doc()
    provider(doc)["models"] = ["a", "b"]
    message = problem_at(doc, "models[chat].providers[vllm-a]")
    assert "ambiguous: provider 'vllm-a' serves a, b and none is named 'chat'" in message
    doc["models"][0]["providers"] = [{"id": "vllm-a", "target": "b"}]
    assert load(doc).models[0].providers[0].target == "b"


# --- providers and adapters -----------------------------------------------------------------


def test_category_is_api_cli_or_local_inference():
    doc = base_doc()
    provider(doc)["category"] = "gpu"
    message = problem_at(doc, "nodes[gpu-1].providers[vllm-a].category")
    assert message == "'gpu' is not allowed; category must be 'api', 'cli' or 'local_inference'"


@pytest.mark.parametrize("alias", ["seulgivibe_claude", "seulgivibe_openai"])
def test_seulgivibe_types_normalize_to_openai_compat_keeping_the_alias_as_provider_label(alias):
    doc = base_doc()
    provider(doc)["type"] = alias
    loaded = load(doc).nodes[0].providers[0]
    assert (loaded.type, loaded.provider) == ("openai_compat", alias)
    payload = node_payload(load(doc), "gpu-1").providers[0]
    assert (payload.type, payload.execution.provider) == ("openai_compat", alias)
    provider(doc)["provider"] = "anthropic"
    assert load(doc).nodes[0].providers[0].provider == "anthropic"


def test_provider_ids_are_unique_across_the_whole_config():
    doc = base_doc()
    doc["nodes"].append(
        {
            "id": "gpu-2",
            "adapters": [dict(node(doc)["adapters"][0])],
            "providers": [dict(provider(doc))],
        }
    )
    message = problem_at(doc, "nodes[gpu-2].providers[vllm-a].id")
    assert "already the id of an earlier provider in nodes[gpu-1]" in message


def test_node_ids_and_adapter_names_are_unique():
    doc = base_doc()
    node(doc)["adapters"].append(dict(node(doc)["adapters"][2]))
    assert "adapter names must be unique" in problem_at(doc, "nodes[gpu-1].adapters[shell].name")
    doc = base_doc()
    doc["nodes"].append({"id": "gpu-1"})
    assert "node ids must be unique" in problem_at(doc, "nodes[gpu-1].id")


def test_provider_adapter_names_an_enabled_instance_of_the_same_node():
    doc = base_doc()
    provider(doc)["adapter"] = "elsewhere"
    message = problem_at(doc, "nodes[gpu-1].providers[vllm-a].adapter")
    assert "'elsewhere' names no enabled adapter instance of nodes[gpu-1]" in message
    doc = base_doc()
    node(doc)["adapters"][0]["enabled"] = False
    assert "'vllm-main' is disabled" in problem_at(doc, "nodes[gpu-1].providers[vllm-a].adapter")


def test_a_legacy_type_name_reference_needs_exactly_one_enabled_instance_of_that_type():
    doc = base_doc()
    provider(doc)["adapter"] = "openai_compat"
    assert load(doc).nodes[0].providers[0].adapter == "vllm-main"  # resolved to the instance
    node(doc)["adapters"].append(
        {"name": "vllm-second", "type": "openai_compat", "base_url": "http://127.0.0.1:8001/v1"}
    )
    message = problem_at(doc, "nodes[gpu-1].providers[vllm-a].adapter")
    assert "matches several enabled openai_compat instances (vllm-main, vllm-second)" in message
    node(doc)["adapters"][-1]["enabled"] = False
    assert load(doc).nodes[0].providers[0].adapter == "vllm-main"


def test_an_omitted_adapter_resolves_like_a_type_name_reference():
    doc = base_doc()
    del provider(doc)["adapter"]
    assert load(doc).nodes[0].providers[0].adapter == "vllm-main"


def test_the_exact_instance_name_wins_over_a_type_name():
    doc = base_doc()
    node(doc)["adapters"] = [
        {"name": "openai_compat", "type": "openai_compat", "base_url": "http://127.0.0.1:1/v1"},
        {"name": "vllm-main", "type": "openai_compat", "base_url": "http://127.0.0.1:2/v1"},
    ]
    provider(doc)["adapter"] = "openai_compat"
    assert load(doc).nodes[0].providers[0].adapter == "openai_compat"


def test_a_provider_runs_on_an_adapter_of_its_own_type():
    doc = base_doc()
    provider(doc)["adapter"] = "ollama-local"
    message = problem_at(doc, "nodes[gpu-1].providers[vllm-a].type")
    assert "does not match adapter 'ollama-local' of type 'ollama'" in message


def test_a_cli_category_provider_needs_an_enabled_cli_adapter():
    doc = base_doc()
    provider(doc)["category"] = "cli"
    message = problem_at(doc, "nodes[gpu-1].providers[vllm-a].category")
    assert (
        message == "'cli' needs an enabled cli adapter, but adapter 'vllm-main' is 'openai_compat'"
    )
    doc = base_doc()
    node(doc)["providers"].append(
        {"id": "echo", "type": "cli", "category": "cli", "adapter": "shell", "models": ["chat"]}
    )
    load(doc)


def test_a_disabled_provider_skips_the_adapter_check_but_keeps_structural_validation():
    doc = base_doc()
    node(doc)["providers"].append(
        {
            "id": "off",
            "type": "openai_compat",
            "category": "api",
            "adapter": "gone",
            "models": ["x"],
            "enabled": False,
        }
    )
    loaded = load(doc).nodes[0].providers[1]
    assert (loaded.enabled, loaded.adapter) == (False, "gone")
    node(doc)["providers"][1].update({"priority": -1, "models": [], "type": "vllm"})
    paths = {p.path for p in problems(doc)}
    assert paths == {
        "nodes[gpu-1].providers[off].priority",
        "nodes[gpu-1].providers[off].models",
        "nodes[gpu-1].providers[off].type",
    }


def test_enabled_defaults_to_true():
    assert load(base_doc()).nodes[0].providers[0].enabled is True


def test_capacity_defaults_to_1_and_long_context_capacity_to_capacity():
    doc = base_doc()
    loaded = load(doc).nodes[0].providers[0]
    assert (loaded.capacity, loaded.long_context_capacity) == (1, 1)
    provider(doc)["capacity"] = 8
    loaded = load(doc).nodes[0].providers[0]
    assert (loaded.capacity, loaded.long_context_capacity) == (8, 8)
    provider(doc)["long_context_capacity"] = 0
    assert load(doc).nodes[0].providers[0].long_context_capacity == 0


def test_long_context_capacity_is_between_0_and_capacity():
    doc = base_doc()
    provider(doc).update({"capacity": 2, "long_context_capacity": 3})
    assert problem_at(doc, "nodes[gpu-1].providers[vllm-a].long_context_capacity") == (
        "3 is above capacity 2; 0 <= long_context_capacity <= capacity"
    )
    provider(doc)["long_context_capacity"] = -1
    assert problem_at(doc, "nodes[gpu-1].providers[vllm-a].long_context_capacity") == (
        "-1 is negative; long_context_capacity must be >= 0"
    )


def test_capacity_must_be_at_least_1():
    doc = base_doc()
    provider(doc)["capacity"] = 0
    message = problem_at(doc, "nodes[gpu-1].providers[vllm-a].capacity")
    assert message.startswith("0 is below 1; capacity must be >= 1")


def test_total_context_tokens_covers_context_window_times_long_context_capacity():
    doc = base_doc()
    provider(doc).update({"capacity": 4, "long_context_capacity": 2, "total_context_tokens": 16384})
    load(doc)  # 8192 × 2 = 16384: exactly enough
    provider(doc)["total_context_tokens"] = 16383
    assert problem_at(doc, "nodes[gpu-1].providers[vllm-a].total_context_tokens") == (
        "16383 is below models[chat].context_window_tokens 8192 × long_context_capacity 2 "
        "= 16384; total_context_tokens must cover that for every model that references the "
        "provider"
    )


def test_total_context_tokens_is_checked_against_every_model_that_references_the_provider():
    doc = base_doc()
    provider(doc).update({"total_context_tokens": 10000, "models": ["chat", "big"]})
    doc["models"].append({"id": "big", "context_window_tokens": 20000, "providers": ["vllm-a"]})
    message = problem_at(doc, "nodes[gpu-1].providers[vllm-a].total_context_tokens")
    assert "models[big].context_window_tokens 20000" in message


def test_priority_defaults_to_0_and_negative_is_an_error():
    doc = base_doc()
    assert load(doc).nodes[0].providers[0].priority == 0
    provider(doc)["priority"] = -1
    assert problem_at(doc, "nodes[gpu-1].providers[vllm-a].priority") == (
        "-1 is negative; priority must be >= 0"
    )


def test_provider_first_execution_fields_override_the_adapter_instance():
    doc = base_doc()
    node(doc)["adapters"][0].update(
        {"headers": {"X-A": "adapter"}, "request_timeout_ms": 1000, "provider": "vllm"}
    )
    provider(doc).update({"base_url": "http://127.0.0.1:9000/v1", "request_timeout_ms": 5000})
    execution = node_payload(load(doc), "gpu-1").providers[0].execution
    assert execution.base_url == "http://127.0.0.1:9000/v1"  # provider wins
    assert execution.request_timeout_ms == 5000  # provider wins
    assert execution.headers == {"X-A": "adapter"}  # inherited from the adapter
    assert execution.provider == "vllm"


def test_legacy_single_instance_adapter_mapping_becomes_named_instances():
    doc = base_doc()
    node(doc)["adapters"] = {
        "openai_compat": {"base_url": "http://127.0.0.1:8000/v1"},
        "cli": {"command": "cat"},
    }
    provider(doc)["adapter"] = "openai_compat"
    adapters = load(doc).nodes[0].adapters
    assert [(a.name, a.type) for a in adapters] == [
        ("openai_compat", "openai_compat"),
        ("cli", "cli"),
    ]
    assert load(doc).nodes[0].providers[0].adapter == "openai_compat"
    node(doc)["adapters"] = {"openai_compat": {"base_url": "http://x:1/v1", "colour": "red"}}
    assert "unknown key 'colour'" in problem_at(doc, "nodes[gpu-1].adapters[openai_compat].colour")


# --- queue policy ---------------------------------------------------------------------------


def test_long_context_threshold_defaults_to_100000_and_non_positive_is_rejected():
    assert load(base_doc()).long_context_threshold_tokens == 100000
    for bad in (0, -5):
        doc = base_doc()
        doc["long_context_threshold_tokens"] = bad
        assert problem_at(doc, "long_context_threshold_tokens") == (
            f"{bad} is not positive; long_context_threshold_tokens must be > 0"
        )


@pytest.mark.parametrize(
    ("pool", "expected"),
    [
        ({}, (16, 30000)),
        ({"max_queue": 0}, (16, 30000)),
        ({"max_queue": None}, (16, 30000)),
        ({"max_queue": 3}, (3, 30000)),
        ({"queue_timeout_ms": 0}, (16, 0)),  # explicit 0 = no timeout, not the default
        ({"queue_timeout_ms": 250}, (16, 250)),
    ],
)
def test_max_queue_zero_or_omitted_is_16_and_queue_timeout_omitted_is_30000_explicit_0_none(
    pool, expected
):
    doc = base_doc()
    doc["provider_pool"] = pool
    loaded = load(doc).provider_pool
    assert (loaded.max_queue, loaded.queue_timeout_ms) == expected


def test_negative_queue_values_are_rejected():
    doc = base_doc()
    doc["provider_pool"] = {"max_queue": -1, "queue_timeout_ms": -2}
    assert problem_at(doc, "provider_pool.max_queue") == "-1 is negative; max_queue must be >= 0"
    assert problem_at(doc, "provider_pool.queue_timeout_ms") == (
        "-2 is negative; queue_timeout_ms must be >= 0"
    )


def legacy_doc(*pairs: tuple[int | None, int | None]) -> dict[str, Any]:
    """A document without provider_pool whose providers carry legacy queue values."""
    doc = base_doc()
    del doc["provider_pool"]
    providers: list[dict[str, Any]] = []
    for i, (max_queue, timeout) in enumerate(pairs):
        entry: dict[str, Any] = {
            "id": f"p{i}",
            "type": "cli",
            "category": "cli",
            "adapter": "shell",
            "models": ["chat"],
        }
        if max_queue is not None:
            entry["max_queue"] = max_queue
        if timeout is not None:
            entry["queue_timeout_ms"] = timeout
        providers.append(entry)
    node(doc)["providers"] = providers
    doc["models"][0]["providers"] = [p["id"] for p in providers]
    return doc


def test_legacy_provider_queue_values_are_promoted_when_all_participating_providers_agree():
    loaded = load(legacy_doc((8, 1000), (8, 1000)))
    assert (loaded.provider_pool.max_queue, loaded.provider_pool.queue_timeout_ms) == (8, 1000)
    # the promoted policy replaces the legacy inputs: they never reach the effective config
    assert {(p.max_queue, p.queue_timeout_ms) for p in loaded.nodes[0].providers} == {(None, None)}
    # 0/omitted normalize before comparing: (0, omitted) agrees with (16, 30000)
    loaded = load(legacy_doc((0, None), (16, 30000)))
    assert (loaded.provider_pool.max_queue, loaded.provider_pool.queue_timeout_ms) == (16, 30000)


def test_legacy_provider_queue_values_that_differ_are_rejected_listing_providers_and_values():
    message = problem_at(legacy_doc((8, 1000), (4, 1000), (8, 1000)), "provider_pool")
    assert "legacy per-provider queue values disagree" in message
    assert "max_queue=4 queue_timeout_ms=1000: nodes[gpu-1].providers[p1]" in message
    assert (
        "max_queue=8 queue_timeout_ms=1000: nodes[gpu-1].providers[p0], "
        "nodes[gpu-1].providers[p2]" in message
    )
    assert "never picks one provider's values" in message


def test_legacy_queue_values_of_non_participating_providers_do_not_count():
    doc = legacy_doc((8, 1000), (4, 1000), (2, 5))
    node(doc)["providers"][1]["enabled"] = False  # disabled: not participating
    doc["models"][0]["providers"] = ["p0", "p1"]  # p2 is referenced by no model
    loaded = load(doc)
    assert (loaded.provider_pool.max_queue, loaded.provider_pool.queue_timeout_ms) == (8, 1000)


def test_legacy_queue_values_are_ignored_when_provider_pool_is_present():
    doc = legacy_doc((8, 1000), (4, 2))
    doc["provider_pool"] = {"max_queue": 5}
    loaded = load(doc)
    assert (loaded.provider_pool.max_queue, loaded.provider_pool.queue_timeout_ms) == (5, 30000)
    assert {(p.max_queue, p.queue_timeout_ms) for p in loaded.nodes[0].providers} == {(None, None)}


# --- general --------------------------------------------------------------------------------


def test_reserved_sections_are_parsed_and_validated():
    """``control_plane`` and ``a2a`` are reserved (``enabled: true`` is refused); ``listen``
    and ``bootstrap`` serve remote nodes (tests/config/test_remote_config.py)."""
    doc = base_doc()
    doc.update(
        {
            "listen": {"address": "127.0.0.1:7600"},
            "bootstrap": {},
            "control_plane": {},
            "a2a": {"enabled": False},
        }
    )
    loaded = load(doc)
    assert loaded.listen.address == "127.0.0.1:7600"
    doc["listen"] = {"address": "nowhere"}
    assert "is not a listen address" in problem_at(doc, "listen.address")
    doc["listen"] = {"adress": "127.0.0.1:1"}
    assert problem_at(doc, "listen.adress") == "unknown key 'adress'; did you mean 'address'?"
    doc = base_doc()
    doc["control_plane"] = {"enabled": True}
    assert "reserved and has no service in this version" in problem_at(doc, "control_plane.enabled")
    doc = base_doc()
    doc["a2a"] = {"enabled": True}
    assert "reserved and has no service in this version" in problem_at(doc, "a2a.enabled")
    doc = base_doc()
    doc["bootstrap"] = {"enabled": True}  # no longer reserved: the node listener opens
    assert load(doc).node_listener_enabled


def test_every_validation_error_names_the_path_the_value_and_the_rule_all_at_once():
    doc = base_doc()
    provider(doc).update({"priority": -3, "capcity": 4})
    doc["models"][0]["context_window_tokens"] = "big"
    doc["provider_pool"]["max_queue"] = -1
    found = {p.path: p.message for p in problems(doc)}
    assert found == {
        "nodes[gpu-1].providers[vllm-a].priority": "-3 is negative; priority must be >= 0",
        "nodes[gpu-1].providers[vllm-a].capcity": "unknown key 'capcity'; did you mean 'capacity'?",
        "models[chat].context_window_tokens": "'big' is invalid: input should be a valid integer",
        "provider_pool.max_queue": "-1 is negative; max_queue must be >= 0",
    }


def test_numbers_and_booleans_are_not_coerced_from_text():
    doc = base_doc()
    provider(doc).update({"capacity": "4", "enabled": "yes"})
    paths = {p.path for p in problems(doc)}
    assert paths == {
        "nodes[gpu-1].providers[vllm-a].capacity",
        "nodes[gpu-1].providers[vllm-a].enabled",
    }


def test_nothing_to_serve_is_an_error():
    doc = base_doc()
    doc["models"] = []
    assert "nothing to serve" in problem_at(doc, "models")


def test_an_enabled_provider_needs_a_base_url_or_command_on_itself_or_its_adapter():
    doc = base_doc()
    del node(doc)["adapters"][0]["base_url"]
    assert problem_at(doc, "nodes[gpu-1].providers[vllm-a].base_url") == (
        "is not set here nor on adapter 'vllm-main'; openai_compat upstreams need base_url"
    )
    provider(doc)["base_url"] = "http://127.0.0.1:8000/v1"  # provider-first fills it
    load(doc)
    doc = base_doc()
    del node(doc)["adapters"][2]["command"]
    node(doc)["providers"].append(
        {"id": "echo", "type": "cli", "category": "cli", "adapter": "shell", "models": ["chat"]}
    )
    assert "cli upstreams need command" in problem_at(doc, "nodes[gpu-1].providers[echo].command")
    node(doc)["providers"][-1]["enabled"] = False  # structural checks only
    load(doc)


# --- health and failover (SPEC §5.1) --------------------------------------------------------


def add_provider(doc: dict[str, Any], pid: str, kind: str, adapter: str, **fields: Any) -> None:
    node(doc)["providers"].append(
        {"id": pid, "type": kind, "category": "api", "adapter": adapter, "models": ["chat"]}
        | fields
    )


def test_failover_and_health_default_when_omitted():
    pool = load(base_doc()).provider_pool
    assert pool.failover.max_attempts == 2
    health = pool.health
    assert (
        health.failure_threshold,
        health.eject_ms,
        health.max_eject_ms,
        health.probe_interval_ms,
    ) == (3, 10_000, 300_000, 2_000)


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("failover", "max_attempts"),
        ("health", "failure_threshold"),
        ("health", "eject_ms"),
        ("health", "max_eject_ms"),
        ("health", "probe_interval_ms"),
    ],
)
def test_failover_and_health_values_are_positive_integers(section, key):
    doc = base_doc()
    doc["provider_pool"][section] = {key: 0}
    message = problem_at(doc, f"provider_pool.{section}.{key}")
    assert message.startswith(f"0 is not positive; {key} must be > 0")
    doc["provider_pool"][section] = {key: "3"}
    assert problem_at(doc, f"provider_pool.{section}.{key}")


def test_failover_and_health_sections_are_strict():
    doc = base_doc()
    doc["provider_pool"]["health"] = {"eject_seconds": 10}
    assert problem_at(doc, "provider_pool.health.eject_seconds").startswith("unknown key")


def test_max_eject_ms_is_at_least_eject_ms():
    doc = base_doc()
    doc["provider_pool"]["health"] = {"eject_ms": 20_000, "max_eject_ms": 5_000}
    message = problem_at(doc, "provider_pool.health.max_eject_ms")
    assert message.startswith("5000 is below eject_ms 20000")
    doc["provider_pool"]["health"] = {"eject_ms": 20_000, "max_eject_ms": 20_000}
    assert load(doc).provider_pool.health.max_eject_ms == 20_000


def health_checks(doc: dict[str, Any]) -> dict[str, tuple[str, int] | bool]:
    """Each provider's effective health check as ``(path, timeout_ms)``, or ``False``."""
    return {
        p.id: False if isinstance(p.health_check, bool) else astuple(p.health_check)
        for p in load(doc).nodes[0].providers
    }


def astuple(check: Any) -> tuple[str, int]:
    return (check.path, check.timeout_ms)


def test_health_check_defaults_follow_the_runtime_type():
    doc = base_doc()
    add_provider(doc, "ollama-b", "ollama", "ollama-local")
    add_provider(doc, "hosted", "seulgivibe_openai", "vllm-main")
    add_provider(doc, "agent", "cli", "shell", category="cli")
    assert health_checks(doc) == {
        "vllm-a": ("/models", 2000),
        "hosted": ("/models", 2000),
        "ollama-b": ("/api/tags", 2000),
        "agent": False,
    }


@pytest.mark.parametrize(
    ("given", "effective"),
    [
        ({"timeout_ms": 500}, ("/models", 500)),  # the type's path is kept
        ({"path": "/health"}, ("/health", 2000)),
        (True, ("/models", 2000)),
        (False, False),
    ],
)
def test_a_health_check_may_be_set_turned_on_or_off(given, effective):
    doc = base_doc()
    provider(doc)["health_check"] = given
    assert health_checks(doc)["vllm-a"] == effective


def test_a_health_check_path_starts_with_a_slash():
    doc = base_doc()
    provider(doc)["health_check"] = {"path": "models"}
    message = problem_at(doc, "nodes[gpu-1].providers[vllm-a].health_check.path")
    assert message.startswith("'models' is not a path; path must start with '/'")


@pytest.mark.parametrize("check", [True, {"path": "/health"}])
def test_a_cli_provider_has_no_health_check(check):
    doc = base_doc()
    add_provider(doc, "agent", "cli", "shell", category="cli", health_check=check)
    message = problem_at(doc, "nodes[gpu-1].providers[agent].health_check")
    assert "is not available for a cli provider" in message
    assert "one trial request" in message


def test_a_provider_type_of_the_wrong_shape_is_a_problem_not_a_crash():
    """Found by the config fuzzer: the health-check default is looked up by type, and a type
    that is a list must be reported, not raise TypeError."""
    doc = base_doc()
    provider(doc)["type"] = []
    assert problem_at(doc, "nodes[gpu-1].providers[vllm-a].type")


# --- sharing the pool among principals (SPEC §5.2) ------------------------------------------


def with_tokens(doc: dict[str, Any], *principals: str) -> dict[str, Any]:
    tokens = [token(f"tok-{p}", format(i + 1, "064x"), p) for i, p in enumerate(principals)]
    doc["openai"] = {"principal_tokens": tokens}
    return doc


def test_fair_share_defaults_to_principal_with_no_principal_limits():
    pool = load(base_doc()).provider_pool
    assert (pool.fair_share, pool.principals) == ("principal", ())


def test_a_principal_share_names_a_configured_principal():
    doc = with_tokens(base_doc(), "team-a", "team-b")
    doc["provider_pool"]["principals"] = [{"ref": "team-a", "weight": 3}, {"ref": "team-c"}]
    message = problem_at(doc, "provider_pool.principals[team-c].ref")
    assert message.startswith("'team-c' names no configured principal")
    assert "did you mean 'team-b'?" in message
    doc["provider_pool"]["principals"] = [{"ref": "team-a"}, {"ref": "team-a"}]
    assert "listed twice" in problem_at(doc, "provider_pool.principals[team-a].ref")


def test_with_fair_share_token_a_ref_is_a_token_ref():
    doc = with_tokens(base_doc(), "team-a")
    doc["provider_pool"]["fair_share"] = "token"
    doc["provider_pool"]["principals"] = [{"ref": "tok-team-a", "max_in_flight": 2}]
    assert load(doc).provider_pool.principals[0].max_in_flight == 2
    doc["provider_pool"]["principals"] = [{"ref": "team-a"}]
    assert problem_at(doc, "provider_pool.principals[team-a].ref")


def test_without_tokens_the_only_principal_is_anonymous():
    doc = base_doc()
    doc["provider_pool"]["principals"] = [{"ref": "anonymous", "max_queued": 0}]
    assert load(doc).provider_pool.principals[0].max_queued == 0


def test_principal_limits_are_checked():
    doc = with_tokens(base_doc(), "team-a")
    doc["provider_pool"]["principals"] = [
        {"ref": "team-a", "weight": 0, "max_in_flight": 0, "max_requests_per_minute": 0}
    ]
    for key in ("weight", "max_in_flight", "max_requests_per_minute"):
        assert problem_at(doc, f"provider_pool.principals[team-a].{key}")


def test_a_model_allow_list_names_model_or_route_ids():
    doc = with_tokens(base_doc(), "team-a")
    doc["provider_pool"]["principals"] = [{"ref": "team-a", "models": ["chat", "caht"]}]
    message = problem_at(doc, "provider_pool.principals[team-a].models")
    assert message.startswith("'caht' is no model id, alias or route id")
    assert "did you mean 'chat'?" in message

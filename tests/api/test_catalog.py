"""The catalog and the scheduler policy derived from an effective config."""

from __future__ import annotations

from typing import Any

import orjson

from iop_edge.api.catalog import LoadTimes, build_catalog
from iop_edge.config.policy import (
    ROUTE_UNBOUNDED,
    completions_group,
    embeddings_group,
    pool_policy,
    route_group,
)
from tests.helpers.config import base_doc, load, node


def mixed_doc() -> dict[str, Any]:
    """base_doc() with a disabled ollama provider, a CLI model and a legacy route."""
    doc = base_doc()
    node(doc)["providers"] += [
        {
            "id": "ollama-b",
            "type": "ollama",
            "category": "local_inference",
            "adapter": "ollama-local",
            "models": ["qwen3:32b"],
            "capacity": 2,
            "priority": 10,
            "enabled": False,
        },
        {"id": "echo", "type": "cli", "category": "cli", "adapter": "shell", "models": ["echo"]},
    ]
    doc["models"][0].update(
        {"display_name": "Chat", "providers": ["vllm-a", {"id": "ollama-b", "target": "qwen3:32b"}]}
    )
    doc["models"].append({"id": "echo", "context_window_tokens": 100, "providers": ["echo"]})
    doc["openai"] = {"model_routes": [{"model": "legacy", "adapter": "vllm-main", "target": "gpt"}]}
    return doc


def test_catalog_resolves_targets_and_lists_models_and_routes():
    catalog = build_catalog(load(mixed_doc()))
    assert dict(catalog.models["chat"].targets) == {"vllm-a": "chat", "ollama-b": "qwen3:32b"}
    assert catalog.routes["legacy"].node_id == "gpu-1"
    listing = orjson.loads(catalog.models_body)
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == ["chat", "echo", "legacy"]
    assert listing["data"][0]["display_name"] == "Chat"
    legacy = catalog.model_body("legacy")
    assert legacy is not None
    assert orjson.loads(legacy)["id"] == "legacy"
    assert catalog.model_body("nope") is None


def test_only_models_with_a_passthrough_provider_serve_completions():
    catalog = build_catalog(load(mixed_doc()))
    assert catalog.models["chat"].serves_completions
    assert not catalog.models["echo"].serves_completions


def test_only_models_with_an_http_provider_serve_embeddings():
    """Issue 15: a cli provider cannot embed; a group declares nothing new."""
    catalog = build_catalog(load(mixed_doc()))
    assert catalog.models["chat"].serves_embeddings
    assert catalog.models["chat"].kinds == {"openai_compat", "ollama"}
    assert not catalog.models["echo"].serves_embeddings
    assert catalog.models["echo"].kinds == {"cli"}


def test_models_lists_only_groups_with_an_enabled_provider():
    """Issue 15: a group whose providers are all disabled is not listed (nor found by id);
    model routes always are."""
    doc = mixed_doc()
    doc["nodes"][0]["providers"][0]["enabled"] = False  # vllm-a (ollama-b is off already)
    catalog = build_catalog(load(doc))
    listing = orjson.loads(catalog.models_body)
    assert [m["id"] for m in listing["data"]] == ["echo", "legacy"]
    assert catalog.model_body("chat") is None
    assert "chat" in catalog.models  # (requests still find it: 503 no_available_provider)


def test_created_is_when_this_process_first_loaded_the_id():
    """Issue 15: ``created`` is stable across reloads: each id keeps the time it was first
    loaded; an id added later gets the later time."""
    now = [1000.0]
    times = LoadTimes(lambda: now[0])
    first = build_catalog(load(mixed_doc()), created=times)
    now[0] = 2000.0
    doc = mixed_doc()
    doc["models"].append({"id": "late", "context_window_tokens": 4096, "providers": ["echo"]})
    second = build_catalog(load(doc), created=times)
    created = {m["id"]: m["created"] for m in orjson.loads(second.models_body)["data"]}
    assert created == {"chat": 1000, "echo": 1000, "late": 2000, "legacy": 1000}
    again = build_catalog(load(mixed_doc()), created=times)  # a reload: nothing changes
    assert orjson.loads(again.models_body) == orjson.loads(first.models_body)
    assert orjson.loads(second.model_body("late") or b"")["created"] == 2000


def test_pool_policy_carries_every_provider_and_group():
    policy = pool_policy(load(mixed_doc()))
    assert (policy.max_queue, policy.queue_timeout_ms) == (16, 30000)
    assert [(p.provider_id, p.capacity, p.priority, p.enabled) for p in policy.providers] == [
        ("vllm-a", 1, 0, True),
        ("ollama-b", 2, 10, False),
        ("echo", 1, 0, True),
        ("route:legacy", ROUTE_UNBOUNDED, 0, True),  # a route without capacity: unbounded
    ]
    assert dict(policy.groups) == {
        "chat": (("gpu-1", "vllm-a"), ("gpu-1", "ollama-b")),
        "echo": (("gpu-1", "echo"),),
        completions_group("chat"): (("gpu-1", "vllm-a"),),
        # the providers that serve /v1/embeddings: openai_compat and ollama, not cli
        embeddings_group("chat"): (("gpu-1", "vllm-a"), ("gpu-1", "ollama-b")),
        route_group("legacy"): (("gpu-1", "route:legacy"),),  # its node, from the config
    }
    # A model's derived groups: their panic is reported under the model alone.
    assert dict(policy.derived) == {
        completions_group("chat"): "chat",
        embeddings_group("chat"): "chat",
    }


def test_the_known_principals_are_the_tokens_and_principals_or_anonymous():
    """Status and the metrics' label values list these (SPEC §5.2): each token's principal
    (its token_ref with fair_share: token) and every principals[] ref; anonymous without
    tokens."""
    assert pool_policy(load(mixed_doc())).principals == ("anonymous",)
    doc = mixed_doc()
    doc["openai"]["principal_tokens"] = [
        {"token_ref": f"t-{n}", "token_hash_sha256": f"{n}" * 64, "principal_ref": ref}
        for n, ref in enumerate(["app", "app", "batch"], start=1)
    ]
    doc["provider_pool"] = {"principals": [{"ref": "batch", "weight": 2}]}
    assert pool_policy(load(doc)).principals == ("app", "batch")
    doc["provider_pool"] = {"fair_share": "token", "principals": [{"ref": "t-3"}]}
    assert pool_policy(load(doc)).principals == ("t-1", "t-2", "t-3")


def test_an_alias_resolves_to_its_groups_own_entry_and_is_listed_after_it():
    """Issue 27: one entry (so one scheduler group and one set of providers) under every name;
    each alias listed as a model of its own, with the time this process first loaded it."""
    now = [1000.0]
    times = LoadTimes(lambda: now[0])
    build_catalog(load(mixed_doc()), created=times)
    now[0] = 2000.0
    doc = mixed_doc()
    doc["models"][0]["aliases"] = ["claude-sonnet", "gpt-4o"]
    catalog = build_catalog(load(doc), created=times)
    assert catalog.models["claude-sonnet"] is catalog.models["chat"]
    assert catalog.models["gpt-4o"].id == "chat"
    assert catalog.models["chat"].aliases == ("claude-sonnet", "gpt-4o")
    listing = orjson.loads(catalog.models_body)["data"]
    assert [(m["id"], m["created"], m.get("display_name")) for m in listing] == [
        ("chat", 1000, "Chat"),
        ("claude-sonnet", 2000, "Chat"),
        ("gpt-4o", 2000, "Chat"),
        ("echo", 1000, None),
        ("legacy", 1000, None),
    ]
    anthropic = orjson.loads(catalog.model_body("gpt-4o", anthropic=True) or b"")
    assert (anthropic["id"], anthropic["created_at"]) == ("gpt-4o", "1970-01-01T00:33:20Z")


def test_an_allow_list_naming_any_name_of_a_group_permits_all_of_its_names():
    doc = mixed_doc()
    doc["models"][0]["aliases"] = ["claude-sonnet"]
    doc["provider_pool"] = {
        "principals": [
            {"ref": "by-id", "models": ["chat"]},
            {"ref": "by-alias", "models": ["claude-sonnet", "legacy"]},
        ]
    }
    doc["openai"]["principal_tokens"] = [
        {"token_ref": ref, "token_hash_sha256": f"{n}" * 64, "principal_ref": ref}
        for n, ref in enumerate(["by-id", "by-alias"], start=1)
    ]
    catalog = build_catalog(load(doc))
    assert catalog.allowed == {
        "by-id": {"chat", "claude-sonnet"},
        "by-alias": {"chat", "claude-sonnet", "legacy"},
    }
    assert catalog.permits("by-id", "claude-sonnet")
    assert not catalog.permits("by-id", "echo")
    assert catalog.permits("anyone-else", "echo")  # (no allow-list: everything)
    listed = orjson.loads(catalog.anthropic_page("by-alias"))
    assert [m["id"] for m in listed["data"]] == ["chat", "claude-sonnet", "legacy"]

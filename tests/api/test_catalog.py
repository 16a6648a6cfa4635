"""The catalog and the scheduler policy derived from an effective config."""

from __future__ import annotations

from typing import Any

import orjson

from iop_edge.api.catalog import build_catalog
from iop_edge.config.policy import ROUTE_UNBOUNDED, completions_group, pool_policy, route_group
from tests.config.helpers import base_doc, load, node


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
        route_group("legacy"): (("gpu-1", "route:legacy"),),  # its node, from the config
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

"""NodeConfigPayload: one node's adapters and providers, nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from iop_edge.config import ConfigError
from iop_edge.config.payload import NodeConfigPayload, node_payload
from tests.helpers.config import HASH_A, base_doc, load, node


def two_node_doc() -> dict[str, Any]:
    """base_doc() with a principal token and a second node."""
    doc = base_doc()
    doc["openai"] = {
        "principal_tokens": [
            {"token_ref": "app", "token_hash_sha256": HASH_A, "principal_ref": "team"}
        ]
    }
    doc["nodes"].append(
        {
            "id": "laptop",
            "alias": "dev box",
            "agent_kind": "desktop",
            "adapters": {"cli": {"command": "claude", "args": ["-p"]}},
            "providers": [
                {
                    "id": "agent",
                    "type": "cli",
                    "category": "cli",
                    "adapter": "cli",
                    "models": ["agent"],
                    "env": {"HOME": "/tmp"},
                    "output_format": "stream-json",
                }
            ],
        }
    )
    doc["models"].append({"id": "agent", "context_window_tokens": 1000, "providers": ["agent"]})
    node(doc)["runtime"] = {"max_concurrency": 4}
    return doc


def test_payload_carries_only_its_own_node():
    config = load(two_node_doc())
    payload = node_payload(config, "laptop")
    assert (payload.edge_id, payload.node_id, payload.alias, payload.agent_kind) == (
        "edge",
        "laptop",
        "dev box",
        "desktop",
    )
    assert [a.name for a in payload.adapters] == ["cli"]
    assert [p.id for p in payload.providers] == ["agent"]
    dumped = payload.model_dump_json()
    assert "gpu-1" not in dumped
    assert "vllm" not in dumped


def test_payload_never_carries_principal_token_hashes():
    config = load(two_node_doc())
    for node_id in ("gpu-1", "laptop"):
        dumped = node_payload(config, node_id).model_dump_json()
        assert HASH_A not in dumped
        assert "principal" not in dumped


def test_payload_providers_have_runtime_types_and_merged_execution():
    provider = node_payload(load(two_node_doc()), "laptop").providers[0]
    assert (provider.type, provider.category, provider.adapter) == ("cli", "cli", "cli")
    assert provider.execution.command == "claude"  # from the adapter instance
    assert provider.execution.args == ("-p",)
    assert provider.execution.env == {"HOME": "/tmp"}  # provider-first field
    assert provider.execution.output_format == "stream-json"


def test_payload_round_trips_as_json_for_a_remote_node():
    payload = node_payload(load(two_node_doc()), "gpu-1")
    assert payload.runtime.max_concurrency == 4
    assert NodeConfigPayload.model_validate_json(payload.model_dump_json()) == payload


def test_an_unknown_node_is_a_config_error_naming_the_known_ones():
    with pytest.raises(ConfigError) as info:
        node_payload(load(two_node_doc()), "nope")
    assert str(info.value) == "nodes: 'nope' is not a node id; known nodes: gpu-1, laptop"

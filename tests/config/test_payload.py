"""NodeConfigPayload: one node's adapters and providers, nothing else."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from iop_edge.config import ConfigError, EdgeConfig, load_config
from iop_edge.config.payload import (
    NodeConfigPayload,
    node_payload,
    payload_generation,
    payload_json,
)
from tests.helpers.config import HASH_A, HASH_B, base_doc, load, node, provider

ROOT = Path(__file__).resolve().parents[2]
#: Every config shipped in configs/ (configs/examples/ included).
SHIPPED = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yaml"))


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


# --- the wire form --------------------------------------------------------------------------


def shipped_payloads() -> list[tuple[str, NodeConfigPayload]]:
    """(config/node, payload) for every node of every shipped config, loaded with an empty
    environment as a new user loads them."""
    found = []
    for name in SHIPPED:
        config = load_config((ROOT / name).read_text(), env={})
        found += [(f"{name}/{n.id}", node_payload(config, n.id)) for n in config.nodes]
    return found


def test_every_shipped_config_has_nodes_to_check():
    names = [name for name, _ in shipped_payloads()]
    assert "configs/examples/full.yaml/workstation" in names  # the node without an alias
    assert len(names) >= 3


@pytest.mark.parametrize(("name", "payload"), shipped_payloads(), ids=lambda v: str(v)[:40])
def test_the_wire_form_of_every_shipped_node_loads_back_equal(name, payload):
    """``payload_json`` holds every field, ``None`` included, nothing redacted, keys sorted:
    it loads back to an equal payload, and is already canonical."""
    wire = payload_json(payload)
    assert NodeConfigPayload.model_validate_json(wire) == payload
    data = orjson.loads(wire)
    assert data == payload.model_dump(mode="json")
    assert "alias" in data  # a None is sent, not dropped
    assert orjson.dumps(data, option=orjson.OPT_SORT_KEYS) == wire


def test_a_payload_dumped_without_its_nones_loads_back():
    """The defect of ``config payload`` (``exclude_none``): a node without an alias, and a
    disabled provider whose adapter does not resolve (``adapter: None``), dropped required
    fields and did not load back."""
    doc = base_doc()
    spare = {"id": "spare", "type": "ollama", "category": "local_inference", "enabled": False}
    doc["nodes"].append({"id": "bare", "providers": [{**spare, "models": ["chat"]}]})
    payload = node_payload(load(doc), "bare")
    assert payload.alias is None
    assert [p.adapter for p in payload.providers] == [None]
    shown = payload.model_dump(mode="json", exclude_none=True)
    assert "alias" not in shown
    assert NodeConfigPayload.model_validate(shown) == payload


def test_the_generation_is_16_hex_digits_of_the_wire_forms_sha256():
    import hashlib

    payload = node_payload(load(two_node_doc()), "laptop")
    generation = payload_generation(payload)
    assert re.fullmatch(r"[0-9a-f]{16}", generation)
    assert generation == hashlib.sha256(payload_json(payload)).hexdigest()[:16]


def test_the_generation_is_stable_for_equal_content():
    """Two loads of the same document, or of its entities in another key order, give one
    generation."""
    first = payload_generation(node_payload(load(two_node_doc()), "gpu-1"))
    doc = two_node_doc()
    node(doc)["adapters"] = [dict(reversed(a.items())) for a in node(doc)["adapters"]]
    assert payload_generation(node_payload(load(doc), "gpu-1")) == first
    assert payload_generation(node_payload(load(two_node_doc()), "gpu-1")) == first


def changed(edit: Any) -> tuple[str, str]:
    """The generation of node gpu-1 before and after ``edit`` of two_node_doc()."""
    doc = two_node_doc()
    before = payload_generation(node_payload(load(doc), "gpu-1"))
    edit(doc)
    return before, payload_generation(node_payload(load(doc), "gpu-1"))


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: node(d)["adapters"][0].update(base_url="http://127.0.0.1:8001/v1"),
        lambda d: node(d)["adapters"][0].update(headers={"Authorization": "Bearer x"}),
        lambda d: node(d).update(alias="box"),
        lambda d: provider(d).update(enabled=False),
        lambda d: provider(d).update(models=["chat", "chat-2"]),
        lambda d: node(d)["runtime"].update(max_concurrency=5),
        lambda d: d.update(edge={"id": "edge-2"}),
    ],
    ids=["base_url", "header", "alias", "enabled", "models", "runtime", "edge id"],
)
def test_the_generation_changes_with_the_payloads_content(edit):
    before, after = changed(edit)
    assert before != after


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: provider(d).update(capacity=3, priority=4),  # scheduling: edge-side
        lambda d: d["provider_pool"].update(max_queue=3),
        lambda d: d["openai"]["principal_tokens"][0].update(token_hash_sha256=HASH_B),
        lambda d: node(d, 1)["adapters"]["cli"].update(command="codex"),  # another node
        lambda d: node(d).update(token_hash_sha256=HASH_B),  # the node's own token
    ],
    ids=["capacity", "queue policy", "principal token", "other node", "own token"],
)
def test_the_generation_ignores_what_the_node_never_receives(edit):
    before, after = changed(edit)
    assert before == after


def test_the_wire_form_holds_no_principal_hash_no_queue_policy_and_no_other_node():
    doc = two_node_doc()
    doc["console"] = {"admin_token_sha256": "c" * 64}
    doc["provider_pool"].update(max_queue=7, principals=[{"ref": "team", "weight": 2}])
    node(doc)["token_hash_sha256"] = HASH_B
    node(doc, 1)["token_hash_sha256"] = "d" * 64
    config = load(doc)
    wire = payload_json(node_payload(config, "gpu-1")).decode()
    for absent in (HASH_A, HASH_B, "c" * 64, "d" * 64, "principal", "team", "max_queue"):
        assert absent not in wire, absent
    for absent in ('"laptop"', '"agent"', "claude", "dev box"):  # the other node's data
        assert absent not in wire, absent
    assert sorted(orjson.loads(wire)) == sorted(NodeConfigPayload.model_fields)


def test_payloads_of_a_config_differ_between_nodes():
    config: EdgeConfig = load(two_node_doc())
    generations = {payload_generation(node_payload(config, n.id)) for n in config.nodes}
    assert len(generations) == 2

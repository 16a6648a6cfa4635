"""Refresh classification (SPEC §4): applied / restart_required / rejected, path by path."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from iop_edge.config import load_config
from iop_edge.config.refresh import RefreshOutcome, RefreshResult, classify, config_hash, refresh
from tests.helpers.config import HASH_A, HASH_B, base_doc, load, node, provider

# An in-place edit of a config document.
Edit = Callable[[dict[str, Any]], None]


def running_doc() -> dict[str, Any]:
    """A running config with a principal, a route, two providers and two models."""
    doc = base_doc()
    doc["openai"] = {
        "principal_tokens": [
            {"token_ref": "app", "token_hash_sha256": HASH_A, "principal_ref": "team"}
        ],
        "model_routes": [{"model": "legacy", "adapter": "vllm-main", "target": "gpt"}],
    }
    node(doc)["runtime"] = {"max_concurrency": 8}
    node(doc)["providers"].append(
        {
            "id": "ollama-b",
            "type": "ollama",
            "category": "local_inference",
            "adapter": "ollama-local",
            "models": ["qwen3:32b"],
            "capacity": 2,
            "priority": 10,
        }
    )
    provider(doc).update({"capacity": 4, "long_context_capacity": 2})
    doc["models"].append(
        {
            "id": "qwen",
            "display_name": "Qwen",
            "context_window_tokens": 32768,
            "providers": ["ollama-b"],
            "default_max_tokens": 512,
        }
    )
    return doc


def run(edit: Edit, mode: str = "apply") -> RefreshOutcome:
    """Refresh running_doc() against an edited copy of it."""
    before = running_doc()
    after = copy.deepcopy(before)
    edit(after)
    return refresh(load(before), yaml.safe_dump(after), mode=mode)


def set_path(*keys: str | int, value: Any) -> Edit:
    """An edit that sets the value at ``keys`` (mapping keys and list indices)."""

    def edit(doc: dict[str, Any]) -> None:
        target: Any = doc
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return edit


def on_provider(pid: str, **changes: Any) -> Edit:
    """An edit that updates the fields of provider ``pid``."""
    return lambda doc: provider(doc, pid).update(changes)


def on_pool(section: str, **changes: Any) -> Edit:
    """An edit that updates ``provider_pool.<section>`` (failover, health)."""
    return lambda doc: doc.setdefault("provider_pool", {}).setdefault(section, {}).update(changes)


def on_model(mid: str, **changes: Any) -> Edit:
    """An edit that updates the fields of model ``mid``."""
    return lambda doc: next(m for m in doc["models"] if m["id"] == mid).update(changes)


LIVE = [
    (
        "long_context_threshold_tokens",
        set_path("long_context_threshold_tokens", value=5000),
        "long_context_threshold_tokens",
        [],
        [],
        [],
    ),
    (
        "max_queue",
        set_path("provider_pool", "max_queue", value=4),
        "provider_pool.max_queue",
        [],
        [],
        [],
    ),
    (
        "queue_timeout_ms",
        set_path("provider_pool", "queue_timeout_ms", value=0),
        "provider_pool.queue_timeout_ms",
        [],
        [],
        [],
    ),
    *[
        (
            f"{section}.{key}",
            on_pool(section, **{key: value}),
            f"provider_pool.{section}.{key}",
            [],
            [],
            [],
        )
        for section, key, value in [
            ("failover", "max_attempts", 3),
            ("health", "failure_threshold", 5),
            ("health", "eject_ms", 20000),
            ("health", "max_eject_ms", 600000),
            ("health", "probe_interval_ms", 500),
        ]
    ],
    *[
        (
            f"responses_store.{key}",
            set_path("openai", "responses_store", value={key: value}),
            f"openai.responses_store.{key}",
            [],
            [],
            [],
        )
        for key, value in [("max_items", 10), ("max_bytes", 2**30), ("ttl_ms", 60_000)]
    ],
    (
        "capacity",
        on_provider("vllm-a", capacity=8),
        "nodes[gpu-1].providers[vllm-a].capacity",
        ["gpu-1"],
        ["vllm-a"],
        [],
    ),
    (
        "long_context_capacity",
        on_provider("vllm-a", long_context_capacity=1),
        "nodes[gpu-1].providers[vllm-a].long_context_capacity",
        ["gpu-1"],
        ["vllm-a"],
        [],
    ),
    (
        "total_context_tokens",
        on_provider("vllm-a", total_context_tokens=99999),
        "nodes[gpu-1].providers[vllm-a].total_context_tokens",
        ["gpu-1"],
        ["vllm-a"],
        [],
    ),
    (
        "priority",
        on_provider("ollama-b", priority=3),
        "nodes[gpu-1].providers[ollama-b].priority",
        ["gpu-1"],
        ["ollama-b"],
        [],
    ),
    (
        "enabled",
        on_provider("ollama-b", enabled=False),
        "nodes[gpu-1].providers[ollama-b].enabled",
        ["gpu-1"],
        ["ollama-b"],
        [],
    ),
    (
        "retry_on",
        on_provider("vllm-a", retry_on=["connect"]),
        "nodes[gpu-1].providers[vllm-a].retry_on",
        ["gpu-1"],
        ["vllm-a"],
        [],
    ),
    (
        "model added",
        lambda d: d["models"].append(
            {"id": "new", "context_window_tokens": 100, "providers": ["vllm-a"]}
        ),
        "models[new]",
        [],
        [],
        ["new"],
    ),
    ("model removed", lambda d: d["models"].pop(), "models[qwen]", [], [], ["qwen"]),
    (
        "model display_name",
        on_model("qwen", display_name="Qwen 3"),
        "models[qwen].display_name",
        [],
        [],
        ["qwen"],
    ),
    (
        "model context window",
        on_model("qwen", context_window_tokens=65536),
        "models[qwen].context_window_tokens",
        [],
        [],
        ["qwen"],
    ),
    (
        "model provider list",
        on_model("qwen", providers=["ollama-b", "vllm-a"]),
        "models[qwen].providers",
        [],
        [],
        ["qwen"],
    ),
    (
        "default_max_tokens",
        on_model("qwen", default_max_tokens=256),
        "models[qwen].default_max_tokens",
        [],
        [],
        ["qwen"],
    ),
    (
        "min_max_tokens",
        on_model("qwen", min_max_tokens=8),
        "models[qwen].min_max_tokens",
        [],
        [],
        ["qwen"],
    ),
    (
        "default_thinking_token_budget",
        on_model("qwen", default_thinking_token_budget=64),
        "models[qwen].default_thinking_token_budget",
        [],
        [],
        ["qwen"],
    ),
    (
        "node runtime concurrency",
        set_path("nodes", 0, "runtime", "max_concurrency", value=2),
        "nodes[gpu-1].runtime.max_concurrency",
        ["gpu-1"],
        [],
        [],
    ),
]


@pytest.mark.parametrize(
    ("edit", "path", "nodes", "providers", "models"),
    [row[1:] for row in LIVE],
    ids=[row[0] for row in LIVE],
)
def test_live_paths_apply_without_restart(edit, path, nodes, providers, models):
    outcome = run(edit)
    result = outcome.result
    assert (result.result, result.errors) == ("applied", [])
    assert [(e.path, e.change_class, e.applied) for e in result.report] == [(path, "live", True)]
    assert (result.changed_nodes, result.changed_providers, result.changed_models) == (
        nodes,
        providers,
        models,
    )
    # the running config is now the candidate: nothing is left to apply
    assert outcome.candidate is not None
    assert classify(outcome.running, outcome.candidate).entries == []
    assert result.config_hash == config_hash(outcome.running) == result.candidate_hash


RESTART = [
    ("edge identity", set_path("edge", value={"id": "other"}), "edge.id", [], []),
    ("listen", set_path("listen", value={"address": "127.0.0.1:7700"}), "listen.address", [], []),
    (
        "listen tls",
        set_path("listen", value={"tls": {"cert_file": "/etc/c.pem", "key_file": "/etc/k.pem"}}),
        "listen.tls",
        [],
        [],
    ),
    (
        "bootstrap heartbeat",
        set_path("bootstrap", value={"heartbeat_ms": 500}),
        "bootstrap.heartbeat_ms",
        [],
        [],
    ),
    (
        "bootstrap enabled",
        set_path("bootstrap", value={"enabled": True}),
        "bootstrap.enabled",
        [],
        [],
    ),
    ("logging", set_path("logging", value={"level": "debug"}), "logging.level", [], []),
    ("reload watch", set_path("reload", value={"watch": False}), "reload.watch", [], []),
    ("metrics", set_path("metrics", value={"listen": "127.0.0.1:1"}), "metrics.listen", [], []),
    ("console", set_path("console", value={"listen": "127.0.0.1:2"}), "console.listen", [], []),
    (
        "control_plane",
        set_path("control_plane", value={"url": "http://cp.example:1"}),
        "control_plane.url",
        [],
        [],
    ),
    ("a2a", set_path("a2a", value={"listen": "127.0.0.1:3"}), "a2a.listen", [], []),
    ("openai listen", set_path("openai", "listen", value="127.0.0.1:9"), "openai.listen", [], []),
    (
        "openai body limit",
        set_path("openai", "max_body_bytes", value=1024),
        "openai.max_body_bytes",
        [],
        [],
    ),
    (
        "openai provider_auth",
        set_path("openai", "provider_auth", value={"enabled": True}),
        "openai.provider_auth.enabled",
        [],
        [],
    ),
    (
        "principal token added",
        lambda d: d["openai"]["principal_tokens"].append(
            {"token_ref": "app2", "token_hash_sha256": HASH_B, "principal_ref": "team"}
        ),
        "openai.principal_tokens[app2]",
        [],
        [],
    ),
    (
        "principal token removed",
        set_path("openai", "principal_tokens", value=[]),
        "openai.principal_tokens[app]",
        [],
        [],
    ),
    (
        "model route changed",
        set_path("openai", "model_routes", 0, "target", value="gpt-4o"),
        "openai.model_routes[legacy].target",
        [],
        [],
    ),
    ("node added", lambda d: d["nodes"].append({"id": "gpu-2"}), "nodes[gpu-2]", ["gpu-2"], []),
    ("node alias", set_path("nodes", 0, "alias", value="box"), "nodes[gpu-1].alias", ["gpu-1"], []),
    (
        "node agent kind",
        set_path("nodes", 0, "agent_kind", value="desktop"),
        "nodes[gpu-1].agent_kind",
        ["gpu-1"],
        [],
    ),
    (
        "node token",
        set_path("nodes", 0, "token_hash_sha256", value=HASH_B),
        "nodes[gpu-1].token_hash_sha256",
        ["gpu-1"],
        [],
    ),
    (
        "adapter added",
        lambda d: node(d)["adapters"].append({"name": "spare", "type": "cli", "command": "true"}),
        "nodes[gpu-1].adapters[spare]",
        ["gpu-1"],
        [],
    ),
    (
        "adapter config",
        set_path("nodes", 0, "adapters", 0, "base_url", value="http://127.0.0.1:1/v1"),
        "nodes[gpu-1].adapters[vllm-main].base_url",
        ["gpu-1"],
        [],
    ),
    (
        "provider added",
        lambda d: node(d)["providers"].append(
            {"id": "extra", "type": "cli", "category": "cli", "models": ["x"]}
        ),
        "nodes[gpu-1].providers[extra]",
        ["gpu-1"],
        ["extra"],
    ),
    (
        "provider type",
        on_provider("vllm-a", type="seulgivibe_openai"),
        "nodes[gpu-1].providers[vllm-a].provider",
        ["gpu-1"],
        ["vllm-a"],
    ),
    (
        "provider category",
        on_provider("vllm-a", category="api"),
        "nodes[gpu-1].providers[vllm-a].category",
        ["gpu-1"],
        ["vllm-a"],
    ),
    (
        "provider models",
        on_provider("vllm-a", models=["chat", "more"]),
        "nodes[gpu-1].providers[vllm-a].models",
        ["gpu-1"],
        ["vllm-a"],
    ),
    (
        "provider health_check off",
        on_provider("vllm-a", health_check=False),
        "nodes[gpu-1].providers[vllm-a].health_check",
        ["gpu-1"],
        ["vllm-a"],
    ),
    (
        "provider health_check path",
        on_provider("vllm-a", health_check={"path": "/health"}),
        "nodes[gpu-1].providers[vllm-a].health_check.path",
        ["gpu-1"],
        ["vllm-a"],
    ),
    (
        "provider health_check timeout",
        on_provider("vllm-a", health_check={"timeout_ms": 500}),
        "nodes[gpu-1].providers[vllm-a].health_check.timeout_ms",
        ["gpu-1"],
        ["vllm-a"],
    ),
]
EXECUTION = [
    ("provider", "x"),
    ("endpoint", "/v2/chat"),
    ("base_url", "http://127.0.0.1:5/v1"),
    ("headers", {"X-A": "b"}),
    ("command", "true"),
    ("args", ["-x"]),
    ("env", {"A": "b"}),
    ("mode", "oneshot"),
    ("resume_args", ["-r"]),
    ("output_format", "json"),
    ("context_size", 4096),
    ("request_timeout_ms", 1000),
    ("native_apis", ["messages"]),
]
RESTART += [
    (
        f"provider {name}",
        on_provider("vllm-a", **{name: value}),
        f"nodes[gpu-1].providers[vllm-a].{name}",
        ["gpu-1"],
        ["vllm-a"],
    )
    for name, value in EXECUTION
]


@pytest.mark.parametrize(
    ("edit", "path", "nodes", "providers"),
    [row[1:] for row in RESTART],
    ids=[row[0] for row in RESTART],
)
def test_restart_paths_are_reported_and_left_unapplied(edit, path, nodes, providers):
    outcome = run(edit)
    result = outcome.result
    assert (result.result, result.errors) == ("restart_required", [])
    assert [(e.path, e.change_class, e.applied) for e in result.report] == [
        (path, "restart", False)
    ]
    assert (result.changed_nodes, result.changed_providers, result.changed_models) == (
        nodes,
        providers,
        [],
    )
    assert outcome.running == load(running_doc())  # nothing applied
    assert result.config_hash == config_hash(outcome.running) != result.candidate_hash


def test_adding_or_removing_a_whole_entity_is_one_entry():
    def edit(doc: dict[str, Any]) -> None:
        doc["nodes"].append(
            {
                "id": "gpu-2",
                "adapters": [{"name": "c", "type": "cli", "command": "cat"}],
                "providers": [{"id": "p2", "type": "cli", "category": "cli", "models": ["x"]}],
            }
        )
        node(doc)["providers"].pop()  # ollama-b removed ...
        doc["models"].pop()  # ... with the model that used it

    result = run(edit).result
    assert [(e.path, e.change_class) for e in result.report] == [
        ("models[qwen]", "live"),
        ("nodes[gpu-1].providers[ollama-b]", "restart"),
        ("nodes[gpu-2]", "restart"),
    ]
    added = next(e for e in result.report if e.path == "nodes[gpu-2]")
    assert (added.old, added.new["id"]) == (None, "gpu-2")
    assert result.changed_nodes == ["gpu-1", "gpu-2"]
    assert result.changed_providers == ["ollama-b", "p2"]


def test_mixed_live_and_restart_applies_the_live_part_only():
    def edit(doc: dict[str, Any]) -> None:
        provider(doc)["capacity"] = 6
        doc["logging"] = {"level": "debug"}

    outcome = run(edit)
    assert outcome.result.result == "restart_required"
    assert [(e.path, e.change_class, e.applied) for e in outcome.result.report] == [
        ("logging.level", "restart", False),
        ("nodes[gpu-1].providers[vllm-a].capacity", "live", True),
    ]
    assert outcome.running.nodes[0].providers[0].capacity == 6
    assert outcome.running.logging.level == "info"
    # the next refresh diffs against what runs: only the restart entry is left
    assert outcome.candidate is not None
    again = refresh(outcome.running, outcome.candidate, mode="apply").result
    assert [e.path for e in again.report] == ["logging.level"]


def test_reverting_returns_to_the_original_config():
    before = load(running_doc())
    changed = running_doc()
    provider(changed)["capacity"] = 6
    changed["logging"] = {"level": "debug"}
    first = refresh(before, load(changed), mode="apply")
    back = refresh(first.running, load(running_doc()), mode="apply")
    assert back.result.result == "applied"
    assert [(e.path, e.old, e.new, e.applied) for e in back.result.report] == [
        ("nodes[gpu-1].providers[vllm-a].capacity", 6, 4, True)
    ]
    assert back.running == before
    assert back.result.config_hash == config_hash(before)


def test_a_live_change_that_depends_on_a_restart_change_is_not_applied():
    def edit(doc: dict[str, Any]) -> None:
        node(doc)["providers"].append(
            {"id": "extra", "type": "cli", "category": "cli", "adapter": "shell", "models": ["x"]}
        )
        doc["models"].append({"id": "new", "context_window_tokens": 10, "providers": ["extra"]})
        provider(doc)["priority"] = 7  # an independent live change: not applied either

    outcome = run(edit)
    result = outcome.result
    assert result.result == "restart_required"
    assert {(e.path, e.change_class, e.applied) for e in result.report} == {
        ("models[new]", "live", False),
        ("nodes[gpu-1].providers[extra]", "restart", False),
        ("nodes[gpu-1].providers[vllm-a].priority", "live", False),
    }
    (error,) = result.errors
    assert error.path == "models[new].providers[extra]"
    assert "'extra' is not the id of any nodes[].providers[] entry" in error.message
    assert "no live change was applied" in error.message
    assert outcome.running == load(running_doc())


def test_dry_run_applies_nothing():
    outcome = run(on_provider("vllm-a", capacity=8), mode="dry_run")
    assert outcome.result.mode == "dry_run"
    assert outcome.result.result == "applied"
    assert [(e.change_class, e.applied) for e in outcome.result.report] == [("live", False)]
    assert outcome.running == load(running_doc())


def test_an_unknown_mode_is_rejected():
    result = run(on_provider("vllm-a", capacity=8), mode="yolo").result
    assert (result.result, result.report) == ("rejected", [])
    assert [(e.path, e.message) for e in result.errors] == [
        ("mode", "'yolo' is not a refresh mode; use dry_run or apply")
    ]


def test_an_invalid_candidate_is_rejected_with_the_validation_errors():
    result = run(on_provider("vllm-a", priority=-1, capcity=3)).result
    assert result.result == "rejected"
    assert [(e.path, e.message) for e in result.errors] == [
        ("nodes[gpu-1].providers[vllm-a].priority", "-1 is negative; priority must be >= 0"),
        (
            "nodes[gpu-1].providers[vllm-a].capcity",
            "unknown key 'capcity'; did you mean 'capacity'?",
        ),
    ]
    assert result.config_hash == config_hash(load(running_doc()))
    assert result.candidate_hash is None


def test_a_yaml_error_in_the_candidate_is_rejected_with_line_and_column():
    result = refresh(load(running_doc()), "models: [\n", mode="apply", source="edge.yaml").result
    assert result.result == "rejected"
    assert result.errors[0].message.startswith("edge.yaml:2:1: YAML syntax error")


def test_identical_or_equivalent_content_is_applied_with_an_empty_report():
    doc = running_doc()
    block = yaml.safe_dump(doc, default_flow_style=False, sort_keys=True)
    flow = yaml.safe_dump(doc, default_flow_style=True, sort_keys=False)
    for text in (block, flow):
        outcome = refresh(load(doc), text, mode="apply")
        assert (outcome.result.result, outcome.result.report) == ("applied", [])
        assert outcome.result.config_hash == outcome.result.candidate_hash
    # a legacy spelling that normalizes to the same effective config is no change either
    legacy = copy.deepcopy(doc)
    provider(legacy)["adapter"] = "openai_compat"
    del provider(legacy, "ollama-b")["adapter"]
    outcome = refresh(load(doc), yaml.safe_dump(legacy), mode="apply")
    assert (outcome.result.result, outcome.result.report) == ("applied", [])


def test_the_content_hash_ignores_key_order_formatting_and_entity_order():
    doc = running_doc()
    shuffled = copy.deepcopy(doc)
    shuffled["nodes"][0]["providers"].reverse()
    shuffled["models"].reverse()
    shuffled = dict(reversed(list(shuffled.items())))
    assert config_hash(load(doc)) == config_hash(load(shuffled))
    assert config_hash(load(doc)) != config_hash(load(on_provider_copy(doc, capacity=5)))
    # the order of a model's providers is meaningful (round-robin order): it changes the hash
    reordered = copy.deepcopy(doc)
    reordered["models"][0]["providers"] = ["vllm-a"]
    assert config_hash(load(doc)) == config_hash(load(reordered))


def on_provider_copy(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of ``doc`` with the first provider's fields updated."""
    doc = copy.deepcopy(doc)
    provider(doc).update(changes)
    return doc


def test_principal_token_changes_are_restart_and_never_show_the_hash():
    result = run(
        set_path("openai", "principal_tokens", 0, "token_hash_sha256", value=HASH_B)
    ).result
    assert result.result == "restart_required"
    (entry,) = result.report
    assert (entry.path, entry.old, entry.new) == (
        "openai.principal_tokens[app].token_hash_sha256",
        "<redacted>",
        "<redacted>",
    )
    removed = run(set_path("openai", "principal_tokens", value=[])).result.report[0]
    assert removed.old == {
        "token_ref": "app",
        "token_hash_sha256": "<redacted>",
        "principal_ref": "team",
    }
    for r in (result, removed):
        dumped = json.dumps(r.to_json() if isinstance(r, RefreshResult) else r.model_dump())
        assert HASH_A not in dumped
        assert HASH_B not in dumped


def test_secret_header_values_are_redacted_in_the_report():
    result = run(set_path("nodes", 0, "adapters", 0, "headers", value={"Authorization": "sk-1"}))
    (entry,) = result.result.report
    assert (entry.path, entry.old, entry.new) == (
        "nodes[gpu-1].adapters[vllm-main].headers",
        None,
        {"Authorization": "<redacted>"},
    )
    assert "sk-1" not in json.dumps(result.result.to_json())


def legacy_running(
    max_queue: int, timeout: int, pool: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A running document with the legacy per-provider queue fields and no provider_pool."""
    doc = base_doc()
    del doc["provider_pool"]
    provider(doc).update({"max_queue": max_queue, "queue_timeout_ms": timeout})
    if pool is not None:
        doc["provider_pool"] = pool
    return doc


def test_legacy_queue_values_never_appear_in_the_diff_when_provider_pool_is_present():
    pool = {"max_queue": 5}
    result = refresh(load(legacy_running(8, 100, pool)), load(legacy_running(2, 9, pool))).result
    assert (result.result, result.report) == ("applied", [])


def test_without_provider_pool_the_promoted_legacy_policy_is_compared():
    result = refresh(load(legacy_running(8, 100)), load(legacy_running(4, 100)), mode="apply")
    assert [(e.path, e.change_class, e.old, e.new) for e in result.result.report] == [
        ("provider_pool.max_queue", "live", 8, 4)
    ]
    assert result.running.provider_pool.max_queue == 4


def test_report_and_changed_lists_are_sorted_and_always_present():
    def edit(doc: dict[str, Any]) -> None:
        provider(doc, "ollama-b")["priority"] = 1
        provider(doc, "vllm-a")["priority"] = 1
        doc["models"][1]["display_name"] = "Q"
        doc["models"][0]["display_name"] = "C"

    result = run(edit).result
    assert [e.path for e in result.report] == sorted(e.path for e in result.report)
    assert result.changed_providers == ["ollama-b", "vllm-a"]
    assert result.changed_models == ["chat", "qwen"]
    empty = refresh(load(running_doc()), load(running_doc())).result.to_json()
    for key in ("changed_nodes", "changed_providers", "changed_models", "report", "errors"):
        assert empty[key] == []


def test_the_shipped_config_refreshes_against_itself_as_a_no_op():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "configs/edge.yaml").read_text()
    outcome = refresh(load_config(text), text, mode="apply")
    assert (outcome.result.result, outcome.result.report) == ("applied", [])


def test_a_changed_secret_header_value_is_reported_redacted():
    before = running_doc()
    node(before)["adapters"][0]["headers"] = {"Authorization": "sk-old"}
    after = copy.deepcopy(before)
    node(after)["adapters"][0]["headers"] = {"Authorization": "sk-new"}
    (entry,) = refresh(load(before), load(after)).result.report
    assert (entry.path, entry.old, entry.new) == (
        "nodes[gpu-1].adapters[vllm-main].headers.Authorization",
        "<redacted>",
        "<redacted>",
    )

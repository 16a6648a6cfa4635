"""Hypothesis strategies: valid config documents, and mutations of them."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from hypothesis import strategies as st

PROVIDER_TYPES = ("openai_compat", "ollama", "cli", "seulgivibe_claude", "seulgivibe_openai")
RUNTIME = {"seulgivibe_claude": "openai_compat", "seulgivibe_openai": "openai_compat"}
ADAPTER_NAMES = {"openai_compat": "oa-main", "ollama": "ol-main", "cli": "cli-main"}


@st.composite
def valid_docs(draw: st.DrawFn, max_nodes: int = 3, max_models: int = 4) -> dict[str, Any]:
    """A valid config document with varied shapes: optional fields omitted or set, legacy
    forms (type-name adapter references, bare provider ids, seulgivibe types), disabled
    providers, provider_pool present or legacy queue values promoted."""
    n_nodes = draw(st.integers(1, max_nodes))
    use_pool = draw(st.booleans())
    legacy_pair = draw(st.sampled_from([None, (0, None), (8, 1000), (None, 0)]))
    nodes: list[dict[str, Any]] = []
    providers: list[dict[str, Any]] = []
    for n in range(n_nodes):
        adapters: list[dict[str, Any]] = [
            {
                "name": "oa-main",
                "type": "openai_compat",
                "base_url": f"http://127.0.0.1:{8000 + n}/v1",
            },
            {"name": "ol-main", "type": "ollama", "base_url": f"http://127.0.0.1:{11000 + n}"},
            {
                "name": "cli-main",
                "type": "cli",
                "command": "cat",
                "output_format": draw(st.sampled_from(["text", "json", "stream-json"])),
            },
        ]
        if draw(st.booleans()):
            adapters.append(
                {
                    "name": "spare",
                    "type": "openai_compat",
                    "enabled": False,
                    "base_url": "http://127.0.0.1:9/v1",
                }
            )
        node_providers: list[dict[str, Any]] = []
        for p in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from(PROVIDER_TYPES))
            runtime = RUNTIME.get(kind, kind)
            capacity = draw(st.integers(1, 8))
            entry: dict[str, Any] = {
                "id": f"n{n}-p{p}",
                "type": kind,
                "category": "cli"
                if runtime == "cli"
                else draw(st.sampled_from(["api", "local_inference"])),
                "models": [f"up-{n}-{p}"],
                "capacity": capacity,
            }
            ref_style = draw(st.sampled_from(["exact", "type", "omitted"]))
            if ref_style == "exact":
                entry["adapter"] = ADAPTER_NAMES[runtime]
            elif ref_style == "type":
                entry["adapter"] = runtime
            if draw(st.booleans()):
                entry["long_context_capacity"] = draw(st.integers(0, capacity))
            if draw(st.booleans()):
                entry["priority"] = draw(st.integers(0, 20))
            if draw(st.integers(0, 4)) == 0:
                entry["enabled"] = False
            if draw(st.booleans()):
                entry["request_timeout_ms"] = draw(st.integers(1, 600_000))
            if not use_pool and legacy_pair is not None:
                mq, qt = legacy_pair
                if mq is not None:
                    entry["max_queue"] = mq
                if qt is not None:
                    entry["queue_timeout_ms"] = qt
            node_providers.append(entry)
            providers.append(entry)
        node_doc: dict[str, Any] = {
            "id": f"n{n}",
            "adapters": adapters,
            "providers": node_providers,
        }
        if draw(st.booleans()):
            node_doc["alias"] = f"host {n}"
        if draw(st.booleans()):
            node_doc["runtime"] = {"max_concurrency": draw(st.integers(1, 64))}
        nodes.append(node_doc)

    models: list[dict[str, Any]] = []
    for m in range(draw(st.integers(1, max_models))):
        window = draw(st.sampled_from([4096, 8192, 131072]))
        chosen = draw(
            st.lists(
                st.sampled_from(providers), min_size=1, max_size=4, unique_by=lambda p: p["id"]
            )
        )
        refs: list[Any] = []
        for provider in chosen:
            if draw(st.booleans()):
                provider["models"].append(f"m{m}")  # resolved by the group id
                refs.append(provider["id"])
            else:
                refs.append({"id": provider["id"], "target": f"target-{m}"})
        model: dict[str, Any] = {"id": f"m{m}", "context_window_tokens": window, "providers": refs}
        if draw(st.booleans()):
            model["display_name"] = f"Model {m}"
        if draw(st.booleans()):
            model["default_max_tokens"] = draw(st.integers(16, 4096))
            if draw(st.booleans()):
                model["min_max_tokens"] = draw(st.integers(1, model["default_max_tokens"]))
        if draw(st.booleans()):
            model["default_thinking_token_budget"] = draw(st.integers(0, 4096))
        models.append(model)

    # total_context_tokens must cover every referencing model's window × long slots
    for provider in providers:
        if draw(st.integers(0, 3)) == 0:
            long = provider.get("long_context_capacity", provider["capacity"])
            provider["total_context_tokens"] = max(131072 * long, 1) + draw(st.integers(0, 1000))

    doc: dict[str, Any] = {"models": models, "nodes": nodes}
    if use_pool:
        pool: dict[str, Any] = {}
        if draw(st.booleans()):
            pool["max_queue"] = draw(st.integers(0, 100))
        if draw(st.booleans()):
            pool["queue_timeout_ms"] = draw(st.integers(0, 60_000))
        if draw(st.integers(0, 3)) == 0:
            pool["shared"] = draw(shared_sections())
        doc["provider_pool"] = pool
    if draw(st.booleans()):
        doc["long_context_threshold_tokens"] = draw(st.integers(1, 200_000))
    tokens = draw(st.integers(0, 3))
    if tokens:
        doc["openai"] = {
            "principal_tokens": [
                {
                    "token_ref": f"app-{t}",
                    "principal_ref": f"team-{t % 2}",
                    "token_hash_sha256": hashlib.sha256(f"t{t}".encode()).hexdigest(),
                }
                for t in range(tokens)
            ]
        }
    if draw(st.booleans()):
        doc["logging"] = {
            "level": draw(st.sampled_from(["debug", "info"])),
            "format": draw(st.sampled_from(["json", "console"])),
        }
    return doc


#: Valid store URLs of ``provider_pool.shared.store``, one of each form.
STORE_URLS = (
    "redis://127.0.0.1:6379/0",
    "redis://:pw-one@10.0.0.5:6379/2",
    "rediss://edge:pw-two@redis.internal",
    "unix:///run/redis/redis.sock?db=1",
)


@st.composite
def shared_sections(draw: st.DrawFn) -> dict[str, Any]:
    """A valid ``provider_pool.shared``: a store URL, the other fields set or left out."""
    shared: dict[str, Any] = {"store": draw(st.sampled_from(STORE_URLS))}
    if draw(st.booleans()):
        shared["lease_ttl_ms"] = draw(st.integers(1_000, 600_000))
    if draw(st.booleans()):
        shared["on_store_down"] = draw(st.sampled_from(["static_split", "reject"]))
    return shared


# A place inside a document: the mapping keys and list indices that lead to it.
Location = tuple[str | int, ...]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.text(max_size=8),
    st.floats(allow_nan=False, allow_infinity=False),
)
yaml_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


def _locations(value: Any, loc: Location = ()) -> list[Location]:
    """Every location inside a document (mapping keys and list indices)."""
    found = [loc]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _locations(v, (*loc, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _locations(v, (*loc, i))
    return found


@st.composite
def mutated_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid document with one to three random mutations (see :func:`mutate`)."""
    return mutate(draw, copy.deepcopy(draw(valid_docs(max_nodes=2, max_models=2))))


def mutate(draw: st.DrawFn, doc: dict[str, Any]) -> dict[str, Any]:
    """Apply one to three random mutations to ``doc`` in place and return it: a key deleted, a
    value replaced by an arbitrary YAML value, an unknown key added, a list item duplicated."""
    for _ in range(draw(st.integers(1, 3))):
        loc = draw(st.sampled_from(_locations(doc)[1:]))
        parent: Any = doc
        for part in loc[:-1]:
            parent = parent[part]
        last = loc[-1]
        action = draw(st.sampled_from(["delete", "replace", "unknown_key", "duplicate"]))
        if action == "delete":
            del parent[last]
        elif action == "replace":
            parent[last] = draw(yaml_values)
        elif action == "unknown_key" and isinstance(parent[last], dict):
            parent[last][draw(st.text(min_size=1, max_size=6))] = draw(scalars)
        elif action == "duplicate" and isinstance(parent, list) and isinstance(last, int):
            parent.append(copy.deepcopy(parent[last]))
    return doc


def _providers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for n in doc["nodes"] for p in n["providers"]]


@st.composite
def edited_pairs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A valid document and a valid edit of it: live edits (capacity, priority, enabled, queue
    policy, the shared pool's lease TTL and store-down mode, model fields, runtime metadata)
    mixed with restart edits (logging, adapter URLs, provider labels, a new node, a removed
    provider that no model needs, the shared pool's store, the shared pool added or
    removed)."""
    before = draw(valid_docs())
    after = copy.deepcopy(before)
    for _ in range(draw(st.integers(0, 6))):
        edit = draw(
            st.sampled_from(
                [
                    "capacity",
                    "priority",
                    "enabled",
                    "pool",
                    "threshold",
                    "display",
                    "window",
                    "runtime",
                    "logging",
                    "base_url",
                    "label",
                    "add_node",
                    "drop_model",
                    "shared",
                    "shared_live",
                    "store",
                ]
            )
        )
        provider = draw(st.sampled_from(_providers(after)))
        model = draw(st.sampled_from(after["models"]))
        if edit == "capacity":
            provider["capacity"] = draw(st.integers(1, 8))
            provider["long_context_capacity"] = draw(st.integers(0, provider["capacity"]))
            provider.pop("total_context_tokens", None)
        elif edit == "priority":
            provider["priority"] = draw(st.integers(0, 20))
        elif edit == "enabled":
            provider["enabled"] = not provider.get("enabled", True)
        elif edit == "pool":
            after["provider_pool"] = {
                "max_queue": draw(st.integers(1, 50)),
                "queue_timeout_ms": draw(st.integers(0, 9000)),
            }
        elif edit == "threshold":
            after["long_context_threshold_tokens"] = draw(st.integers(1, 10**6))
        elif edit == "display":
            model["display_name"] = draw(st.text(min_size=1, max_size=8))
        elif edit == "window":
            model["context_window_tokens"] = 131072
        elif edit == "runtime":
            after["nodes"][0]["runtime"] = {"max_concurrency": draw(st.integers(1, 99))}
        elif edit == "logging":
            after["logging"] = {"level": "debug", "format": "console"}
        elif edit == "base_url":
            after["nodes"][0]["adapters"][0]["base_url"] = "http://127.0.0.1:9999/v1"
        elif edit == "label":
            provider["provider"] = draw(st.sampled_from(["vllm", "llama.cpp"]))
        elif edit == "add_node" and not any(n["id"] == "extra" for n in after["nodes"]):
            extra = {"id": "extra-p", "type": "cli", "category": "cli", "models": ["x"]}
            for legacy in ("max_queue", "queue_timeout_ms"):  # agree with the legacy policy
                if legacy in provider:
                    extra[legacy] = provider[legacy]
            after["nodes"].append(
                {
                    "id": "extra",
                    "adapters": [{"name": "c", "type": "cli", "command": "cat"}],
                    "providers": [extra],
                }
            )
            if draw(st.booleans()):  # a live model that needs the restart-only provider
                after["models"].append(
                    {"id": "needs-extra", "context_window_tokens": 10, "providers": ["extra-p"]}
                )
        elif edit == "drop_model" and len(after["models"]) > 1:
            after["models"].remove(model)
        elif edit == "shared":  # added or removed (restart)
            pool = after.setdefault("provider_pool", {})
            if pool.pop("shared", None) is None:
                pool["shared"] = draw(shared_sections())
        elif edit == "shared_live" and "shared" in after.get("provider_pool", {}):
            shared = after["provider_pool"]["shared"]
            shared["lease_ttl_ms"] = draw(st.integers(1_000, 600_000))
            shared["on_store_down"] = draw(st.sampled_from(["static_split", "reject"]))
        elif edit == "store" and "shared" in after.get("provider_pool", {}):
            after["provider_pool"]["shared"]["store"] = draw(st.sampled_from(STORE_URLS))
    return before, after

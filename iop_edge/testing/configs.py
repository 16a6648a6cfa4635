"""Generated configs for tests and benchmarks: deterministic, valid, and as large as asked."""

from __future__ import annotations

import random
from typing import Any


def generate_config(
    nodes: int = 2,
    providers_per_node: int = 3,
    models: int = 4,
    *,
    seed: int = 0,
    providers_per_model: int = 3,
) -> dict[str, Any]:
    """A valid config document (as parsed YAML) of the given size.

    Every node has one adapter of each type; providers cycle through the types and are spread
    over the models round-robin (each model references ``providers_per_model`` providers, each
    asking for the model by its group id). Values vary with ``seed``.
    """
    rng = random.Random(seed)
    types = ("openai_compat", "ollama", "cli")
    categories = {"openai_compat": "local_inference", "ollama": "local_inference", "cli": "cli"}
    model_ids = [f"model-{m}" for m in range(models)]
    node_docs: list[dict[str, Any]] = []
    provider_ids: list[str] = []
    for n in range(nodes):
        node_id = f"node-{n}"
        providers = []
        for p in range(providers_per_node):
            kind = types[p % len(types)]
            capacity = rng.randint(1, 8)
            pid = f"{node_id}-p{p}"
            provider_ids.append(pid)
            providers.append(
                {
                    "id": pid,
                    "type": kind,
                    "category": categories[kind],
                    "adapter": f"{kind}-main",
                    "models": [],  # filled in below from the groups that use it
                    "capacity": capacity,
                    "long_context_capacity": rng.randint(0, capacity),
                    "priority": rng.randint(0, 20),
                }
            )
        node_docs.append(
            {
                "id": node_id,
                "alias": f"host {n}",
                "runtime": {"max_concurrency": rng.randint(1, 64)},
                "adapters": [
                    {
                        "name": "openai_compat-main",
                        "type": "openai_compat",
                        "base_url": f"http://127.0.0.1:{8000 + n % 1000}/v1",
                    },
                    {
                        "name": "ollama-main",
                        "type": "ollama",
                        "base_url": f"http://127.0.0.1:{11000 + n % 1000}",
                    },
                    {"name": "cli-main", "type": "cli", "command": "cat", "output_format": "text"},
                ],
                "providers": providers,
            }
        )
    by_id = {p["id"]: p for node in node_docs for p in node["providers"]}
    model_docs = []
    for m, model_id in enumerate(model_ids):
        count = min(providers_per_model, len(provider_ids))
        start = (m * count) % max(len(provider_ids), 1)
        refs = [provider_ids[(start + k) % len(provider_ids)] for k in range(count)]
        for ref in refs:
            by_id[ref]["models"].append(model_id)
        model_docs.append(
            {
                "id": model_id,
                "display_name": f"Model {m}",
                "context_window_tokens": rng.choice([8192, 32768, 131072]),
                "providers": refs,
                "default_max_tokens": rng.choice([256, 1024]),
            }
        )
    for provider in by_id.values():
        if not provider["models"]:
            provider["models"].append(f"upstream-{provider['id']}")
    return {
        "edge": {"id": "edge-gen"},
        "provider_pool": {"max_queue": 64, "queue_timeout_ms": 30000},
        "models": model_docs,
        "nodes": node_docs,
    }

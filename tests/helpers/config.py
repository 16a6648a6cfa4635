"""Small builders for config tests: a minimal valid document and ways to look at its problems."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from iop_edge.config import ConfigError, EdgeConfig, parse_config
from iop_edge.errors import ConfigProblem

#: The smallest valid config as text: the echo model on a `cat` cli provider.
MINIMAL_YAML = """\
models:
  - {id: echo, context_window_tokens: 8192, providers: [cat]}
nodes:
  - id: local
    adapters: [{name: shell, type: cli, command: cat}]
    providers:
      - {id: cat, type: cli, category: cli, adapter: shell, models: [echo]}
"""

HASH_A = "a" * 64
HASH_B = "b" * 64


def base_doc() -> dict[str, Any]:
    """A minimal valid document: one node with one adapter of each type, one model."""
    return {
        "provider_pool": {"max_queue": 16, "queue_timeout_ms": 30000},
        "models": [
            {"id": "chat", "context_window_tokens": 8192, "providers": ["vllm-a"]},
        ],
        "nodes": [
            {
                "id": "gpu-1",
                "adapters": [
                    {
                        "name": "vllm-main",
                        "type": "openai_compat",
                        "base_url": "http://127.0.0.1:8000/v1",
                    },
                    {
                        "name": "ollama-local",
                        "type": "ollama",
                        "base_url": "http://127.0.0.1:11434",
                    },
                    {"name": "shell", "type": "cli", "command": "cat"},
                ],
                "providers": [
                    {
                        "id": "vllm-a",
                        "type": "openai_compat",
                        "category": "local_inference",
                        "adapter": "vllm-main",
                        "models": ["chat"],
                    },
                ],
            }
        ],
    }


def node(doc: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """The node at ``index`` of a document (to edit in place)."""
    result: dict[str, Any] = doc["nodes"][index]
    return result


def provider(doc: dict[str, Any], pid: str = "vllm-a") -> dict[str, Any]:
    """The provider with id ``pid`` of a document (to edit in place)."""
    for n in doc["nodes"]:
        for p in n["providers"]:
            if p["id"] == pid:
                result: dict[str, Any] = p
                return result
    raise KeyError(pid)


def load(doc: dict[str, Any], env: dict[str, str] | None = None) -> EdgeConfig:
    """Load a document (a deep copy, so the caller's stays as it was)."""
    return parse_config(copy.deepcopy(doc), env=env)


def problems(doc: Any, env: dict[str, str] | None = None) -> list[ConfigProblem]:
    """The problems a document is rejected with (fails the test when it loads)."""
    with pytest.raises(ConfigError) as info:
        parse_config(copy.deepcopy(doc), env=env)
    return info.value.problems


def problem_at(doc: Any, path: str) -> str:
    """The message of the one problem reported at ``path``."""
    found = [p for p in problems(doc) if p.path == path]
    assert len(found) == 1, f"expected one problem at {path}, got {problems(doc)}"
    return found[0].message


def with_shared(**fields: Any) -> dict[str, Any]:
    """The base document with ``provider_pool.shared`` set to ``fields``."""
    doc = base_doc()
    doc["provider_pool"]["shared"] = fields
    return doc

"""The edges of the API tests: a real daemon in front of the fake upstreams with one provider
per adapter type (:func:`edge_doc`), started on an ephemeral port (:func:`running_edge`),
with an SDK client holding :data:`TOKEN` (:func:`edge_client`); and two principals sharing one
slot (:func:`principals_doc`, the fair-share tests). The fixtures built on them are in
``tests/api/conftest.py``."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai

from iop_edge.config import parse_config
from iop_edge.daemon import Daemon
from iop_edge.seams import Clock
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.tokens import token_hash
from tests.helpers import FAKE_CLI, doc_for

TOKEN = "iop_test-token-chat"
"""The token of :func:`edge_doc`'s principal ``app-chat`` (the SDK client's)."""


OTHER_TOKEN = "iop_test-token-batch"
"""The token of :func:`edge_doc`'s other principal, ``app-batch``."""


def token_entry(ref: str, token: str) -> dict[str, str]:
    """An ``openai.principal_tokens`` entry of principal ``team-a`` for ``token``."""
    return {
        "token_ref": ref,
        "principal_ref": "team-a",
        "token_hash_sha256": hashlib.sha256(token.encode()).hexdigest(),
    }


def edge_doc(oa: FakeOpenAI, ol: FakeOllama, *, capacity: int = 4) -> dict[str, Any]:
    """An edge with one provider per adapter type, each behind its own model group:
    ``chat-oa`` (openai_compat, upstream ``fake-model``), ``chat-ol`` (ollama) and
    ``chat-cli`` (the fake agent, stream-json), plus the route ``legacy`` and ``echo`` (cat)."""
    return {
        "openai": {
            "listen": "127.0.0.1:0",
            "principal_tokens": [
                token_entry("app-chat", TOKEN),
                token_entry("app-batch", OTHER_TOKEN),
            ],
            "model_routes": [{"model": "legacy", "adapter": "oa", "target": "fake-model"}],
        },
        "provider_pool": {"max_queue": 2, "queue_timeout_ms": 30000},
        "models": [
            {
                "id": "chat-oa",
                "context_window_tokens": 4096,
                "providers": ["up"],
                "default_max_tokens": 64,
                "min_max_tokens": 8,
            },
            {"id": "chat-ol", "context_window_tokens": 4096, "providers": ["lo"]},
            {"id": "chat-cli", "context_window_tokens": 4096, "providers": ["agent"]},
            {"id": "echo", "context_window_tokens": 4096, "providers": ["cat"]},
        ],
        "nodes": [
            {
                "id": "n1",
                "adapters": [
                    {"name": "oa", "type": "openai_compat", "base_url": oa.base_url},
                    {"name": "ol", "type": "ollama", "base_url": ol.base_url},
                    {"name": "shell", "type": "cli", "command": "cat"},
                ],
                "providers": [
                    {
                        "id": "up",
                        "type": "openai_compat",
                        "category": "local_inference",
                        "adapter": "oa",
                        "models": ["fake-model"],
                        "capacity": capacity,
                    },
                    {
                        "id": "lo",
                        "type": "ollama",
                        "category": "local_inference",
                        "adapter": "ol",
                        "models": ["fake-model"],
                        "capacity": capacity,
                    },
                    {
                        "id": "agent",
                        "type": "cli",
                        "category": "cli",
                        "adapter": "shell",
                        "models": ["agent"],
                        "capacity": capacity,
                        "command": FAKE_CLI[0],
                        "args": [*FAKE_CLI[1:], "--format", "stream-json"],
                        "output_format": "stream-json",
                        "request_timeout_ms": 20000,
                    },
                    {
                        "id": "cat",
                        "type": "cli",
                        "category": "cli",
                        "adapter": "shell",
                        "models": ["echo"],
                        "capacity": capacity,
                    },
                ],
            }
        ],
    }


@contextlib.asynccontextmanager
async def running_edge(doc: dict[str, Any], clock: Clock | None = None) -> AsyncIterator[Daemon]:
    """Start a daemon on an ephemeral port; stop it (and its adapters) afterwards."""
    daemon = Daemon(parse_config(doc), clock=clock) if clock else Daemon(parse_config(doc))
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop()


@contextlib.asynccontextmanager
async def edge_client(
    doc: dict[str, Any], clock: Clock | None = None
) -> AsyncIterator[tuple[Daemon, openai.AsyncOpenAI]]:
    """A running edge and an SDK client holding :data:`TOKEN` (no retries)."""
    async with (
        running_edge(doc, clock) as daemon,
        openai.AsyncOpenAI(base_url=daemon.openai_url, api_key=TOKEN, max_retries=0) as client,
    ):
        yield daemon, client


TOKENS = {"app-a": "iop_token-of-app-a", "app-b": "iop_token-of-app-b"}
"""The tokens of :func:`principals_doc`: one per app, each its own principal."""


def principals_doc(fake: FakeOpenAI, capacity: int = 1) -> dict[str, Any]:
    """Model ``chat`` on one provider with ``capacity`` slots; one token (and principal) per
    app."""
    doc = doc_for(fake, capacity=capacity)
    doc["openai"]["principal_tokens"] = [
        {"token_ref": ref, "token_hash_sha256": token_hash(raw), "principal_ref": ref}
        for ref, raw in TOKENS.items()
    ]
    return doc


def anthropic_client(daemon: Daemon, token: str = TOKEN) -> anthropic.AsyncAnthropic:
    """An ``anthropic`` SDK client of ``daemon`` holding ``token`` as ``ANTHROPIC_API_KEY``
    does (``x-api-key``), without retries."""
    base = daemon.openai_url.removesuffix("/v1")
    return anthropic.AsyncAnthropic(base_url=base, api_key=token, max_retries=0)


def request_lines(log: io.StringIO) -> list[dict[str, Any]]:
    """The request lines the edge has logged to ``log`` (JSON), in order."""
    lines = (json.loads(line) for line in log.getvalue().splitlines() if line.strip())
    return [line for line in lines if line.get("event") == "request"]

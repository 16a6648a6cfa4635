"""A real edge on 127.0.0.1 in front of the fake upstreams, and clients for it."""

from __future__ import annotations

import contextlib
import hashlib
import io
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from iop_edge.config import parse_config
from iop_edge.daemon import Daemon
from iop_edge.logs import configure_logging
from iop_edge.seams import Clock
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.conftest import LogCapture
from tests.helpers import FAKE_CLI

TOKEN = "iop_test-token-chat"
OTHER_TOKEN = "iop_test-token-batch"


def token_entry(ref: str, token: str) -> dict[str, str]:
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


@pytest.fixture
async def fake_oa() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
async def fake_ol() -> AsyncIterator[FakeOllama]:
    async with FakeOllama() as fake:
        yield fake


@pytest.fixture
def log_stream() -> io.StringIO:
    """Every structured log line the edge writes during the test."""
    stream = LogCapture()
    configure_logging("debug", "json", stream)
    return stream


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


@pytest.fixture
async def edge(
    fake_oa: FakeOpenAI, fake_ol: FakeOllama, log_stream: io.StringIO
) -> AsyncIterator[Daemon]:
    async with running_edge(edge_doc(fake_oa, fake_ol)) as daemon:
        yield daemon


@pytest.fixture
async def client(edge: Daemon) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=edge.openai_url, api_key=TOKEN, max_retries=0) as c:
        yield c

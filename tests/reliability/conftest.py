"""Fixtures of the reliability harness: captured logs and the fake upstreams."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import pytest

from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI


@pytest.fixture(autouse=True)
def _logs_captured(log_stream: io.StringIO) -> None:
    """Every reliability test captures the edge's log (kept off the terminal)."""


@pytest.fixture
async def fake_oa() -> AsyncIterator[FakeOpenAI]:
    """A fake OpenAI-compatible upstream on 127.0.0.1."""
    async with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
async def fake_ol() -> AsyncIterator[FakeOllama]:
    """A fake Ollama upstream on 127.0.0.1."""
    async with FakeOllama() as fake:
        yield fake

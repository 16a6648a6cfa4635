"""Fixtures of the API tests: the fake upstreams, a real edge on 127.0.0.1 in front of them
and an SDK client for it (the edge itself is built by ``tests/helpers/api.py``)."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import openai
import pytest

from iop_edge.daemon import Daemon
from iop_edge.runtime.logs import configure_logging
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import LogCapture
from tests.helpers.api import TOKEN, edge_doc, running_edge


@pytest.fixture
def log_stream() -> io.StringIO:
    """Every structured log line the edge writes during the test."""
    stream = LogCapture()
    configure_logging("debug", "json", stream)
    return stream


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

"""Shared test settings.

Hypothesis runs derandomized (a fixed seed per test) so that a CI run is repeatable; set
``HYPOTHESIS_PROFILE=explore`` locally to search with fresh random examples.
"""

from __future__ import annotations

import io
import os
import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import HealthCheck, settings

from iop_edge.runtime.logs import configure_logging
from iop_edge.testing.fake_ollama import FakeOllama
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.redis_server import RedisServer
from tests.helpers import LogCapture

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def log_stream() -> io.StringIO:
    """Every structured log line the edge writes during the test (info level, JSON); a
    directory's conftest may override it (``tests/api`` logs at debug level)."""
    stream = LogCapture()
    configure_logging("info", "json", stream)
    return stream


@pytest.fixture(autouse=True, scope="session")
def runtime_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every daemon the tests start (in this process or a subprocess) records its console
    address under a private ``$XDG_RUNTIME_DIR``, never in the machine's ``/run/iop-edge``."""
    directory = tmp_path_factory.mktemp("xdg-runtime")
    directory.chmod(0o700)
    before = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(directory)
    yield
    if before is None:
        del os.environ["XDG_RUNTIME_DIR"]
    else:
        os.environ["XDG_RUNTIME_DIR"] = before


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


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real ``redis-server`` for the session, started at its first use: 127.0.0.1 at a free
    port and a unix socket, with a password, saving nothing. A test that kills or stops a
    server uses its own (:class:`RedisServer` as a context manager), not this one."""
    with RedisServer(password=secrets.token_hex(8)) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's ``redis-server``, emptied for this test: its ``redis://`` URL (with the
    password)."""
    redis_server.flushall()
    return redis_server.url

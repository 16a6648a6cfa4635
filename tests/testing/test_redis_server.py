"""The real ``redis-server`` of the tests (:mod:`iop_edge.testing.redis_server`): found or
explained, started on a free port and a unix socket, killed, stopped and started again on the
same addresses."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from iop_edge.testing import redis_server as module
from iop_edge.testing.leaks import BOUND, wait_for
from iop_edge.testing.redis_server import RedisServer, RedisServerNotFound, find_redis_server


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer(password="pw-of-this-test") as started:
        yield started


def answers(url: str) -> bool:
    with redis.Redis.from_url(
        url, socket_timeout=BOUND, socket_connect_timeout=BOUND, retry=Retry(NoBackoff(), 0)
    ) as client:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False


def test_it_answers_on_loopback_and_on_its_unix_socket_with_its_password(server):
    assert server.url == f"redis://:pw-of-this-test@127.0.0.1:{server.port}/0"
    assert server.unix_url == f"unix://:pw-of-this-test@{server.socket_path}?db=0"
    assert answers(server.url)
    assert answers(server.unix_url)
    with socket.create_connection(("127.0.0.1", server.port), timeout=BOUND) as plain:
        plain.sendall(b"PING\r\n")
        assert plain.recv(100).startswith(b"-NOAUTH")
    with redis.Redis.from_url(server.url) as client:
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}


def test_killed_it_answers_no_more_and_restarts_on_the_same_addresses(server):
    port, url = server.port, server.url
    with redis.Redis.from_url(url) as client:
        client.set("k", "v")
    server.kill()
    assert not server.running
    assert not answers(url)
    server.start()
    assert (server.port, server.url) == (port, url)
    assert answers(server.unix_url)
    with redis.Redis.from_url(url) as client:
        assert client.get("k") is None  # nothing was saved
    server.restart()
    assert server.running
    assert server.port == port
    assert answers(url)
    server.stop()
    assert not answers(url)
    server.flushall()  # (starts it again first)
    assert answers(url)


def test_a_port_taken_before_the_server_binds_it_is_replaced(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = iter([busy])
        real = module._free_port
        monkeypatch.setattr(module, "_free_port", lambda: next(ports, None) or real())
        with RedisServer() as server:
            assert server.port != busy
            assert answers(server.url)
            assert "Address already in use" in server.output


def test_the_binary_is_found_through_the_variable_then_path(monkeypatch, tmp_path):
    real = find_redis_server()
    link = tmp_path / "my-redis"
    link.symlink_to(real)
    monkeypatch.setenv("IOP_EDGE_REDIS_SERVER", str(link))
    assert find_redis_server() == str(link)
    monkeypatch.setenv("IOP_EDGE_REDIS_SERVER", str(tmp_path / "none"))
    with pytest.raises(RedisServerNotFound, match=r"IOP_EDGE_REDIS_SERVER is '.*none', which is"):
        find_redis_server()


def test_without_a_binary_the_error_says_how_to_install_one(monkeypatch, tmp_path):
    monkeypatch.delenv("IOP_EDGE_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(module, "_KNOWN_PATHS", (str(tmp_path / "redis-server"),))
    with pytest.raises(RedisServerNotFound) as missing:
        RedisServer()
    message = str(missing.value)
    assert "sudo apt-get install -y redis-server" in message
    assert "`make redis`" in message
    assert "IOP_EDGE_REDIS_SERVER" in message
    assert os.environ["PATH"] == str(tmp_path)


def ended(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie (an orphan's end that nobody reaped)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in status


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
async def test_the_server_ends_with_a_test_run_that_is_killed():
    """A run killed outright (``timeout``, ``SIGKILL``) runs no teardown: its server ends
    anyway, instead of listening on forever."""
    script = (
        "import sys, time\n"
        "from iop_edge.testing.redis_server import RedisServer\n"
        "server = RedisServer()\n"
        "server.start()\n"
        "print(server.process.pid, server.directory, flush=True)\n"
        "time.sleep(600)\n"
    )
    run = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert run.stdout is not None
    pid, directory = run.stdout.readline().split()
    try:
        assert not ended(int(pid))
        run.kill()
        run.wait(BOUND)
        await wait_for(lambda: ended(int(pid)))
    finally:
        run.stdout.close()
        shutil.rmtree(directory, ignore_errors=True)

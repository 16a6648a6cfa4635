"""Listening sockets passed in (systemd socket activation, :mod:`iop_edge.runtime.activation`):
``iop-edge serve`` started with ``LISTEN_FDS`` serves on the sockets it was given — a real
subprocess, real sockets — and a connection the kernel queued on a passed socket before the
daemon was up is answered, not refused. The reading of the variables, rule by rule.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from pathlib import Path

import aiohttp
import pytest
import yaml

from iop_edge.runtime.activation import (
    ActivationError,
    activation_argv,
    activation_env,
    child_fds,
    inherited_sockets,
)
from tests.helpers import BOUND, IOP_EDGE, ROOT, doc_for
from tests.helpers.service import served, unit_settings, write_config


def listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def test_sockets_meant_for_another_process_are_ignored_and_the_variables_dropped() -> None:
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "openai", "PATH": "/bin"}
    assert inherited_sockets(env, pid=4242) == {}
    assert env == {"PATH": "/bin"}  # the daemon's own children do not inherit them
    assert inherited_sockets({}, pid=4242) == {}


@pytest.mark.parametrize(
    ("fds", "names", "message"),
    [
        ("0", "", "LISTEN_FDS='0' is not a positive number of sockets"),
        ("x", "", "LISTEN_FDS='x' is not a positive number of sockets"),
        ("2", "", "LISTEN_FDNAMES='' names 0 socket(s), LISTEN_FDS is 2"),
        ("2", "openai", "LISTEN_FDNAMES='openai' names 1 socket(s), LISTEN_FDS is 2"),
        ("1", "web", "socket 3 is named 'web'; the names are openai, metrics, console"),
    ],
)
def test_unusable_activation_variables_say_what_is_wrong(
    fds: str, names: str, message: str
) -> None:
    env = {"LISTEN_PID": "7", "LISTEN_FDS": fds, "LISTEN_FDNAMES": names}
    with pytest.raises(ActivationError) as raised:
        inherited_sockets(env, pid=7)
    assert message in str(raised.value)


async def test_serve_takes_its_listeners_sockets_from_the_process_that_started_it(
    tmp_path: Path,
) -> None:
    """The OpenAI and console sockets are passed (their configured ports are never bound);
    the metrics listener binds its own. A client that connected to the OpenAI socket before
    the daemon started is answered once it is up."""
    openai_sock, console_sock = listening_socket(), listening_socket()
    openai_port = openai_sock.getsockname()[1]
    console_port = console_sock.getsockname()[1]
    doc = doc_for()
    doc["openai"]["listen"] = "127.0.0.1:1"  # never bound: the passed socket wins
    doc["console"]["listen"] = "127.0.0.1:2"
    config = write_config(tmp_path, doc)
    early = socket.create_connection(("127.0.0.1", openai_port))  # queued by the kernel
    early.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    sockets = [openai_sock, console_sock]
    with served(
        config,
        wrap=lambda argv: activation_argv(argv, ["openai", "console"]),
        pass_fds=child_fds(sockets),
        env=activation_env(sockets),
    ) as daemon:
        for sock in sockets:
            sock.close()  # the daemon holds them now
        listening = daemon.wait_event("listening")
        inherited = {e["listener"]: e for e in daemon.events("listener_inherited")}
        early.settimeout(BOUND)
        answer = b""
        while chunk := await asyncio.to_thread(early.recv, 65536):
            answer += chunk
        early.close()
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{openai_port}/v1/models") as models:
                listed = [m["id"] for m in (await models.json())["data"]]
            async with session.get(f"http://127.0.0.1:{console_port}/admin/status") as status:
                edge = (await status.json())["edge"]
        daemon.process.terminate()
        assert daemon.exit_code() == 0
    assert answer.startswith(b"HTTP/1.1 200")
    assert listening["openai"] == f"http://127.0.0.1:{openai_port}"
    assert listening["console"] == f"http://127.0.0.1:{console_port}"
    assert not listening["metrics"].endswith(":1")
    assert set(inherited) == {"openai", "console"}
    assert inherited["openai"]["configured"] == "127.0.0.1:1"
    assert listed == ["echo"]
    assert edge


async def test_a_badly_named_passed_socket_stops_serve_with_the_reason(tmp_path: Path) -> None:
    sock = listening_socket()
    config = write_config(tmp_path, doc_for())
    with served(
        config,
        wrap=lambda argv: activation_argv(argv, ["web"]),
        pass_fds=child_fds([sock]),
        env=activation_env([sock]),
    ) as daemon:
        sock.close()
        code = daemon.exit_code()
    assert code == 1
    assert "the sockets passed in are not usable" in daemon.log
    assert "socket 3 is named 'web'" in daemon.log


def test_the_socket_unit_passes_the_openai_listener_at_the_shipped_address(tmp_path: Path) -> None:
    """``deploy/iop-edge.socket`` names its socket ``openai``, listens where the shipped
    config's ``openai.listen`` does, and ``systemd-analyze verify`` accepts it with the service
    (that part skipped without systemd-analyze)."""
    unit = ROOT / "deploy/iop-edge.socket"
    settings = unit_settings(unit.read_text())
    config = yaml.safe_load((ROOT / "configs/edge.yaml").read_text())
    assert settings["Socket.FileDescriptorName"] == ["openai"]
    assert settings["Socket.ListenStream"] == [config["openai"]["listen"]]
    assert settings["Socket.Service"] == ["iop-edge.service"]
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    service = (ROOT / "deploy/iop-edge.service").read_text()
    (tmp_path / "iop-edge.service").write_text(
        service.replace("/opt/iop-edge/bin/iop-edge", IOP_EDGE)
    )
    (tmp_path / "iop-edge.socket").write_text(unit.read_text())
    verify = subprocess.run(
        ["systemd-analyze", "verify", "iop-edge.socket", "iop-edge.service"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert verify.returncode == 0, verify.stderr
    assert "iop-edge.s" not in verify.stderr

"""The thin parent of ``iop-edge serve`` outside systemd (issue 25, :mod:`iop_edge.runtime.parent`).

Real processes: ``iop-edge serve`` run in the foreground, as a shell or ``make run`` runs it.
The process started stays across ``iop-edge restart`` (no request fails), forwards SIGTERM and
exits 0 once the current server has drained, exits with the server's status, holds SIGHUP and
SIGUSR2 back while the server starts, and — the child subreaper — reaps the orphans that come
to it. As PID 1 of a PID namespace (a container): ``tests/test_container.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from iop_edge.runtime.parent import exit_code, wanted
from iop_edge.runtime.signals import RESTART_SIGNAL_WHILE_STARTING
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import BOUND, IOP_EDGE, child_states, doc_for, only_child, post
from tests.helpers.service import HUP_PACE, STARTUP, served, write_config

HI = [{"role": "user", "content": "hi"}]

ESCAPE = """\
import os, sys
ready, told = os.pipe()
if os.fork() == 0:  # a background job in a session of its own: the group kill misses it
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.write(told, b"x")
    os.closerange(3, 65536)  # (no pipe of the edge's kept open: the answer ends with us)
    os.execvp("sleep", ["sleep", "30"])
os.read(ready, 1)
sys.stdout.write("hi")
"""
"""A CLI agent that answers ``hi`` and leaves a ``sleep 30`` behind that escaped its process
group (so the edge's group kill does not end it): an orphan that lives until killed."""


def orphaning_doc() -> dict[str, Any]:
    """The echo model and two agents that leave orphans: ``escapes`` (:data:`ESCAPE`) and
    ``orphans`` (``sh -c 'sleep 30 & printf hi'``: its job dies in the group kill, a zombie
    until someone reaps it)."""
    doc = doc_for()
    node = doc["nodes"][0]
    for name, command, args in (
        ("escapes", sys.executable, ["-c", ESCAPE]),
        ("orphans", "sh", ["-c", "sleep 30 & printf hi"]),
    ):
        node["adapters"].append({"name": name, "type": "cli", "command": command, "args": args})
        node["providers"].append(
            {"id": name, "type": "cli", "category": "cli", "adapter": name, "models": ["echo"]}
        )
        doc["models"].append({"id": name, "context_window_tokens": 4096, "providers": [name]})
    return doc


def sessions_of_their_own(pid: int) -> set[int]:
    """The children of process ``pid`` that run (no zombie) in a session they lead."""
    leaders = set()
    for child, state in child_states(pid).items():
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{child}/stat").read_text()
            if state != "Z" and stat.rpartition(")")[2].split()[3] == str(child):
                leaders.add(child)
    return leaders


def started_a_child(pid: int) -> None:
    """Wait until process ``pid`` has a child: a thin parent starts its server only once it
    has caught its signals."""
    deadline = time.monotonic() + STARTUP
    while not child_states(pid):
        assert time.monotonic() < deadline, f"process {pid} started no child"
        time.sleep(0.0005)


async def ask(session: aiohttp.ClientSession, url: str, text: str) -> tuple[int, str]:
    """One chat completion of the model ``chat``; its status and body (status 0: the request
    failed, the body says how)."""
    body = {"model": "chat", "messages": [{"role": "user", "content": text}]}
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            return response.status, await response.text()
    except aiohttp.ClientError as exc:
        return 0, f"{text}: {exc!r}"


async def test_a_foreground_serve_stays_across_iop_edge_restart_and_fails_no_request(
    tmp_path: Path,
) -> None:
    """Client loops run while ``iop-edge restart`` hands the server over: the process the test
    started still runs (the shell keeps its gateway), the new server is its child once the old
    one exited, no request fails, and SIGTERM to the process started drains the new server
    and exits 0. (Before issue 25 the process started was the server, and exited.)"""
    async with FakeOpenAI(behavior=FakeBehavior(latency=0.02)) as fake:
        config = write_config(tmp_path, doc_for(fake))
        with served(config) as parent:
            url = parent.wait_event("listening", STARTUP)["openai"]
            server = only_child(parent.process.pid)
            outcomes: list[tuple[int, str]] = []
            stop = asyncio.Event()

            async def keep_asking(n: int) -> None:
                i = 0
                while not stop.is_set():
                    outcomes.append(await ask(session, url, f"{n}.{i}"))
                    i += 1

            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=BOUND)) as session:
                loops = [asyncio.create_task(keep_asking(n)) for n in range(4)]
                await fake.wait_requests(4)
                restart = await asyncio.to_thread(
                    subprocess.run,
                    [IOP_EDGE, "restart", "--config", str(config)],
                    capture_output=True,
                    text=True,
                    timeout=BOUND,
                )
                new = await asyncio.to_thread(only_child, parent.process.pid, server)
                outcomes += [await ask(session, url, "after") for _ in range(3)]
                stop.set()
                await asyncio.gather(*loops)
            running = parent.process.poll()
            parent.process.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(parent.exit_code)
    assert restart.returncode == 0, restart.stderr
    assert f"handed over to process {new}" in restart.stdout
    assert running is None
    failed = [o for o in outcomes if o[0] != 200]
    assert not failed, failed[:3]
    assert len(outcomes) > 3
    assert code == 0, parent.log
    assert len(parent.events("stopped")) == 2  # the old server, then the new one
    assert parent.events()[-1]["event"] == "stopped"


def test_the_parent_exits_with_the_servers_status(tmp_path: Path) -> None:
    """A config that fails at start: the server says why and exits 1, and so does the process
    started. A server killed by SIGKILL: the parent says so and exits 128 + 9."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: []\n")
    failed = subprocess.run(
        [IOP_EDGE, "serve", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    with served(write_config(tmp_path, doc_for())) as parent:
        parent.wait_event("listening", STARTUP)
        server = only_child(parent.process.pid)
        os.kill(server, signal.SIGKILL)
        code = parent.exit_code()
    assert failed.returncode == 1
    assert f"the config {bad} is not valid" in failed.stderr
    assert "nothing to serve" in failed.stderr
    assert code == 128 + signal.SIGKILL
    [killed] = parent.events("server_killed")
    assert (killed["component"], killed["server"], killed["exit_code"]) == ("parent", server, 137)
    assert "killed by SIGKILL" in killed["message"]


def test_orphans_below_the_server_come_to_the_parent_and_are_reaped(tmp_path: Path) -> None:
    """The parent is the child subreaper: the background jobs CLI agents leave behind become
    its children when the agent exits. Jobs that escaped the group kill stay its children
    until they end; those the group kill ends, and these once the test kills them, are reaped
    at once — no zombie stays."""
    escaped: set[int] = set()
    with served(write_config(tmp_path, orphaning_doc())) as parent:
        try:
            listening = parent.wait_event("listening", STARTUP)
            server = only_child(parent.process.pid)
            answers = [
                post(listening["openai"] + "/v1/chat/completions", {"model": m, "messages": HI})
                for m in ("escapes", "orphans") * 3
            ]
            deadline = time.monotonic() + BOUND
            while len(escaped := sessions_of_their_own(parent.process.pid)) < 3:
                assert time.monotonic() < deadline, child_states(parent.process.pid)
                time.sleep(0.01)
            commands = {Path(f"/proc/{pid}/cmdline").read_bytes() for pid in escaped}
            for pid in escaped:
                os.kill(pid, signal.SIGKILL)
            left = only_child(parent.process.pid)  # (a zombie would be a child still)
        finally:
            for pid in escaped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        parent.process.send_signal(signal.SIGTERM)
        code = parent.exit_code()
    statuses = [(status, body["choices"][0]["message"]["content"]) for status, body in answers]
    assert statuses == [(200, "hi")] * 6
    assert len(escaped) == 3
    assert commands == {b"sleep\x0030\x00"}
    assert left == server
    assert code == 0


def test_sighups_while_the_server_starts_wait_in_the_parent_for_one_refresh(
    tmp_path: Path,
) -> None:
    """SIGHUP every 5 ms to the process started, from the moment it started the server until
    the server logs ``listening``: the parent holds them (a SIGHUP in the server's own
    interpreter start would end it) and passes one on at ``READY=1`` (those after it go straight
    on): a refresh triggered by ``signal``; nothing dies, and SIGTERM still exits 0."""
    with served(write_config(tmp_path, doc_for())) as parent:
        started_a_child(parent.process.pid)
        deadline = time.monotonic() + STARTUP
        sent = 0
        while not parent.has_logged("listening") and parent.process.poll() is None:
            assert time.monotonic() < deadline, "the server did not start:\n" + parent.log
            parent.process.send_signal(signal.SIGHUP)
            sent += 1
            time.sleep(HUP_PACE)
        assert parent.process.poll() is None, parent.log
        assert sent >= 10, "the burst did not overlap the start-up: the test proves nothing"
        refresh = parent.wait_event("config_refresh")
        parent.process.send_signal(signal.SIGTERM)
        code = parent.exit_code()
    assert (refresh["trigger"], refresh["result"]) == ("signal", "applied")
    assert code == 0, parent.log
    assert {(e["trigger"], e["result"]) for e in parent.events("config_refresh")} == {
        ("signal", "applied")
    }


def test_a_sigusr2_before_the_server_is_ready_is_logged_and_ignored(tmp_path: Path) -> None:
    """SIGUSR2 to the process started right after it started the server: the parent logs that
    a restart signal arrived while the daemon was starting and ignores it; the server starts
    and serves on, nothing is handed over."""
    with served(write_config(tmp_path, doc_for())) as parent:
        started_a_child(parent.process.pid)
        parent.process.send_signal(signal.SIGUSR2)
        ignored = parent.wait_event("restart_signal_ignored")
        parent.wait_event("listening", STARTUP)
        alive = parent.process.poll() is None
        parent.process.send_signal(signal.SIGTERM)
        code = parent.exit_code()
    assert (ignored["component"], ignored["phase"], ignored["signal"]) == (
        "parent",
        "starting",
        "SIGUSR2",
    )
    assert ignored["message"] == RESTART_SIGNAL_WHILE_STARTING  # (as the server says it)
    assert alive
    assert not parent.has_logged("handed_over")
    assert code == 0


@pytest.mark.parametrize(
    ("argv", "environ", "parent"),
    [
        (["iop-edge", "serve", "--config", "e.yaml"], {}, True),
        (["iop-edge", "serve", "--no-parent"], {}, False),
        (["iop-edge", "serve"], {"NOTIFY_SOCKET": "/run/systemd/notify"}, False),  # systemd
        (["iop-edge", "status"], {}, False),
        (["iop-edge", "--version"], {}, False),
    ],
)
def test_serve_outside_systemd_runs_as_the_thin_parent_unless_told_not_to(
    argv: list[str], environ: dict[str, str], parent: bool
) -> None:
    assert wanted(argv, environ) is parent


def test_the_exit_code_of_a_status_is_the_shells() -> None:
    assert exit_code(0) == 0
    assert exit_code(1 << 8) == 1
    assert exit_code(signal.SIGKILL) == 137  # killed by a signal: 128 + its number

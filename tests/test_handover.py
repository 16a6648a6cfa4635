"""The handover (issue 14), with real processes and sockets: ``iop-edge serve`` as a
subprocess, ``POST /admin/restart`` (what ``iop-edge restart`` calls) or ``SIGUSR2``, and a
fake OpenAI upstream that records how many requests it runs at once.

Under load — requests in flight, streams, requests queued — a restart whose config adds a
principal token fails nothing and refuses no connection, the upstream never runs more than
the provider's capacity, the new token works right after, and the old process is gone once
its last request ended. A config that does not load, or a new process that cannot start,
leaves the old one serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from iop_edge.cli import format_status
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.leaks import NO_LEAKS, leaks
from iop_edge.tokens import token_hash
from tests.helpers import BOUND, IOP_EDGE, child_states, doc_for, dump, edge_on, wait_for
from tests.helpers.service import (
    JSON,
    served,
    status,
    successor_stopped,
    third_party_code_loaded,
    write_config,
)

TOKENS = {"app-a": "iop_token-of-app-a", "app-b": "iop_token-of-app-b"}
ALONE = "--no-parent"
"""These tests watch the server processes themselves: the old one's exit, each one's pid
(the thin parent that otherwise starts them is tested in ``tests/test_parent.py``)."""


def tokens_doc(fake: FakeOpenAI, refs: list[str], capacity: int = 2) -> dict[str, Any]:
    doc = doc_for(fake, capacity=capacity)
    doc["openai"]["principal_tokens"] = [
        {"token_ref": ref, "token_hash_sha256": token_hash(TOKENS[ref]), "principal_ref": ref}
        for ref in refs
    ]
    doc["provider_pool"].update(max_queue=256, queue_timeout_ms=60000)
    return doc


def edit_config(config: Path, doc: dict[str, Any]) -> None:
    config.write_text(dump({**doc, "logging": {"format": "json"}}))


async def ask(
    session: aiohttp.ClientSession, url: str, ref: str, text: str, *, stream: bool = False
) -> tuple[int, str]:
    body = {"model": "chat", "messages": [{"role": "user", "content": text}], "stream": stream}
    headers = {"Authorization": f"Bearer {TOKENS[ref]}"}
    try:
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
            return r.status, await r.text()
    except aiohttp.ClientError as exc:  # counted as a failure (the test shows which)
        return 0, f"{text}: {exc!r}"


async def keep_asking(
    session: aiohttp.ClientSession,
    url: str,
    name: str,
    stop: asyncio.Event,
    outcomes: list[tuple[int, str]],
    *,
    stream: bool = False,
) -> None:
    """A client loop of app-a: its next request as soon as the last is answered, until
    ``stop``; every outcome recorded."""
    i = 0
    while not stop.is_set():
        outcomes.append(await ask(session, url, "app-a", f"{name}.{i}", stream=stream))
        i += 1


def with_second_provider(doc: dict[str, Any], fake: FakeOpenAI) -> dict[str, Any]:
    """``doc`` with a second provider, ``up2`` on ``fake``, in the model ``chat``."""
    node = doc["nodes"][0]
    node["adapters"].append({"name": "oa2", "type": "openai_compat", "base_url": fake.base_url})
    node["providers"].append(
        {
            "id": "up2",
            "type": "openai_compat",
            "category": "api",
            "adapter": "oa2",
            "models": ["fake-model"],
            "capacity": 2,
        }
    )
    next(m for m in doc["models"] if m["id"] == "chat")["providers"].append("up2")
    return doc


def exited(pid: int) -> bool:
    """Whether process ``pid`` ended (gone, or a zombie no one reaped yet: the old processes
    after the first are not the test's children)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def lasting_fds(pid: int) -> list[str]:
    """What process ``pid``'s descriptors are, except TCP connections (clients come and go):
    files, pipes, the event loop's, listening sockets (``tcp-listen``) and Unix sockets."""
    kinds: dict[str, str] = {}
    for table, kind in (("tcp", "tcp"), ("tcp6", "tcp"), ("unix", "unix")):
        with contextlib.suppress(FileNotFoundError), open(f"/proc/net/{table}") as handle:
            for line in list(handle)[1:]:
                fields = line.split()
                if kind == "unix":
                    kinds[f"socket:[{fields[6]}]"] = "unix"
                else:  # state 0A: LISTEN
                    kinds[f"socket:[{fields[9]}]"] = "tcp-listen" if fields[3] == "0A" else ""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            kind = kinds.get(target, target.split("[")[0] if "[" in target else target)
            if kind:
                found.append(kind)
    return sorted(found)


def old_gone(console: str) -> Callable[[], Awaitable[bool]]:
    """Whether the serving process says the one it took over from is gone."""

    async def gone() -> bool:
        return not (await status(console))["handover"]["old_running"]

    return gone


async def metric(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        text = await response.text()
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def test_a_handover_under_load_fails_nothing_and_keeps_capacity_exact(
    tmp_path: Path,
) -> None:
    """Capacity 2, each answer 0.1 s: 16 client loops, 8 streams and 32 queued requests are
    going when ``POST /admin/restart`` hands over with a config that adds app-b's token and a
    second provider."""
    behavior = FakeBehavior(latency=0.1, chunk_delay=0.02, chunks=20)
    async with FakeOpenAI(behavior=behavior) as fake, FakeOpenAI(behavior=behavior) as added:
        doc = tokens_doc(fake, ["app-a"])
        config = write_config(tmp_path, doc)
        new_pid: list[int] = []
        with served(config, ALONE) as old, successor_stopped(new_pid):
            listening = old.wait_event("listening")
            url, console = listening["openai"], listening["console"]
            outcomes: list[tuple[int, str]] = []
            stop = asyncio.Event()
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=BOUND)) as s:
                loops = [
                    asyncio.create_task(keep_asking(s, url, f"loop {n}", stop, outcomes))
                    for n in range(16)
                ]
                streams = [
                    asyncio.create_task(ask(s, url, "app-a", f"stream {n}", stream=True))
                    for n in range(8)
                ]
                queued = [asyncio.create_task(ask(s, url, "app-a", f"q {n}")) for n in range(32)]
                await fake.wait_requests(2)
                edit_config(
                    config, with_second_provider(tokens_doc(fake, ["app-a", "app-b"]), added)
                )
                async with s.post(console + "/admin/restart", headers=JSON) as response:
                    result = await response.json()
                new_pid.append(result["pid"])
                # the new token works right after
                accepted = await ask(s, url, "app-b", "new token")
                taken = await status(console)
                for _ in range(3):  # more load on the new process
                    outcomes.append(await ask(s, url, "app-a", "after"))
                stop.set()
                outcomes += await asyncio.gather(*streams, *queued)
                await asyncio.gather(*loops)
            old_exit = await asyncio.to_thread(old.process.wait, BOUND)
            shown = await asyncio.to_thread(
                subprocess.run,
                [IOP_EDGE, "status", "--console", console],
                capture_output=True,
                text=True,
                timeout=BOUND,
            )
            relayed = await metric(
                listening["metrics"] + "/metrics", "iop_edge_handover_relayed_requests_total"
            )
            handed = old.events("handed_over")
            drained = old.events("handover_drained")
            lines = old.events("request")  # (both processes write to the one stderr)
    assert result["result"] == "handed_over"
    assert taken["pid"] == result["pid"] != old.process.pid
    assert accepted[0] == 200
    failed = [o for o in outcomes if o[0] != 200]
    assert not failed, failed[:3]  # no failure, no refused connection (status 0)
    assert sum(1 for o in outcomes if "data: [DONE]" in o[1]) == 8  # every stream complete
    assert fake.max_in_flight <= 2
    assert added.max_in_flight <= 2
    assert added.requests  # the added provider took a share of the load
    assert old_exit == 0
    assert handed[0]["pid"] == result["pid"]
    # new shows how it took over; old said what it finished, relayed and cut
    assert taken["handover"]["from_pid"] == old.process.pid
    assert 0 < taken["handover"]["duration_ms"] < BOUND * 1000
    assert taken["handover"]["relayed_requests"] <= relayed == drained[0]["relayed"]
    assert drained[0]["relayed"] > 0  # the queued requests, at least
    assert drained[0]["cut"] == 0
    # a relayed request has one id in both logs: old's "relayed" line, new's answered one
    relayed_ids = {line["request_id"] for line in lines if line["code"] == "relayed"}
    answered_ids = {line["request_id"] for line in lines if line["code"] == "ok"}
    assert len(relayed_ids) == drained[0]["relayed"]
    assert relayed_ids <= answered_ids
    assert f"(pid {result['pid']})" in shown.stdout
    assert f"took over from process {old.process.pid} at " in shown.stdout


async def test_a_config_that_does_not_load_restarts_nothing(tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        config = write_config(tmp_path, tokens_doc(fake, ["app-a"]))
        with served(config, ALONE) as old:
            console = old.wait_event("listening")["console"]
            broken = yaml.safe_load(config.read_text())
            broken["provider_pool"]["max_queue"] = "many"
            config.write_text(dump(broken))
            async with aiohttp.ClientSession() as s:
                async with s.post(console + "/admin/restart", headers=JSON) as response:
                    result = await response.json()
                pid = (await status(console))["pid"]
            cli = await asyncio.to_thread(
                subprocess.run,
                [IOP_EDGE, "restart", "--console", console],
                capture_output=True,
                text=True,
                timeout=BOUND,
            )
            old.process.terminate()
            assert await asyncio.to_thread(old.process.wait, BOUND) == 0
    assert result["result"] == "rejected"
    assert result["errors"][0]["path"] == "provider_pool.max_queue"
    assert pid == old.process.pid
    assert cli.returncode == 1  # iop-edge restart says so too
    assert "not restarted (rejected): the config file does not load" in cli.stdout
    assert "provider_pool.max_queue" in cli.stdout


async def test_a_new_process_that_cannot_start_leaves_the_old_one_serving(
    tmp_path: Path,
) -> None:
    """The new config moves the metrics listener to a port another socket holds: the new
    process cannot bind it and exits; the old one serves on, and says why."""
    taken = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = taken.sockets[0].getsockname()[1]
    try:
        async with FakeOpenAI() as fake:
            doc = tokens_doc(fake, ["app-a"])
            config = write_config(tmp_path, doc)
            with served(config, ALONE) as old:
                listening = old.wait_event("listening")
                doc["metrics"]["listen"] = f"127.0.0.1:{port}"
                edit_config(config, doc)
                async with aiohttp.ClientSession() as s:
                    async with s.post(
                        listening["console"] + "/admin/restart", headers=JSON
                    ) as response:
                        result = await response.json()
                    answer = await ask(s, listening["openai"], "app-a", "still here")
                    pid = (await status(listening["console"]))["pid"]
                old.process.terminate()
                await asyncio.to_thread(old.process.wait, BOUND)
    finally:
        taken.close()
    assert result["result"] == "failed"
    assert "did not become ready" in result["message"]
    assert answer[0] == 200
    assert pid == old.process.pid


async def test_sigusr2_hands_over_as_the_restart_command_does(tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        config = write_config(tmp_path, tokens_doc(fake, ["app-a"]))
        new_pid: list[int] = []
        with served(config, ALONE) as old, successor_stopped(new_pid):
            listening = old.wait_event("listening")
            old.process.send_signal(signal.SIGUSR2)
            handed = await asyncio.to_thread(old.wait_event, "handed_over")
            new_pid.append(handed["pid"])
            assert await asyncio.to_thread(old.process.wait, BOUND) == 0
            async with aiohttp.ClientSession() as s:
                answer = await ask(s, listening["openai"], "app-a", "after the signal")
                pid = (await status(listening["console"]))["pid"]
    assert answer[0] == 200
    assert pid == handed["pid"] != old.process.pid


async def test_ten_handovers_in_a_row_under_load_leak_no_descriptor_process_or_slot(
    tmp_path: Path,
) -> None:
    """Client loops and streams run throughout ten restarts in a row. Every request succeeds;
    each old process exits; the last process holds the descriptors the first new one held (no
    channel, socket or pipe piles up), and once the load stops no slot is held anywhere."""
    async with FakeOpenAI(behavior=FakeBehavior(latency=0.02, chunk_delay=0.01)) as fake:
        config = write_config(tmp_path, tokens_doc(fake, ["app-a"]))
        pids: list[int] = []
        with served(config, ALONE) as first, successor_stopped(pids):
            listening = first.wait_event("listening")
            url, console = listening["openai"], listening["console"]
            outcomes: list[tuple[int, str]] = []
            stop = asyncio.Event()
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=BOUND)) as s:
                loops = [
                    asyncio.create_task(keep_asking(s, url, str(n), stop, outcomes, stream=n < 2))
                    for n in range(6)
                ]
                olds = [first.process.pid]
                fds: list[list[str]] = []
                for n in range(10):
                    async with s.post(console + "/admin/restart", headers=JSON) as response:
                        result = await response.json()
                    assert result["result"] == "handed_over", result
                    pids.append(result["pid"])
                    if n in (0, 9):  # once its predecessor left (and the channel with it)
                        await wait_for(old_gone(console))
                        fds.append(lasting_fds(pids[-1]))
                    olds.append(pids[-1])
                stop.set()
                await asyncio.gather(*loops)
                await wait_for(lambda: all(exited(pid) for pid in olds[:-1]))
            last = await status(console)
    assert len(set(pids)) == 10
    failed = [o for o in outcomes if o[0] != 200]
    assert not failed, failed[:3]
    assert sum(1 for o in outcomes if "data: [DONE]" in o[1]) >= 2
    assert fds[0] == fds[1]
    assert last["pid"] == pids[-1]
    assert last["handover"]["inherited_held"] == 0
    assert [p["in_flight"] for p in last["providers"]] == [0, 0]
    assert last["queue"]["depth"] == 0
    counters = last["counters"]  # it released what it admitted and what it inherited
    assert counters["inherited"] == last["handover"]["inherited_leases"]
    assert counters["released"] == counters["admitted"] + counters["inherited"]


# -- in one process: the ways a restart is refused or fails, and what stays as it was -----


async def serves(url: str) -> int:
    async with aiohttp.ClientSession() as session:
        return (await ask(session, url, "app-a", "still here"))[0]


async def test_a_new_process_that_cannot_be_run_or_exits_at_once_leaves_this_one_serving(
    tmp_path: Path,
) -> None:
    async with FakeOpenAI() as fake:
        doc = tokens_doc(fake, ["app-a"])
        missing = (str(tmp_path / "no-such-program"), "serve")
        async with edge_on(tmp_path, doc, argv=missing) as edge:
            daemon = edge.daemon
            not_run = (await daemon.handover.restart()).to_json()
            daemon.handover.options = dataclasses.replace(  # exits 2 (usage)
                daemon.handover.options, argv=(IOP_EDGE, "serve", "--no-such-option")
            )
            exits = (await daemon.handover.restart()).to_json()
            answer = await serves(daemon.listeners["openai"].url)
            metrics = await edge.metrics()
            taken = daemon.handover.statistics()
    assert not_run["result"] == "failed"  # (the program is run by the activation shim)
    assert "did not become ready (exit code 127)" in not_run["message"]
    assert exits == {
        "result": "failed",
        "message": "the new process did not become ready (exit code 2); this one keeps serving",
    }
    assert answer == 200
    assert taken is None  # nothing was handed over: no handover series either
    assert not [name for name in metrics if name.startswith("iop_edge_handover")]


async def test_a_restart_is_refused_while_one_runs_or_without_a_command(tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        doc = tokens_doc(fake, ["app-a"])
        # a new process that exits without saying it is ready
        exits = (sys.executable, "-c", "pass")
        async with edge_on(tmp_path, doc, argv=exits) as edge:
            first = asyncio.create_task(edge.daemon.handover.restart())
            await asyncio.sleep(0)  # (it is running: it waits for the new process)
            second = (await edge.daemon.handover.restart()).to_json()
            first_result = (await first).to_json()
            edge.daemon.handover.options = dataclasses.replace(
                edge.daemon.handover.options, argv=()
            )
            without = (await edge.daemon.handover.restart()).to_json()
            answer = await serves(edge.daemon.listeners["openai"].url)
    assert second == {
        "result": "rejected",
        "phase": "handing_over",
        "message": "a handover is already in progress",
    }
    assert first_result["result"] == "failed"
    assert without == {"result": "rejected", "message": "this process has no command to restart"}
    assert answer == 200


async def test_inherited_leases_are_counted_so_that_released_is_admitted_plus_inherited(
    tmp_path: Path,
) -> None:
    """A process started by a handover releases the leases the old one held as well as its
    own: ``released`` passes ``admitted`` by ``inherited`` exactly, which status, ``iop-edge
    status`` and the leak accounting show rather than call it a leak."""
    async with FakeOpenAI() as fake, edge_on(tmp_path, tokens_doc(fake, ["app-a"], 3)) as edge:
        daemon = edge.daemon
        key = ("local", "up")
        inherited = [
            daemon.scheduler.inherit(key, long_context=False, principal="app-a") for _ in range(2)
        ]
        async with aiohttp.ClientSession() as session:
            assert (await ask(session, daemon.openai_url[: -len("/v1")], "app-a", "own"))[0] == 200
        for lease in inherited:
            assert lease is not None
            lease.release()
        shown = await status(daemon.console_url)
        found = leaks(daemon)
    counters = shown["counters"]
    assert (counters["admitted"], counters["inherited"], counters["released"]) == (1, 2, 3)
    assert found == {**NO_LEAKS, "child_processes": found["child_processes"]}
    assert "admitted 1, inherited 2, released 3," in format_status(shown)


# -- a stop never becomes a restart (issue 25) ----------------------------------------------


def refused(url: str) -> bool:
    """Whether a connection to ``url``'s address is refused: nothing listens there."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=BOUND).close()
    except ConnectionRefusedError:
        return True
    return False


async def test_a_stop_never_becomes_a_restart(tmp_path: Path) -> None:
    """SIGTERM while a request is in flight, so the drain lasts until the upstream answers:
    ``POST /admin/restart`` is 409 ``daemon_stopping``, ``iop-edge restart`` says so and exits
    1, SIGUSR2 is logged and ignored. The request is answered, the process exits 0, and
    nothing serves on: the listeners' ports refuse connections and no process of the daemon
    is left. (Before issue 25 both restarts handed over, and the new process served on after
    the stopped one exited.) ``iop-edge serve`` as an operator runs it."""
    async with FakeOpenAI(behavior=FakeBehavior(hold=True)) as fake:
        config = write_config(tmp_path, tokens_doc(fake, ["app-a"]))
        with served(config) as daemon:
            listening = daemon.wait_event("listening")
            url, console = listening["openai"], listening["console"]
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=BOUND)) as s:
                held = asyncio.create_task(ask(s, url, "app-a", "held"))
                await fake.wait_in_flight(1)
                daemon.process.send_signal(signal.SIGTERM)
                await asyncio.to_thread(daemon.wait_event, "draining")
                async with s.post(console + "/admin/restart", headers=JSON) as response:
                    status, body = response.status, await response.json()
                cli = await asyncio.to_thread(
                    subprocess.run,
                    [IOP_EDGE, "restart", "--console", console],
                    capture_output=True,
                    text=True,
                    timeout=BOUND,
                )
                daemon.process.send_signal(signal.SIGUSR2)
                ignored = await asyncio.to_thread(daemon.wait_event, "restart_signal_ignored")
                fake.release()
                answer = await held
            code = await asyncio.to_thread(daemon.exit_code)
            left = await asyncio.to_thread(group_left, daemon.process.pid)
            closed = [await asyncio.to_thread(refused, each) for each in (url, console)]
    assert status == 409
    assert body["error"]["code"] == "daemon_stopping"
    assert body["error"]["message"].startswith("the daemon is stopping")
    assert cli.returncode == 1
    assert "HTTP 409: the daemon is stopping" in cli.stderr
    assert (ignored["signal"], ignored["phase"]) == ("SIGUSR2", "stopping")
    assert answer[0] == 200
    assert code == 0, daemon.log
    assert not daemon.has_logged("handed_over")
    assert not left
    assert closed == [True, True]


GROUP_GONE_WITHIN = 1.0
"""Seconds the processes of a stopped daemon's group may take to be gone once its first
process (the thin parent) has exited: a bound, not a pace. Measured: none is left at the first
look (the server exits before the parent does). The bound is room for a loaded machine; a
successor that served on would never go, so it is told apart all the same."""


def group_left(group: int) -> bool:
    """Whether a process of the process group ``group`` is still running, once the
    processes that end have had the time to (:data:`GROUP_GONE_WITHIN`): a successor would
    serve on."""
    deadline = time.monotonic() + GROUP_GONE_WITHIN
    while True:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.01)


async def test_a_stop_during_a_handover_kills_the_new_process_before_it_serves(
    tmp_path: Path, log_stream: Any
) -> None:
    """A restart waits for a new process that is not ready yet when the daemon stops: the new
    process is killed (it never served), the restart answers ``rejected`` in the phase
    ``stopping``, and ``handover_cancelled`` says so. (Before issue 25 the old process exited
    and left the new one to take its sockets over.)"""
    async with FakeOpenAI() as fake:
        started = tmp_path / "started"
        # a new process that records its pid and never says it is ready
        waits = (sys.executable, "-c", WAITS, str(started))
        async with edge_on(tmp_path, tokens_doc(fake, ["app-a"]), argv=waits) as edge:
            restart = asyncio.create_task(edge.daemon.handover.restart())
            await wait_for(lambda: started.exists() and started.read_text() != "")
            pid = int(started.read_text())
            phase = edge.daemon.lifecycle.phase
            await edge.daemon.stop()
            result = (await asyncio.wait_for(restart, BOUND)).to_json()
            second = (await edge.daemon.handover.restart()).to_json()
    assert phase.value == "handing_over"
    assert result["result"] == "rejected"
    assert result["phase"] == "stopping"
    assert "the new process was stopped (exit code -9)" in result["message"]
    assert second["phase"] == "stopping"
    assert exited(pid)
    [cancelled] = [
        e
        for e in map(json.loads, log_stream.getvalue().splitlines())
        if e["event"] == "handover_cancelled"
    ]
    assert (cancelled["pid"], cancelled["new_process"]) == (pid, "killed")


WAITS = """\
import os, sys, time
with open(sys.argv[1], "w") as record:
    record.write(str(os.getpid()))
time.sleep(60)
"""


async def test_sigusr2_to_the_new_process_while_it_starts_is_ignored(tmp_path: Path) -> None:
    """SIGUSR2 to the new process of a handover while it imports its libraries (before issue
    25 it died of it, exit -12, and the handover failed): it logs the signal as arrived while
    starting and ignored, and takes over."""
    async with FakeOpenAI() as fake:
        config = write_config(tmp_path, tokens_doc(fake, ["app-a"]))
        new_pid: list[int] = []
        with served(config, ALONE) as old, successor_stopped(new_pid):
            console = old.wait_event("listening")["console"]
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=BOUND)) as s:
                restart = asyncio.create_task(s.post(console + "/admin/restart", headers=JSON))
                new = await asyncio.to_thread(importing_child, old.process.pid)
                os.kill(new, signal.SIGUSR2)
                async with await restart as response:
                    result = await response.json()
            new_pid.append(result.get("pid", new))
            ignored = await asyncio.to_thread(old.wait_event, "restart_signal_ignored")
    assert result == {"result": "handed_over", "pid": new}
    assert (ignored["phase"], ignored["signal"]) == ("starting", "SIGUSR2")


def importing_child(pid: int) -> int:
    """The child of process ``pid`` that is the new process of a handover importing its
    libraries: past the activation shim's ``exec`` (its environment names its sockets; a
    fork not yet exec'd maps old's libraries too) and into the package's imports."""
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        for child in child_states(pid):
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
                if b"LISTEN_PID=" + str(child).encode() in environ and third_party_code_loaded(
                    child
                ):
                    return child
        time.sleep(0.0005)
    raise AssertionError(f"process {pid} started no iop-edge serve")


async def test_a_request_on_a_kept_alive_connection_after_the_handover_is_judged_by_the_new_config(
    tmp_path: Path,
) -> None:
    """A client's kept-alive connection to the old process outlives the handover (old still
    finishes a request): a request on it with a token the restart added is relayed to the new
    process and answered there — the old one must not refuse it with its old token list."""
    async with FakeOpenAI() as fake:
        doc = tokens_doc(fake, ["app-a"])
        config = write_config(tmp_path, doc)
        new_pid: list[int] = []
        with served(config, ALONE) as old, successor_stopped(new_pid):
            listening = old.wait_event("listening")
            url, console = listening["openai"], listening["console"]
            one_connection = aiohttp.TCPConnector(limit=1)
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=BOUND)) as held,
                aiohttp.ClientSession(
                    connector=one_connection, timeout=aiohttp.ClientTimeout(total=BOUND)
                ) as kept,
            ):
                warm = await ask(kept, url, "app-a", "opens the kept-alive connection")
                fake.enqueue(FakeBehavior(hold=True))
                parked = asyncio.create_task(ask(held, url, "app-a", "keeps old busy"))
                await wait_for(lambda: fake.in_flight == 1)
                edit_config(config, tokens_doc(fake, ["app-a", "app-b"]))
                async with held.post(console + "/admin/restart", headers=JSON) as response:
                    result = await response.json()
                new_pid.append(result["pid"])
                judged = await ask(kept, url, "app-b", "a token only the new config has")
                fake.release()
                finished = await parked
            old_exit = await asyncio.to_thread(old.process.wait, BOUND)  # (its log is complete)
            relayed = [line for line in old.events("request") if line["code"] == "relayed"]
    assert old_exit == 0
    assert warm[0] == 200
    assert result["result"] == "handed_over"
    assert judged[0] == 200, judged
    assert finished[0] == 200
    assert relayed  # old relayed it (the new process answered it)

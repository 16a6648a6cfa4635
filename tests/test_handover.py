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
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.tokens import token_hash
from tests.helpers import BOUND, IOP_EDGE, doc_for, dump
from tests.test_stop_and_signals import served, write_config

TOKENS = {"app-a": "iop_token-of-app-a", "app-b": "iop_token-of-app-b"}
JSON = {"Content-Type": "application/json"}


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


@contextlib.contextmanager
def successor_stopped(pid: list[int]) -> Iterator[None]:
    """Whatever the test does, stop the process that took over (not our child)."""
    try:
        yield
    finally:
        for each in pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGKILL)


async def status(console: str) -> dict[str, Any]:
    """The admin status over a new connection (a kept-alive one may still reach the old
    process for a moment after a handover)."""
    async with aiohttp.ClientSession() as session, session.get(console + "/admin/status") as r:
        return dict(await r.json())


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


async def test_a_handover_under_load_fails_nothing_and_keeps_capacity_exact(
    tmp_path: Path,
) -> None:
    """Capacity 2, each answer 0.1 s: client loops of 8, 4 streams and 16 queued requests are
    going when ``POST /admin/restart`` hands over with a config that adds app-b's token."""
    async with FakeOpenAI(behavior=FakeBehavior(latency=0.1, chunk_delay=0.01)) as fake:
        doc = tokens_doc(fake, ["app-a"])
        config = write_config(tmp_path, doc)
        new_pid: list[int] = []
        with served(config) as old, successor_stopped(new_pid):
            listening = old.wait_event("listening")
            url, console = listening["openai"], listening["console"]
            outcomes: list[tuple[int, str]] = []
            stop = asyncio.Event()
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=BOUND)) as s:

                async def loop(n: int) -> None:
                    i = 0
                    while not stop.is_set():
                        outcomes.append(await ask(s, url, "app-a", f"loop {n}.{i}"))
                        i += 1

                loops = [asyncio.create_task(loop(n)) for n in range(8)]
                streams = [
                    asyncio.create_task(ask(s, url, "app-a", f"stream {n}", stream=True))
                    for n in range(4)
                ]
                queued = [asyncio.create_task(ask(s, url, "app-a", f"q {n}")) for n in range(16)]
                await fake.wait_requests(2)
                edit_config(config, tokens_doc(fake, ["app-a", "app-b"]))
                async with s.post(console + "/admin/restart", headers=JSON) as response:
                    result = await response.json()
                new_pid.append(result["pid"])
                # the new token works right after
                accepted = await ask(s, url, "app-b", "new token")
                served_by = (await status(console))["pid"]
                for _ in range(3):  # more load on the new process
                    outcomes.append(await ask(s, url, "app-a", "after"))
                stop.set()
                outcomes += await asyncio.gather(*streams, *queued)
                await asyncio.gather(*loops)
            old_exit = await asyncio.to_thread(old.process.wait, BOUND)
            handed = old.events("handed_over")
    assert result["result"] == "handed_over"
    assert served_by == result["pid"] != old.process.pid
    assert accepted[0] == 200
    failed = [o for o in outcomes if o[0] != 200]
    assert not failed, failed[:3]
    assert sum(1 for o in outcomes if "data: [DONE]" in o[1]) == 4  # every stream complete
    assert fake.max_in_flight <= 2
    assert old_exit == 0
    assert handed[0]["pid"] == result["pid"]


async def test_a_config_that_does_not_load_restarts_nothing(tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        config = write_config(tmp_path, tokens_doc(fake, ["app-a"]))
        with served(config) as old:
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
            with served(config) as old:
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
        with served(config) as old, successor_stopped(new_pid):
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

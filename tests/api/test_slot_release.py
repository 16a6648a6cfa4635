"""A slot is released only when its upstream call has really ended (issue 25): a client that
leaves mid-stream while the next request waits for its provider's one slot must never let the
upstream see two calls at once — for HTTP, the abandoned connection is closed before the next
request is sent; for cli, the abandoned process group is reaped (after SIGTERM, and SIGKILL if
it comes to that) before the next command starts.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai

from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import doc_for, edge_on, wait_for

HELLO: Any = [{"role": "user", "content": "hello"}]


async def leave_mid_stream(url: str, model: str, prompt: str, leave: asyncio.Event) -> None:
    """Ask for a stream, read its first bytes, then drop the connection once told to."""
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": prompt}]}
    async with aiohttp.ClientSession() as session:
        response = await session.post(f"{url}/chat/completions", json=body)
        assert response.status == 200
        assert await response.content.readany()
        await leave.wait()
        response.close()  # (the connection, not returned to the pool: the edge sees it go)


async def test_an_abandoned_http_stream_is_closed_before_the_next_request_is_sent(
    tmp_path: Path,
) -> None:
    """Capacity 1: a stream the client leaves while the next request waits in the queue; the
    upstream never has two connections (or requests) at once."""
    fake = FakeOpenAI(behavior=FakeBehavior(fault="stall", fault_after=2))
    async with fake, edge_on(tmp_path, doc_for(fake, capacity=1)) as edge:
        url = edge.daemon.openai_url
        scheduler = edge.daemon.scheduler
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as client:
            leave = asyncio.Event()
            leaving = asyncio.create_task(leave_mid_stream(url, "chat", "first", leave))
            await fake.wait_in_flight(1)
            fake.behavior = FakeBehavior()
            waiting = asyncio.create_task(
                client.chat.completions.create(model="chat", messages=HELLO)
            )
            await wait_for(lambda: scheduler.statistics().queue_depth == 1)
            leave.set()
            await leaving
            answer = await waiting
        stats = fake.statistics()
    assert answer.choices[0].message.content == "hello"
    assert (stats.total_requests, stats.cancelled, stats.completed) == (2, 1, 1)
    assert (stats.max_in_flight, stats.max_open_connections) == (1, 1)


# The command: counts the other commands of this test still alive as it starts (their pids in
# a list file), then streams without end; on SIGTERM it lingers a second before it exits.
COUNTING_CLI = r"""
import os, signal, sys, time
pids, seen = sys.argv[1], sys.argv[2]
def linger(*_):
    time.sleep(1.0)
    os._exit(0)
signal.signal(signal.SIGTERM, linger)
alive = 0
if os.path.exists(pids):
    for line in open(pids):
        try:
            state = open(f"/proc/{int(line)}/stat").read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        alive += state != "Z"
with open(seen, "a") as out:
    out.write(f"{alive}\n")
with open(pids, "a") as out:
    out.write(f"{os.getpid()}\n")
prompt = sys.stdin.read()
if "endless" not in prompt:
    print("done", flush=True)
    sys.exit(0)
while True:
    print("word", flush=True)
    time.sleep(0.01)
"""


async def test_an_abandoned_cli_stream_is_reaped_before_the_next_command_starts(
    tmp_path: Path,
) -> None:
    """Capacity 1, a command that lingers a second after SIGTERM: a client leaves its stream
    while the next request waits; the next command starts only once the first is gone."""
    pids, seen = tmp_path / "pids", tmp_path / "seen"
    doc = doc_for(capacity=1)
    [cat] = doc["nodes"][0]["providers"]
    cat.update(command=sys.executable, args=["-c", COUNTING_CLI, str(pids), str(seen)])
    async with edge_on(tmp_path, doc) as edge:
        url = edge.daemon.openai_url
        scheduler = edge.daemon.scheduler
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as client:
            leave = asyncio.Event()
            leaving = asyncio.create_task(leave_mid_stream(url, "echo", "endless", leave))
            await wait_for(lambda: seen.exists())
            waiting = asyncio.create_task(
                client.chat.completions.create(model="echo", messages=HELLO)
            )
            await wait_for(lambda: scheduler.statistics().queue_depth == 1)
            leave.set()
            await leaving
            answer = await waiting
    assert answer.choices[0].message.content == "done\n"
    assert seen.read_text().split() == ["0", "0"]  # the second saw no other command alive

"""``GET /admin/status`` and ``iop-edge status`` show a pool shared by several edges: the store
(its URL with the password hidden), its state and since when it is down, the members, and each
provider's leases over every edge next to this edge's; ``shared`` is ``null`` for an edge
alone. Two real daemons share a real ``redis-server`` (with a password) that is killed and
started again."""

from __future__ import annotations

import asyncio
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from iop_edge.daemon import Daemon
from iop_edge.testing.redis_server import RedisServer
from tests.helpers import doc_for, edge_on, wait_for

IOP_EDGE = str(Path(sys.executable).with_name("iop-edge"))


@pytest.fixture(scope="module")
def store() -> Iterator[RedisServer]:
    """A server of this module's own, with a password: its tests kill and restart it."""
    with RedisServer(password=secrets.token_hex(8)) as server:
        yield server


def shared_doc(url: str, **shared: Any) -> dict[str, Any]:
    """The echo model on ``cat`` (capacity 2), its pool shared through the store at ``url``;
    leases of 1 s, so a renewal (every third of it) finds the store gone or back soon."""
    pool = {"max_queue": 8, "queue_timeout_ms": 30000}
    return doc_for(provider_pool=pool | {"shared": {"store": url, "lease_ttl_ms": 1000} | shared})


async def status_text(console: str) -> str:
    """``/admin/status`` as the body's text."""
    async with aiohttp.ClientSession() as session, session.get(console + "/admin/status") as r:
        assert r.status == 200
        return await r.text()


async def status_of(console: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(console + "/admin/status") as r:
        assert r.status == 200
        return dict(await r.json())


async def iop_edge_status(console: str, *args: str) -> str:
    """``iop-edge status --console URL``'s output (the daemons run in this loop meanwhile)."""
    cli = await asyncio.create_subprocess_exec(
        IOP_EDGE, "status", "--console", console, *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await cli.communicate()
    assert cli.returncode == 0
    return out.decode()


def state(daemon: Daemon) -> str:
    gate = daemon.scheduler.gate
    assert gate is not None
    return gate.statistics().state


async def test_an_edge_alone_shows_no_shared_section(tmp_path: Path) -> None:
    async with edge_on(tmp_path, doc_for()) as edge:
        status = await status_of(edge.daemon.console_url)
        assert status["shared"] is None
        (cat,) = status["providers"]
        assert (cat["held_elsewhere"], cat["long_held_elsewhere"]) == (0, 0)
        assert "shared pool" not in await iop_edge_status(edge.daemon.console_url)


async def test_the_status_shows_the_store_its_state_and_global_next_to_local_counts(
    tmp_path: Path, store: RedisServer
) -> None:
    """Up: both members, the provider's two leases over both edges (one of them this edge's);
    the store killed: down since a time, what rules meanwhile, the last error; started again:
    up. The password is in none of it — not in the JSON, not in the command's output."""
    store.flushall()
    password = store.password
    assert password
    shown = store.url.replace(password, "<redacted>")  # (as the config shows it)
    doc = shared_doc(store.url)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    async with (
        edge_on(tmp_path / "a", doc) as a,
        edge_on(tmp_path / "b", doc) as b,
    ):
        console = a.daemon.console_url
        elsewhere = await b.daemon.scheduler.admit("echo")
        here = await a.daemon.scheduler.admit("echo")  # (the grant tells a of b's lease)
        try:
            gate = a.daemon.scheduler.gate
            assert gate is not None
            await wait_for(lambda: gate.statistics().members == 2)  # (a's next heartbeat)

            up = await status_of(console)
            shared = up["shared"]
            assert shared == {
                "instance_id": gate.instance_id,
                "store": shown,
                "state": "up",
                "down_since": None,
                "last_error": None,
                "on_store_down": "static_split",
                "lease_ttl_ms": 1000,
                "members": 2,
                "leases": 1,
                "refused": 0,
                "lost": 0,
                "store_errors": 0,
                "providers": [
                    {"node": "local", "id": "cat", "held": 2, "long_held": 0}
                    | {"mine": 1, "long_mine": 0}
                ],
            }
            (cat,) = up["providers"]
            assert (cat["in_flight"], cat["held_elsewhere"], cat["capacity"]) == (1, 1, 2)
            (anonymous,) = up["principals"]
            assert anonymous["in_flight_elsewhere"] == 0  # (no max_in_flight: not shared)
            text = await iop_edge_status(console)
            assert (
                f"shared pool: store {shown} up, 2 edge(s) (this one {gate.instance_id}), "
                "lease_ttl_ms 1000, on_store_down static_split"
            ) in text
            rows = [
                line.split() for line in text.splitlines() if line.startswith(("NODE ", "local "))
            ]
            assert rows[0][:6] == ["NODE", "PROVIDER", "ALL_EDGES", "HERE", "ELSEWHERE", "CAPACITY"]
            assert ["local", "cat", "2", "1", "1", "2", "0/2"] in rows

            store.kill()
            await wait_for(lambda: state(a.daemon) == "down")
            down = (await status_of(console))["shared"]
            assert down["state"] == "down"
            assert down["down_since"] is not None
            assert down["down_since"].endswith("+00:00")
            assert down["store_errors"] >= 1
            assert down["last_error"].startswith(f"shared store {shown}: ")
            text = await iop_edge_status(console)
            assert f"shared pool: store {shown} DOWN, 2 edge(s)" in text
            assert (
                f"  out of reach since {down['down_since']}: this edge holds its static split "
                "of each provider"
            ) in text
            # (the last error of the retries that go on, each naming the store, not its password)
            assert f"\n  last error: shared store {shown}: " in text
            assert "ALL_EDGES and LONG_ALL: as last seen before the store went down" in text
            body = await status_text(console) + await iop_edge_status(console, "--json") + text

            store.start()
            await wait_for(lambda: state(a.daemon) == "up")
            back = (await status_of(console))["shared"]
            assert (back["state"], back["down_since"], back["last_error"]) == ("up", None, None)
            body += await status_text(console)
        finally:  # (a lease held makes the stop wait for its drain)
            here.release()
            elsewhere.release()

    assert password not in body


async def test_a_store_down_with_reject_says_new_requests_are_refused(
    tmp_path: Path, store: RedisServer
) -> None:
    store.flushall()
    async with edge_on(tmp_path, shared_doc(store.url, on_store_down="reject")) as edge:
        store.kill()
        try:
            await wait_for(lambda: state(edge.daemon) == "down")
            text = await iop_edge_status(edge.daemon.console_url)
        finally:
            store.start()
        assert "this edge refuses new requests (503 store_unavailable)" in text
        assert "on_store_down reject" in text

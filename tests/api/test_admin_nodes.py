"""``GET /admin/status`` lists every node (issue 29 item 10): a local node as local and always
connected, with no link; a remote node with its link — connected since, the peer, the agent's
version and protocol, the payload generation it acknowledged, the requests in flight on it,
the round trip, the bytes each way, reconnects, and when and why its last link went down; its
provider's health reads ``disconnected`` while the link is down. ``iop-edge status`` prints
it as a table."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from iop_edge.adapters.base import UpstreamReply, Usage
from iop_edge.link import calls
from iop_edge.link.protocol import PROTOCOL_VERSION, Frame, Kind
from tests.helpers import doc_for, edge_on, wait_for
from tests.helpers.links import TOKENS
from tests.helpers.remote_nodes import (
    REMOTE_MODEL,
    REMOTE_PROVIDER,
    answering_node,
    node_connected,
    with_remote_node,
)

IOP_EDGE = str(Path(sys.executable).with_name("iop-edge"))
LINK_FIELDS = {
    "connected_since",
    "peer",
    "agent_version",
    "protocol",
    "generation",
    "generation_acked",
    "in_flight",
    "reconnects",
    "rtt_ms",
    "bytes_sent",
    "bytes_received",
    "violations",
    "last_down",
}


async def status_of(console: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(console + "/admin/status") as r:
        assert r.status == 200
        return dict(await r.json())


def entry(status: dict[str, Any], key: str, value: str, field: str = "id") -> dict[str, Any]:
    return next(x for x in status[key] if x[field] == value)


def when(text: str) -> datetime:
    """An ISO 8601 time of the status (it must parse, with its UTC offset)."""
    parsed = datetime.fromisoformat(text)
    assert parsed.utcoffset() is not None
    return parsed


async def iop_edge_status(console: str) -> str:
    """``iop-edge status --console URL``'s output (the daemon runs in this loop meanwhile)."""
    cli = await asyncio.create_subprocess_exec(
        IOP_EDGE, "status", "--console", console, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await cli.communicate()
    assert cli.returncode == 0
    return out.decode()


async def test_a_config_of_local_nodes_lists_them_local_and_connected(tmp_path):
    async with edge_on(tmp_path, doc_for()) as edge:
        status = await status_of(edge.daemon.console_url)
        (local,) = status["nodes"]
        assert local == {"id": "local", "kind": "local", "connected": True} | dict.fromkeys(
            LINK_FIELDS
        )
        assert "nodes: local (local, in this process)" in await iop_edge_status(
            edge.daemon.console_url
        )


async def test_a_remote_node_shows_its_link_as_it_comes_and_goes(tmp_path):
    async with edge_on(tmp_path, with_remote_node(doc_for())) as edge:
        daemon, console = edge.daemon, edge.daemon.console_url
        status = await status_of(console)
        assert [(n["id"], n["kind"]) for n in status["nodes"]] == [
            ("local", "local"),
            ("n2", "remote"),
        ]
        away = entry(status, "nodes", "n2")
        assert away["connected"] is False
        assert re.fullmatch(r"[0-9a-f]{16}", away["generation"])
        assert {k: away[k] for k in ("connected_since", "peer", "generation_acked")} == {
            "connected_since": None,
            "peer": None,
            "generation_acked": None,
        }
        assert (away["reconnects"], away["last_down"], away["in_flight"]) == (0, None, 0)
        assert entry(status, "providers", REMOTE_PROVIDER)["health"] == "disconnected"
        assert "node n2: disconnected (no link since the edge started)" in await iop_edge_status(
            console
        )

        async with answering_node(daemon) as node, aiohttp.ClientSession() as http:
            # the round trip needs the edge's first PING answered
            await wait_for(lambda: daemon.node_statistics()[1].rtt is not None)
            asked = asyncio.create_task(
                http.post(
                    daemon.openai_url + "/chat/completions",
                    json={"model": REMOTE_MODEL, "messages": [{"role": "user", "content": "hi"}]},
                )
            )
            req = await node.next_frame()
            assert req is not None
            assert req.kind is Kind.REQ
            status = await status_of(console)
            up = entry(status, "nodes", "n2")
            assert up["connected"] is True
            assert re.fullmatch(r"127\.0\.0\.1:\d+", up["peer"])
            assert (up["agent_version"], up["protocol"]) == ("test", PROTOCOL_VERSION)
            assert up["generation_acked"] == up["generation"] == away["generation"]
            assert up["in_flight"] == 1  # the request the node holds
            assert 0 < up["rtt_ms"] < 15_000
            assert up["bytes_sent"] > 0
            assert up["bytes_received"] > 0
            assert when(up["connected_since"])
            assert entry(status, "providers", REMOTE_PROVIDER)["health"] != "disconnected"
            shown = await iop_edge_status(console)
            row = next(line for line in shown.splitlines() if line.startswith("n2 "))
            assert row.split()[:3] == ["n2", "remote", "yes"]
            assert up["peer"] in row
            assert up["generation"] in row
            assert row.endswith(" ms")  # the round trip
            body = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"x"}}]}'
            reply = UpstreamReply(200, body, Usage(1, 1))
            await node.node.send(
                Frame(Kind.RESP_REPLY, stream=req.stream, meta=calls.reply_meta(reply), data=body)
            )
            assert (await asked).status == 200
            assert entry(await status_of(console), "nodes", "n2")["in_flight"] == 0
        await wait_for(lambda: not node_connected(daemon))
        status = await status_of(console)
        down = entry(status, "nodes", "n2")
        assert down["connected"] is False
        assert down["last_down"]["reason"] == "node_closed"
        assert when(down["last_down"]["at"]) >= when(up["connected_since"])
        assert down["bytes_received"] >= up["bytes_received"]  # kept after the link went
        assert entry(status, "providers", REMOTE_PROVIDER)["health"] == "disconnected"
        assert "node n2: disconnected since " in await iop_edge_status(console)

        async with answering_node(daemon):
            again = entry(await status_of(console), "nodes", "n2")
            assert (again["connected"], again["reconnects"]) == (True, 1)
        text = json.dumps(await status_of(console))
        assert TOKENS["n2"] not in text

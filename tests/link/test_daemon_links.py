"""The daemon with a remote node (design §1, §5, §6): the node listener opens for it, a request
queues while the node is away and runs over its link once it attached, the link's loss takes
the provider out of the pool, and a stop closes the links."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from iop_edge.adapters.base import UpstreamReply, Usage
from iop_edge.daemon import Daemon
from iop_edge.link import calls
from iop_edge.link.protocol import CLOSE_GOING_AWAY, Frame, Kind
from iop_edge.runtime.logs import configure_logging, flush_logs
from iop_edge.testing.hostile_node import ScriptedNode
from iop_edge.testing.leaks import wait_for
from iop_edge.tokens import token_hash
from tests.helpers import LogCapture, doc_for
from tests.helpers.api import running_edge
from tests.helpers.links import TOKENS


def remote_doc() -> dict[str, Any]:
    doc = doc_for()
    doc["listen"] = {"address": "127.0.0.1:0"}
    doc["nodes"].append(
        {
            "id": "n1",
            "token_hash_sha256": token_hash(TOKENS["n1"]),
            "adapters": [{"name": "oa", "type": "openai_compat", "base_url": "http://10.0.0.9/v1"}],
            "providers": [
                {
                    "id": "far",
                    "type": "openai_compat",
                    "category": "api",
                    "adapter": "oa",
                    "models": ["far-model"],
                }
            ],
        }
    )
    doc["models"].append({"id": "chat", "context_window_tokens": 4096, "providers": ["far"]})
    return doc


def provider_health(daemon: Daemon, provider: str) -> str:
    stats = daemon.scheduler.statistics()
    return str(next(p.health for p in stats.providers if p.provider_id == provider))


async def test_a_request_waits_for_the_remote_node_and_runs_over_its_link() -> None:
    async with running_edge(remote_doc()) as daemon, aiohttp.ClientSession() as http:
        assert daemon.listeners["nodes"].url.startswith("http://127.0.0.1:")
        assert provider_health(daemon, "far") == "disconnected"
        asked = asyncio.create_task(
            http.post(
                daemon.openai_url + "/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
            )
        )
        await wait_for(lambda: daemon.scheduler.statistics().queue_depth == 1)
        node = await ScriptedNode.dial(daemon.listeners["nodes"].url + "/link", TOKENS["n1"])
        try:
            await node.handshake()
            req = await node.expect(Kind.REQ)
            call = calls.call_from(req.meta, req.data)
            assert (call.provider, call.call.target) == ("far", "far-model")
            body = orjson.dumps(
                {
                    "id": "c1",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "chat",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "from afar"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
                }
            )
            reply = UpstreamReply(200, body, Usage(1, 2))
            await node.send(
                Frame(Kind.RESP_REPLY, stream=req.stream, meta=calls.reply_meta(reply), data=body)
            )
            answer = await asked
            assert answer.status == 200
            assert (await answer.json())["choices"][0]["message"]["content"] == "from afar"
            assert provider_health(daemon, "far") != "disconnected"
        finally:
            await node.close()
        await wait_for(lambda: provider_health(daemon, "far") == "disconnected")


async def test_a_stop_closes_the_node_links() -> None:
    async with running_edge(remote_doc()) as daemon:
        node = await ScriptedNode.dial(daemon.listeners["nodes"].url + "/link", TOKENS["n1"])
        await node.handshake()
        await wait_for(lambda: provider_health(daemon, "far") != "disconnected")
        stopping = asyncio.create_task(daemon.stop())
        goaway = await node.expect(Kind.GOAWAY)
        assert goaway.meta == {"reason": "stopping"}
        code, _ = await node.closed()
        await node.close()
        await stopping
    assert code == CLOSE_GOING_AWAY


async def test_without_a_remote_node_there_is_no_node_listener() -> None:
    async with running_edge(doc_for()) as daemon:
        assert "nodes" not in daemon.listeners
        assert daemon.node_links is None


async def test_the_link_going_up_and_down_is_logged_per_provider() -> None:
    log = LogCapture()
    configure_logging("debug", "json", log)
    async with running_edge(remote_doc()) as daemon:
        node = await ScriptedNode.dial(daemon.listeners["nodes"].url + "/link", TOKENS["n1"])
        try:
            await node.handshake()
            await wait_for(lambda: provider_health(daemon, "far") != "disconnected")
        finally:
            await node.close()
        await wait_for(lambda: provider_health(daemon, "far") == "disconnected")
        flush_logs()
    events = [orjson.loads(line) for line in log.getvalue().splitlines()]
    health = [
        (e["event"], e["level"], e.get("provider"))
        for e in events
        if e["event"] in ("provider_connected", "provider_disconnected", "provider_recovered")
    ]
    assert health == [
        ("provider_connected", "info", "far"),
        ("provider_disconnected", "warning", "far"),
    ]


async def test_a_config_warning_is_logged_at_start() -> None:
    """Issue 29 item 1: ``listen.tls`` set while the node listener does not open runs (a
    warning, not an error), and the daemon says so at start, naming the path; a config whose
    TLS serves logs no warning."""
    log = LogCapture()
    configure_logging("debug", "json", log)
    doc = doc_for()
    doc["listen"] = {"tls": {"cert_file": "/nonexistent/edge.pem", "key_file": "/none/edge.key"}}
    async with running_edge(doc) as daemon:
        assert "nodes" not in daemon.listeners
        flush_logs()
    async with running_edge(remote_doc()):
        flush_logs()
    events = [orjson.loads(line) for line in log.getvalue().splitlines()]
    warnings = [(e["level"], e["path"]) for e in events if e["event"] == "config_warning"]
    assert warnings == [("warning", "listen.tls")]

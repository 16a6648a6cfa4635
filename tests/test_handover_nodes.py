"""Changes and restarts of either side of a node link, end to end (issue 29 items 7 and 8):
a real ``iop-edge serve`` (restarted by ``iop-edge restart``, the handover), a real
``iop-node`` subprocess, fake OpenAI upstreams behind the node and the official ``openai``
SDK as the client, all on 127.0.0.1.

- An edge restart with the link up and streams in flight loses and refuses nothing: what
  began on the old process finishes there over its old link, the node (the same process)
  dials the new process, and the old one exits once idle, closing its link last.
- A change to a remote node's payload is restart-class; after the restart the node runs the
  new payload while its in-flight requests finish on the old adapters.
- A rotated node token is refused by the new process; the node exits 2 after finishing what
  it held, and both sides say why without the token.
- Live changes of a remote provider apply at once, edge-side, without a new payload.
- A restarted ``iop-node``: the provider goes ``disconnected``, requests wait, then succeed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai

from iop_edge.config.payload import GENERATION_HEX_DIGITS
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.leaks import wait_for
from iop_edge.testing.node_process import node_process
from tests.helpers.handover_nodes import (
    NODE,
    NODE_TOKEN,
    OTHER_TOKEN,
    EdgeLineage,
    chat,
    client,
    edge_lineage,
    keep_asking,
    outcome,
    remote_doc,
    remote_node,
    stream_chat,
    with_adapter,
    with_provider,
    write_token,
)

HELD = "a held stream that finishes on the old link"
PACED = "a paced stream under way while the new process starts"
FROM_FIRST = "answered by the first upstream"


async def serving(edge: EdgeLineage, pid: int) -> bool:
    """Whether process ``pid`` serves the edge's listeners and shows node ``gpu`` connected."""
    status = await edge.status()
    node = next(n for n in status["nodes"] if n["id"] == NODE)
    return bool(status["pid"] == pid and node["connected"])


async def test_an_edge_restart_with_remote_streams_in_flight_loses_and_refuses_nothing(
    tmp_path: Path,
) -> None:
    """Issue 29 item 8: ``iop-edge restart`` with the node's link up, a stream held at the
    upstream, a stream under way and two client loops running. No request fails or is
    refused; the held stream runs on the old process over its old link after the handover
    (the old process stops only listening for links: before the fix it stopped accepting,
    aiohttp then dropped what the link received, and the heartbeat cut the link with its
    requests, 502); the old process exits 0 once idle and only then closes that link
    (1001); the node — the same process — dials the new process after ``GOAWAY{handover}``,
    which shows it connected with the same payload generation and serves what follows."""
    async with (
        FakeOpenAI() as upstream,
        edge_lineage(tmp_path, remote_doc(upstream.base_url)) as edge,
        remote_node(edge, write_token(tmp_path)) as node,
        client(edge) as sdk,
    ):
        before = await edge.node()
        upstream.enqueue(FakeBehavior(hold=True, chunks=6))
        held = asyncio.create_task(outcome(stream_chat(sdk, HELD)))
        await upstream.wait_in_flight(1)
        upstream.enqueue(FakeBehavior(chunks=30, chunk_delay=0.05))
        begun = asyncio.Event()
        paced = asyncio.create_task(outcome(stream_chat(sdk, PACED, begun)))
        await begun.wait()
        stop = asyncio.Event()
        outcomes: list[str] = []
        loops = [
            asyncio.create_task(keep_asking(sdk, f"loop {n}", stop, outcomes)) for n in range(2)
        ]
        await upstream.wait_requests(4)
        new_pid = (await edge.restart())["pid"]
        await wait_for(lambda: serving(edge, new_pid))
        after = [await outcome(stream_chat(sdk, f"after the restart {n}")) for n in range(3)]
        held_at_restart = upstream.in_flight >= 1 and not held.done()
        upstream.release()
        finished = await asyncio.gather(held, paced)
        stop.set()
        await asyncio.gather(*loops)
        old_exit = await asyncio.to_thread(edge.first.wait, 20)
        old_link_down = await node.wait_for_log("node_link_down")
        shown = await edge.status()
        node_running = node.process.poll() is None
    drained = edge.events("handover_drained")
    assert old_exit == 0
    assert held_at_restart
    assert list(finished) == [HELD, PACED]
    assert after == [f"after the restart {n}" for n in range(3)]
    assert [o for o in outcomes if o != "ok"] == []
    assert len(outcomes) >= 2
    # the old process finished the held stream itself and cut nothing
    assert drained[0]["finished_streams"] >= 1, drained
    assert drained[0]["cut"] == 0
    # the new process serves, the node connected to it with the same payload, idle
    assert shown["pid"] == new_pid != edge.first.pid
    mine = next(n for n in shown["nodes"] if n["id"] == NODE)
    assert (mine["connected"], mine["in_flight"]) == (True, 0)
    assert mine["generation_acked"] == before["generation_acked"]
    assert shown["counters"]["admitted"] >= 3
    assert len(edge.events("node_link_up")) == 2
    # the node, one process throughout: GOAWAY{handover}, then its old link closed by the
    # old process's drain once idle (GOAWAY{stopping}, 1001), the new link up meanwhile
    assert node_running
    goaways = [e["reason"] for e in node.events("node_goaway")]
    assert (goaways[0], goaways.count("handover")) == ("handover", 1)
    assert len(node.events("node_connected")) == 2
    assert (old_link_down["closed_by"], old_link_down["code"]) == ("edge", 1001)
    assert old_link_down["in_flight"] == 0
    assert NODE_TOKEN not in edge.served.log + node.output


async def test_a_payload_change_waits_for_the_restart_and_old_requests_finish_on_old_adapters(
    tmp_path: Path,
) -> None:
    """Issue 29 item 7: the node's adapter moves to a second upstream. Saved and refreshed,
    it is reported restart-class (``iop-edge config refresh`` exits 3) and the running edge
    keeps the old payload: same generation, requests still reach the first upstream. After
    ``iop-edge restart`` the node acknowledges the new generation on its new link, while the
    stream it ran at the restart finishes on the old adapters (the first upstream answers
    it); every later request goes to the second upstream, and none fails."""
    async with FakeOpenAI() as first, FakeOpenAI() as second:
        doc = remote_doc(first.base_url)
        async with (
            edge_lineage(tmp_path, doc) as edge,
            remote_node(edge, write_token(tmp_path)) as node,
            client(edge) as sdk,
        ):
            before = await edge.node()
            edge.edit(with_adapter(doc, base_url=second.base_url))
            code, refreshed = await edge.refresh()
            kept = await edge.node()
            before_restart = await outcome(chat(sdk, "still the first upstream"))
            first.enqueue(FakeBehavior(hold=True, reply=FROM_FIRST, chunks=4))
            held = asyncio.create_task(outcome(stream_chat(sdk, "held across the restart")))
            await first.wait_in_flight(1)
            stop = asyncio.Event()
            outcomes: list[str] = []
            loop = asyncio.create_task(keep_asking(sdk, "loop", stop, outcomes))
            new_pid = (await edge.restart())["pid"]
            await wait_for(lambda: serving(edge, new_pid))
            renewed = await edge.node()
            after = [await outcome(chat(sdk, f"after the restart {n}")) for n in range(3)]
            first.release()
            finished = await held
            stop.set()
            await loop
            await asyncio.to_thread(edge.first.wait, 20)
            node_running = node.process.poll() is None
    assert code == 3
    assert refreshed["result"] == "restart_required"
    changed = {e["path"]: e for e in refreshed["report"]}
    assert changed["nodes[gpu].adapters[oa].base_url"]["class"] == "restart"
    assert not changed["nodes[gpu].adapters[oa].base_url"]["applied"]
    assert kept["generation"] == kept["generation_acked"] == before["generation_acked"]
    assert before_restart == "still the first upstream"
    # after the restart: a new generation, sent and acknowledged on the node's new link
    assert len(renewed["generation"]) == GENERATION_HEX_DIGITS
    assert renewed["generation"] == renewed["generation_acked"] != before["generation_acked"]
    assert [e["generation"] for e in node.events("node_connected")] == [
        before["generation_acked"],
        renewed["generation"],
    ]
    # the stream of the restart on the old adapters, everything after on the new ones
    assert finished == FROM_FIRST
    assert after == [f"after the restart {n}" for n in range(3)]
    assert set(after) <= prompts(second)
    assert not set(after) & prompts(first)
    assert [o for o in outcomes if o != "ok"] == []
    assert node_running


def prompts(upstream: FakeOpenAI) -> set[str]:
    """The last user message of every chat ``upstream`` received."""
    return {r.json["messages"][-1]["content"] for r in upstream.requests if r.json}


async def test_a_rotated_node_token_is_refused_after_the_restart_and_the_node_exits_2(
    tmp_path: Path,
) -> None:
    """Issue 29 item 7: the config's ``token_hash_sha256`` of the node changes (a rotation
    whose token file is not replaced yet). After ``iop-edge restart`` the node's dial to the
    new process is refused (401); the node finishes the request it held on the old process
    (it succeeds), then exits 2. Both sides log why — the edge ``node_link_refused``, the
    node ``node_refused`` — and neither log holds the token."""
    async with FakeOpenAI() as upstream:
        doc = remote_doc(upstream.base_url)
        async with edge_lineage(tmp_path, doc) as edge:
            node_ctx = remote_node(edge, write_token(tmp_path), expect_exit=2)
            async with node_ctx as node, client(edge) as sdk:
                upstream.enqueue(FakeBehavior(hold=True))
                held = asyncio.create_task(outcome(chat(sdk, "held by the node at the restart")))
                await upstream.wait_in_flight(1)
                edge.edit(remote_doc(upstream.base_url, token=OTHER_TOKEN))
                new_pid = (await edge.restart())["pid"]
                refused_edge = await edge.wait_event("node_link_refused")
                refused_node = await node.wait_for_log("node_refused")
                running_while_held = node.process.poll() is None
                upstream.release()
                answer = await held
                exit_code = await node.exited()
                shown = await edge.status()
    assert answer == "held by the node at the restart"
    assert running_while_held
    assert exit_code == 2
    assert shown["pid"] == new_pid
    assert next(n for n in shown["nodes"] if n["id"] == NODE)["connected"] is False
    assert refused_edge["reason"] == "invalid_node_token"
    assert "token_hash_sha256" in refused_edge["message"]
    assert "HTTP 401" in refused_node["message"]
    assert "does not know this node's token" in refused_node["message"]
    assert node.events("node_stopped")[-1]["exit_code"] == 2
    for token in (NODE_TOKEN, OTHER_TOKEN):
        assert token not in edge.served.log
        assert token not in node.output


async def test_live_changes_of_a_remote_provider_apply_at_once_without_a_new_payload(
    tmp_path: Path,
) -> None:
    """Issue 29 item 7: a remote provider's ``capacity`` and ``priority``, then ``enabled:
    false``, saved and refreshed (``iop-edge config refresh --apply``, exit 0) apply at once
    on the edge — capacity 1 holds the second request in the queue until the first ends; a
    disabled provider gets no request — while the node is not touched: no new payload
    generation, no new link."""
    async with FakeOpenAI() as upstream:
        doc = remote_doc(upstream.base_url)
        async with (
            edge_lineage(tmp_path, doc) as edge,
            remote_node(edge, write_token(tmp_path)) as node,
            client(edge) as sdk,
        ):
            before = await edge.node()
            edge.edit(with_provider(doc, capacity=1, priority=3))
            narrowed = await edge.refresh()
            provider = await edge.provider()
            upstream.enqueue(FakeBehavior(hold=True))
            asked = [asyncio.create_task(outcome(chat(sdk, f"capacity one {n}"))) for n in range(2)]
            await upstream.wait_in_flight(1)
            await wait_for(lambda: queue_depth(edge, 1))
            on_upstream = upstream.total_requests
            upstream.release()
            answers = await asyncio.gather(*asked)
            edge.edit(with_provider(doc, capacity=1, priority=3, enabled=False))
            disabled = await edge.refresh()
            shown = await edge.provider()
            refused = await refused_while_disabled(sdk)
            after = await edge.node()
    for code, result in (narrowed, disabled):
        assert (code, result["result"]) == (0, "applied"), result
        assert all(e["class"] == "live" and e["applied"] for e in result["report"])
    assert (provider["capacity"], provider["priority"]) == (1, 3)
    assert on_upstream == 1
    assert upstream.max_in_flight == 1
    assert answers == ["capacity one 0", "capacity one 1"]
    assert shown["enabled"] is False
    assert refused.status_code == 503, refused
    assert upstream.total_requests == 2
    # the node saw none of it
    assert after["generation"] == after["generation_acked"] == before["generation_acked"]
    assert after["reconnects"] == 0
    assert len(node.events("node_connected")) == 1
    assert len(edge.events("node_link_up")) == 1


async def queue_depth(edge: EdgeLineage, depth: int) -> bool:
    """Whether the edge's queue holds ``depth`` requests."""
    return bool((await edge.status())["queue"]["depth"] == depth)


async def refused_while_disabled(sdk: openai.AsyncOpenAI) -> openai.APIStatusError:
    """The error of a chat while the model's only provider is disabled."""
    try:
        await chat(sdk, "to a disabled provider")
    except openai.APIStatusError as exc:
        return exc
    raise AssertionError("a disabled provider answered")


async def test_a_restarted_node_rejoins_and_the_requests_that_waited_succeed(
    tmp_path: Path,
) -> None:
    """Issue 29 item 8: SIGTERM to ``iop-node`` while it holds a request: the node drains
    (the request it holds finishes, 200) and exits 0; the edge shows the provider
    ``disconnected`` from the node's ``GOAWAY{draining}`` on, so requests sent meanwhile are
    not sent to it: they wait in the queue. ``iop-node`` started again dials in, the
    provider is back, and the requests that waited succeed."""
    token = write_token(tmp_path)
    async with (
        FakeOpenAI() as upstream,
        edge_lineage(tmp_path, remote_doc(upstream.base_url)) as edge,
        client(edge) as sdk,
    ):
        async with remote_node(edge, token) as node:
            healthy = (await edge.provider())["health"]
            upstream.enqueue(FakeBehavior(hold=True))
            held = asyncio.create_task(outcome(chat(sdk, "held while the node stops")))
            await upstream.wait_in_flight(1)
            node.process.terminate()
            await node.wait_for_log("node_draining")
            await wait_for(lambda: provider_health(edge, "disconnected"))
            waiting = [asyncio.create_task(outcome(chat(sdk, f"waits {n}"))) for n in range(2)]
            await wait_for(lambda: queue_depth(edge, 2))
            upstream.release()
            answered = await held
            assert await node.exited() == 0
            down = await edge.provider()
        on_upstream = upstream.total_requests
        async with node_process("--edge", edge.urls["nodes"], "--token-file", str(token)) as again:
            waited = await asyncio.gather(*waiting)
            back = await edge.provider()
            rejoined = await edge.node()
            again_pid = again.process.pid
    assert answered == "held while the node stops"
    assert on_upstream == 1  # nothing went to the node while it was down
    assert down["health"] == "disconnected"
    assert waited == ["waits 0", "waits 1"]
    assert healthy != "disconnected" != back["health"]
    assert rejoined["connected"] is True
    assert rejoined["reconnects"] == 1
    assert again_pid != node.process.pid
    assert [e["reason"] for e in edge.events("node_link_down")][:1] == ["node_closed"]


async def provider_health(edge: EdgeLineage, health: str) -> bool:
    """Whether provider ``far``'s health is ``health``."""
    provider: dict[str, Any] = await edge.provider()
    return bool(provider["health"] == health)

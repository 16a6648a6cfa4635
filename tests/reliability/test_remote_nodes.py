"""Remote nodes that die, restart, drain or are refused, and a client that stops reading, with
real processes on 127.0.0.1 (issue 29 items 4, 5, 6, 8, 11): one ``iop-edge serve`` for the
module, with a local node and four remote ones, each test starting the ``iop-node``
subprocesses it needs (a node killed in one test never disturbs the next: each test has a node
of its own).

- ``kill -9`` of the node mid-stream: every client's stream ends with its API's error event
  (chat ``data: {"error"…}``, Anthropic ``event: error``, Responses ``response.failed``), the
  provider shows ``disconnected``, every slot is released once;
- the node killed while its upstream holds the answer's head: the request fails over to a
  local provider of the same model and the client sees nothing of it;
- a new ``iop-node`` with the same token rejoins and serves;
- a client that stops reading: the node stops reading its upstream and the edge holds no more
  of the stream than the link's window, while the same link serves other requests;
- SIGTERM mid-stream: the node finishes the stream, then exits 0;
- a token the edge does not know: the node exits 2 at once, after one dial.

No log line of either process ever holds a node token.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anthropic
import openai
import orjson
import pytest
import pytest_asyncio

from iop_edge.link.flow import GRANT_BYTES
from iop_edge.link.handshake import LinkLimits
from iop_edge.testing.edge_process import (
    EdgeProcess,
    edge_at_rest,
    edge_metrics,
    edge_status,
    log_events,
    wait_for_log,
)
from iop_edge.testing.fake_openai import FakeBehavior, FakeOpenAI
from iop_edge.testing.node_process import node_process
from iop_edge.testing.raw_http import raw_request
from tests.helpers import BOUND, dump, wait_for
from tests.helpers.remote_e2e import (
    GatedStream,
    joined_node,
    node_status,
    provider_status,
    remote_node,
    serving_edge,
    tcp_queues,
    wait_status,
    write_token,
)
from tests.helpers.upstreams import FRAME_CONTENT, WRITE_HIGH_WATER, EndlessUpstream

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKENS: Final = {
    "doomed": "iopn_remote-doomed-4f1b8c2e9a7d6035",
    "flaky": "iopn_remote-flaky-a93e17c5b0d24f68",
    "steady": "iopn_remote-steady-2d7a6e0f8c1b5943",
    "calm": "iopn_remote-calm-7c05b9e3d1a2f846",
}
UNKNOWN_TOKEN: Final = "iopn_remote-unknown-e6b2a0d94c7f1358"
LOCAL_REPLY: Final = "served by the local provider"
HEARTBEAT_MS: Final = 1000


def reliability_doc(up: str, fallback: str, firehose: str, gated: str) -> dict[str, Any]:
    """Models ``doomed``, ``steady``, ``firehose`` and ``calm`` each on one remote node's
    provider; model ``resilient`` on remote ``flaky-oa`` first (priority 0) and local
    ``local-oa`` (priority 1, its own upstream, which answers :data:`LOCAL_REPLY`)."""

    def oa(name: str, url: str) -> dict[str, Any]:
        return {"name": name, "type": "openai_compat", "base_url": url}

    def provider(pid: str, adapter: str, **more: Any) -> dict[str, Any]:
        return {
            "id": pid,
            "type": "openai_compat",
            "category": "local_inference",
            "adapter": adapter,
            "models": ["fake-model"],
            "capacity": 4,
            **more,
        }

    unprobed = {"health_check": False}  # (these upstreams answer nothing but the chat)
    nodes = [
        {
            "id": "here",
            "adapters": [oa("fb", fallback)],
            "providers": [provider("local-oa", "fb", priority=1)],
        },
        remote_node("doomed", TOKENS["doomed"], [oa("up", up)], [provider("doomed-oa", "up")]),
        remote_node("flaky", TOKENS["flaky"], [oa("up", up)], [provider("flaky-oa", "up")]),
        remote_node(
            "steady",
            TOKENS["steady"],
            [oa("up", up), oa("hose", firehose)],
            [provider("steady-oa", "up"), provider("firehose-oa", "hose", **unprobed)],
        ),
        remote_node(
            "calm", TOKENS["calm"], [oa("gate", gated)], [provider("calm-oa", "gate", **unprobed)]
        ),
    ]
    models = [
        {"id": model, "context_window_tokens": 4096, "providers": providers}
        for model, providers in {
            "doomed": ["doomed-oa"],
            "resilient": ["flaky-oa", "local-oa"],
            "steady": ["steady-oa"],
            "firehose": ["firehose-oa"],
            "calm": ["calm-oa"],
        }.items()
    ]
    return {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "listen": {"address": "127.0.0.1:0"},
        "bootstrap": {"heartbeat_ms": HEARTBEAT_MS},
        "provider_pool": {"max_queue": 16, "queue_timeout_ms": 20000},
        "models": models,
        "nodes": nodes,
    }


@dataclass
class Remote:
    """The module's edge, its upstreams, and a token file per remote node."""

    edge: EdgeProcess
    up: FakeOpenAI
    firehose: EndlessUpstream
    gated: GatedStream
    tokens: dict[str, Path]

    def openai(self) -> openai.AsyncOpenAI:
        """An OpenAI SDK client of the edge (no retries)."""
        return openai.AsyncOpenAI(
            base_url=self.edge.addresses["openai"] + "/v1", api_key="unused", max_retries=0
        )

    def anthropic(self) -> anthropic.AsyncAnthropic:
        """An Anthropic SDK client of the edge (no retries)."""
        return anthropic.AsyncAnthropic(
            base_url=self.edge.addresses["openai"], api_key="unused", max_retries=0
        )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def remote(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Remote]:
    """One edge for the module; its whole log never holds a node token."""
    directory = tmp_path_factory.mktemp("remote-nodes")
    tokens = {node: write_token(directory, token, node) for node, token in TOKENS.items()}
    async with (
        FakeOpenAI() as up,
        FakeOpenAI(behavior=FakeBehavior(reply=LOCAL_REPLY)) as fallback,
        EndlessUpstream(frames=16384) as firehose,
        GatedStream() as gated,
    ):
        config = directory / "edge.yaml"
        config.write_text(
            dump(reliability_doc(up.base_url, fallback.base_url, firehose.url, gated.base_url))
        )
        async with serving_edge(config) as edge:
            yield Remote(edge, up, firehose, gated, tokens)
    assert_no_token(edge.lines)


def assert_no_token(*logs: list[str] | str) -> None:
    """No node token (known to the edge or not) in any of ``logs``."""
    text = "".join("".join(log) for log in logs)
    assert [t for t in (*TOKENS.values(), UNKNOWN_TOKEN) if t in text] == []


async def counters(edge: EdgeProcess) -> dict[str, Any]:
    """The scheduler's counters of the edge's status."""
    counted: dict[str, Any] = (await edge_status(edge))["counters"]
    return counted


def released_once(before: dict[str, Any], after: dict[str, Any], requests: int) -> None:
    """``requests`` more admissions, each released exactly once (no double release)."""
    admitted = after["admitted"] - before["admitted"]
    released = after["released"] - before["released"]
    assert (admitted, released, after["double_releases"]) == (requests, requests, 0)


# -- kill -9 ---------------------------------------------------------------------------------

STALLING: Final = "[[fake:fault=stall&fault_after=3]] one two three four five"
"""The upstream writes the role and two words, then stalls until its client goes."""


async def test_kill_9_mid_stream_ends_every_stream_with_its_apis_error_event(
    remote: Remote,
) -> None:
    """Issue 29 items 6 and 11: ``kill -9`` of ``iop-node`` while three streams run on it —
    chat, Messages and Responses, each past its first words — ends each with its API's error
    event and never a clean end: chat an ``error`` event (the SDK raises it), Messages
    ``event: error`` (the SDK raises it), Responses ``response.failed`` (no
    ``response.completed``). The provider then shows ``disconnected``, the node's link is
    down, and each of the three slots was released exactly once."""
    edge = remote.edge
    before = await counters(edge)
    started = [asyncio.Event() for _ in range(3)]

    async def chat() -> tuple[list[Any], BaseException | None]:
        events: list[Any] = []
        async with remote.openai() as client:
            stream = await client.chat.completions.create(
                model="doomed", messages=[{"role": "user", "content": STALLING}], stream=True
            )
            try:
                async for chunk in stream:
                    events.append(chunk)
                    if chunk.choices and chunk.choices[0].delta.content:
                        started[0].set()
            except openai.APIError as exc:
                return events, exc
        return events, None

    async def messages() -> tuple[list[Any], BaseException | None]:
        events: list[Any] = []
        async with remote.anthropic() as client:
            stream = await client.messages.create(
                model="doomed",
                max_tokens=64,
                messages=[{"role": "user", "content": STALLING}],
                stream=True,
            )
            try:
                async for event in stream:
                    events.append(event)
                    if event.type == "content_block_delta":
                        started[1].set()
            except anthropic.APIError as exc:
                return events, exc
        return events, None

    async def responses() -> tuple[list[Any], BaseException | None]:
        events: list[Any] = []
        async with remote.openai() as client:
            stream = await client.responses.create(model="doomed", input=STALLING, stream=True)
            async for event in stream:
                events.append(event)
                if event.type == "response.output_text.delta":
                    started[2].set()
        return events, None

    async with joined_node(edge, "doomed", remote.tokens["doomed"], expect_exit=-9) as node:
        streams = [asyncio.create_task(ask()) for ask in (chat, messages, responses)]
        for each in started:
            await wait_any(each.wait(), *streams)
        assert (await edge_status(edge))["counters"]["admitted"] - before["admitted"] == 3
        node.process.kill()
        (
            (chat_events, chat_error),
            (message_events, message_error),
            (response_events, _),
        ) = await asyncio.gather(*streams)
    assert isinstance(chat_error, openai.APIError)
    assert all(c.choices[0].finish_reason is None for c in chat_events if c.choices)
    assert isinstance(message_error, anthropic.APIError)
    assert "message_stop" not in [e.type for e in message_events]
    types = [e.type for e in response_events]
    assert types[-1] == "response.failed"
    assert "response.completed" not in types
    assert response_events[-1].response.status == "failed"
    status = await wait_status(edge, lambda s: not node_status(s, "doomed")["connected"])
    assert provider_status(status, "doomed-oa")["health"] == "disconnected"
    status = await edge_at_rest(edge)
    released_once(before, status["counters"], 3)
    assert_no_token(edge.lines, node.output)


async def test_a_restarted_node_rejoins_with_its_token_and_serves(remote: Remote) -> None:
    """Issue 29 items 8 and 11: after ``kill -9``, a new ``iop-node`` with the same token
    rejoins (the edge counts a reconnect, the provider leaves ``disconnected``) and serves
    the model again."""
    edge = remote.edge
    async with joined_node(edge, "doomed", remote.tokens["doomed"], expect_exit=-9) as first:
        first.process.kill()
    down = await wait_status(edge, lambda s: not node_status(s, "doomed")["connected"])
    assert provider_status(down, "doomed-oa")["health"] == "disconnected"
    async with joined_node(edge, "doomed", remote.tokens["doomed"]) as second:
        up = await edge_status(edge)
        node = node_status(up, "doomed")
        assert node["reconnects"] == node_status(down, "doomed")["reconnects"] + 1
        assert provider_status(up, "doomed-oa")["health"] != "disconnected"
        async with remote.openai() as client:
            answer = await client.chat.completions.create(
                model="doomed", messages=[{"role": "user", "content": "back again"}]
            )
        assert answer.choices[0].message.content == "back again"
    await edge_at_rest(edge)
    assert_no_token(edge.lines, first.output, second.output)


async def test_a_request_before_its_first_byte_fails_over_to_a_local_provider(
    remote: Remote,
) -> None:
    """Issue 29 items 6 and 11: a stream whose upstream (on the remote node) still holds the
    answer's head when ``iop-node`` is killed fails over to the model's local provider: the
    client gets the local provider's whole answer, with no error; the edge counts one
    failover, its request line two attempts; the remote provider shows ``disconnected``;
    the slot of each attempt was released once."""
    edge = remote.edge
    before = await counters(edge)
    lines = len(log_events(edge, "request"))
    remote.up.enqueue(FakeBehavior(hold=True))
    held = remote.up.in_flight
    async with (
        joined_node(edge, "flaky", remote.tokens["flaky"], expect_exit=-9) as node,
        remote.openai() as client,
    ):

        async def ask() -> list[Any]:
            stream = await client.chat.completions.create(
                model="resilient",
                messages=[{"role": "user", "content": "fail me over"}],
                stream=True,
            )
            return [chunk async for chunk in stream]

        asked = asyncio.create_task(ask())
        await wait_any(remote.up.wait_in_flight(held + 1), asked)
        node.process.kill()
        chunks = await asked
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == LOCAL_REPLY
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    line = await wait_for_log(edge, "request", after=lines)
    assert (line["provider"], line["attempts"], line["code"]) == ("local-oa", 2, "ok")
    status = await edge_at_rest(edge)
    assert provider_status(status, "flaky-oa")["health"] == "disconnected"
    assert status["counters"]["failovers"] - before["failovers"] == 1
    released_once(before, status["counters"], 2)
    remote.up.release()
    assert_no_token(edge.lines, node.output)


async def wait_any(awaited: Any, *tasks: asyncio.Task[Any]) -> None:
    """Wait for ``awaited``; a task of ``tasks`` ending first fails the test with its
    outcome (a client that got an answer or an error too early)."""
    waiting = asyncio.ensure_future(awaited)
    done, _ = await asyncio.wait({waiting, *tasks}, return_when=asyncio.FIRST_COMPLETED)
    if waiting not in done:
        waiting.cancel()
        ended = done.pop()
        raise AssertionError(f"a client ended first: {ended.result()!r}")


# -- a client that stops reading -------------------------------------------------------------


async def test_a_slow_client_holds_its_stream_to_the_window_while_the_link_serves_others(
    remote: Remote,
) -> None:
    """Issue 29 items 4 and 11: a client reads the head of an endless stream (1 GiB, from the
    remote node's upstream) and stops reading. What the link carried beyond what the client
    took — the node's bytes as the edge's status counts them, less the client's reads and the
    kernel's queues between edge and client — fills up to about the window (256 KiB; the node
    is stopped by its credit) and never goes past it by more than one chunk and aiohttp's
    write buffer with one more chunk. The node does not buffer the stream either: its upstream's
    own writes block (TCP flow control reached it), having written no more than the edge
    received plus the most the kernel holds on a connection. Meanwhile other requests on
    the same link are answered, and the stalled stream stays stalled. Once the client reads
    again the stream flows on; when it leaves the stream is cancelled and the edge holds
    nothing."""
    edge = remote.edge
    window = LinkLimits().window_bytes
    bound = window + FRAME_CONTENT + WRITE_HIGH_WATER + FRAME_CONTENT + 8 * 1024
    async with joined_node(edge, "steady", remote.tokens["steady"]) as node:
        baseline = int(node_status(await edge_status(edge), "steady")["bytes_received"])
        host, port = edge.host_port("openai")
        loop = asyncio.get_running_loop()
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.setblocking(False)
        try:
            await loop.sock_connect(client, (host, port))
            client_port = client.getsockname()[1]
            body = orjson.dumps(
                {
                    "model": "firehose",
                    "stream": True,
                    "messages": [{"role": "user", "content": "go"}],
                }
            )
            head = [(b"Content-Type", b"application/json")]
            request = raw_request("POST", "/v1/chat/completions", head, body)
            await loop.sock_sendall(client, request)
            taken = b""
            while b"data: " not in taken:
                taken += await asyncio.wait_for(loop.sock_recv(client, 4096), BOUND)

            async def received() -> int:
                """The bytes the edge received from the node since the stream began."""
                status = await edge_status(edge)
                return int(node_status(status, "steady")["bytes_received"]) - baseline

            async def beyond_the_client() -> int:
                """The stream's bytes the edge received from the node and the client has
                not got: neither read, nor in the kernel between edge and client."""
                got = await received()
                unsent, _ = tcp_queues(port, client_port)
                _, unread = tcp_queues(client_port, port)
                return got - len(taken) - unsent - unread

            held: list[int] = []

            async def window_used() -> bool:
                """Whether the node has run out of credit: it sent a window, less what the
                edge granted back (short of one grant), of which one chunk (the one being
                written) may be in the kernel already."""
                held.append(await beyond_the_client())
                return held[-1] >= window - GRANT_BYTES - FRAME_CONTENT - 8 * 1024

            await wait_for(window_used, poll=0.01)
            await wait_for(remote.firehose.blocked)
            async with remote.openai() as other:
                for n in range(8):
                    answer = await other.chat.completions.create(
                        model="steady", messages=[{"role": "user", "content": f"meanwhile {n}"}]
                    )
                    assert answer.choices[0].message.content == f"meanwhile {n}"
            assert remote.firehose.blocked()
            held.append(await beyond_the_client())
            assert max(held) <= bound, held
            status = await edge_status(edge)
            assert provider_status(status, "firehose-oa")["in_flight"] == 1
            assert node_status(status, "steady")["violations"] == 0
            assert remote.firehose.written <= await received() + kernel_buffers() + bound
            stalled_at = await received()
            read_on = 0
            while read_on < 4 * window:  # the client reads on: the node sends again
                read_on += len(await asyncio.wait_for(loop.sock_recv(client, 65536), BOUND))
            await wait_for(lambda: moved_past(received, stalled_at + window), poll=0.01)
        finally:
            client.close()
        await wait_status(edge, lambda s: node_status(s, "steady")["in_flight"] == 0)
        await edge_at_rest(edge)
    assert_no_token(edge.lines, node.output)


async def moved_past(count: Callable[[], Awaitable[int]], mark: int) -> bool:
    """Whether ``count()`` is past ``mark``."""
    return await count() > mark


def kernel_buffers() -> int:
    """The most the kernel holds on one loopback connection whose reader stopped: a full
    receive buffer on one end, a full send buffer on the other (the ``tcp_rmem`` and
    ``tcp_wmem`` maxima)."""
    most = 0
    for name in ("tcp_rmem", "tcp_wmem"):
        most += int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
    return most


# -- SIGTERM and refusal ---------------------------------------------------------------------


async def test_sigterm_mid_stream_finishes_the_stream_then_exits_0(remote: Remote) -> None:
    """Issue 29 items 3 and 11: SIGTERM to ``iop-node`` while a stream runs on it (past its
    first words, its upstream waiting): the node says it drains one request, the stream then
    ends cleanly with every word, its finish and its usage, and the node exits 0, saying it
    drained; the edge is at rest, the node's provider ``disconnected``."""
    edge = remote.edge
    async with (
        joined_node(edge, "calm", remote.tokens["calm"]) as node,
        remote.openai() as client,
    ):
        stream = await client.chat.completions.create(
            model="calm",
            messages=[{"role": "user", "content": "drain me"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = []
        async for chunk in stream:
            chunks.append(chunk)
            if chunk.choices and chunk.choices[0].delta.content:
                break
        assert remote.gated.waiting == 1
        node.process.send_signal(signal.SIGTERM)
        draining = await node.wait_for_log("node_draining")
        assert draining["in_flight"] == 1
        assert node.process.poll() is None
        remote.gated.open()
        chunks += [chunk async for chunk in stream]
        assert await node.exited() == 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == GatedStream.BEFORE + GatedStream.AFTER
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 5
    [stopped] = node.events("node_stopped")
    assert (stopped["exit_code"], stopped["drained"]) == (0, True)
    status = await edge_at_rest(edge)
    assert provider_status(status, "calm-oa")["health"] == "disconnected"
    assert_no_token(edge.lines, node.output)


async def test_a_refused_token_exits_2_at_once_without_a_retry(
    remote: Remote, tmp_path: Path
) -> None:
    """Issue 29 items 3 and 11: ``iop-node`` with a token the edge does not know exits 2 by
    itself, saying the edge does not know its token (HTTP 401) and naming its token file,
    after exactly one dial (the edge counts one refusal; the node logs no retry)."""
    edge = remote.edge
    metric = 'iop_edge_node_link_refused_total{reason="invalid_node_token"}'
    before = (await edge_metrics(edge)).get(metric, 0.0)
    token_file = write_token(tmp_path, UNKNOWN_TOKEN)
    url = edge.addresses["nodes"]
    async with node_process("--edge", url, "--token-file", str(token_file), expect_exit=2) as node:
        assert await node.exited() == 2
    [refused] = node.events("node_refused")
    assert "does not know this node's token (HTTP 401)" in refused["message"]
    assert str(token_file) in refused["message"]
    assert node.events("node_link_failed") == []
    assert (await edge_metrics(edge))[metric] == before + 1
    assert_no_token(edge.lines, node.output)

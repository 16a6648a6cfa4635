"""Real processes for the end-to-end tests of remote nodes (issue 29 item 11): ``iop-edge
serve`` (:func:`serving_edge`) and ``iop-node`` subprocesses joined to it (:func:`joined_node`)
on 127.0.0.1, what an operator reads back of them (a node's and a provider's entry of
``/admin/status``), and the instruments the tests need beside the fake upstreams:

- :class:`LinkTap`, a TCP relay between a node and the edge that keeps every byte each way,
  and :func:`link_frames`, the link frames the edge sent in them (what the node received);
- :func:`tcp_queues`, the kernel's send and receive queues of a loopback connection (what
  sits between an edge and a client that stopped reading);
- :class:`GatedStream`, an OpenAI-compatible upstream whose stream stops after its first
  words until the test opens the gate;
- :func:`normalized`, an answer with its ids, times and model name made comparable.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
from aiohttp import web

from iop_edge.link.handshake import LinkLimits
from iop_edge.link.protocol import Frame, decode
from iop_edge.testing.edge_process import EdgeProcess, edge_process, edge_status
from iop_edge.testing.leaks import BOUND, wait_for
from iop_edge.testing.node_process import NodeProcess, node_process
from iop_edge.tokens import token_hash

__all__ = [
    "GatedStream",
    "LinkTap",
    "joined_node",
    "link_frames",
    "node_status",
    "normalized",
    "provider_status",
    "remote_node",
    "serving_edge",
    "tcp_queues",
    "wait_status",
    "write_token",
]


def write_token(directory: Path, token: str, name: str = "token") -> Path:
    """A token file holding ``token``, readable by its owner only (as ``iop-node`` wants)."""
    path = directory / name
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def remote_node(
    node_id: str, token: str, adapters: list[dict[str, Any]], providers: list[dict[str, Any]]
) -> dict[str, Any]:
    """A ``nodes[]`` entry made remote by ``token``'s hash."""
    return {
        "id": node_id,
        "token_hash_sha256": token_hash(token),
        "adapters": adapters,
        "providers": providers,
    }


@contextlib.asynccontextmanager
async def serving_edge(config: Path) -> AsyncIterator[EdgeProcess]:
    """:func:`~iop_edge.testing.edge_process.edge_process` for a test's event loop: its start
    and its SIGTERM (it must exit 0) wait off the loop, so the fake upstreams and the nodes the
    loop serves keep answering the edge meanwhile."""
    running = edge_process(config)
    edge = await asyncio.to_thread(running.__enter__)
    try:
        yield edge
    except BaseException as exc:
        await asyncio.to_thread(running.__exit__, type(exc), exc, exc.__traceback__)
        raise
    await asyncio.to_thread(running.__exit__, None, None, None)


async def wait_status(
    edge: EdgeProcess, predicate: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The edge's ``/admin/status`` once ``predicate`` holds for it (bounded by
    :data:`BOUND`)."""
    seen: dict[str, Any] = {}

    async def holds() -> bool:
        seen.update(await edge_status(edge))
        return predicate(seen)

    try:
        await wait_for(holds, poll=0.01)
    except TimeoutError:
        raise AssertionError(f"the edge's status never came to that: {seen}") from None
    return seen


def node_status(status: Mapping[str, Any], node_id: str) -> dict[str, Any]:
    """Node ``node_id``'s entry of a ``/admin/status``."""
    found: dict[str, Any] = next(n for n in status["nodes"] if n["id"] == node_id)
    return found


def provider_status(status: Mapping[str, Any], provider_id: str) -> dict[str, Any]:
    """Provider ``provider_id``'s entry of a ``/admin/status``."""
    found: dict[str, Any] = next(p for p in status["providers"] if p["id"] == provider_id)
    return found


@contextlib.asynccontextmanager
async def joined_node(
    edge: EdgeProcess,
    node_id: str,
    token_file: Path,
    *args: str,
    url: str | None = None,
    expect_exit: int | None = 0,
) -> AsyncIterator[NodeProcess]:
    """``iop-node --edge URL --token-file FILE ARGS`` (URL: the edge's node listener, unless
    given), yielded once the node logged ``node_connected`` and the edge's status shows node
    ``node_id`` connected; SIGTERM afterwards (see
    :func:`~iop_edge.testing.node_process.node_process` for ``expect_exit``)."""
    edge_url = url or edge.addresses["nodes"]
    async with node_process(
        "--edge", edge_url, "--token-file", str(token_file), *args, expect_exit=expect_exit
    ) as node:
        await node.wait_for_log("node_connected")
        await wait_status(edge, lambda s: node_status(s, node_id)["connected"])
        yield node


# -- the link, as the node received it -------------------------------------------------------


@dataclass
class LinkTap:
    """A loopback TCP relay to ``target`` (``host``, ``port``): a node dials :attr:`url`
    instead of the edge, and every byte of its connections is kept, the edge's in
    :attr:`to_node`, the node's in :attr:`to_edge` (the link is plain HTTP on loopback)."""

    target: tuple[str, int]
    to_node: bytearray = field(default_factory=bytearray)
    to_edge: bytearray = field(default_factory=bytearray)
    url: str = ""
    _server: asyncio.Server | None = None
    _pipes: set[asyncio.Task[None]] = field(default_factory=set)

    async def __aenter__(self) -> LinkTap:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()

    async def _relay(self, node_r: asyncio.StreamReader, node_w: asyncio.StreamWriter) -> None:
        edge_r, edge_w = await asyncio.open_connection(*self.target)
        pipes = [
            asyncio.create_task(_pipe(node_r, edge_w, self.to_edge)),
            asyncio.create_task(_pipe(edge_r, node_w, self.to_node)),
        ]
        self._pipes.update(pipes)
        await asyncio.gather(*pipes, return_exceptions=True)
        self._pipes.difference_update(pipes)


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, kept: bytearray
) -> None:
    try:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                kept += data
                writer.write(data)
                await writer.drain()
    finally:
        writer.close()


def link_frames(raw: bytes | bytearray) -> list[Frame]:
    """The link frames in what the edge sent a node over one plain connection: the HTTP
    ``101`` answer, then WebSocket messages, each one link frame (binary, unmasked from a
    server, never compressed: docs/nodes.md); control messages (close, ping) are left out."""
    _, found, rest = bytes(raw).partition(b"\r\n\r\n")
    assert found, "no HTTP answer in the bytes the node received"
    frames: list[Frame] = []
    message = b""
    at = 0
    while at + 2 <= len(rest):
        first, second = rest[at], rest[at + 1]
        size, at = second & 0x7F, at + 2
        if size == 126:
            (size,), at = struct.unpack_from("!H", rest, at), at + 2
        elif size == 127:
            (size,), at = struct.unpack_from("!Q", rest, at), at + 8
        mask = b""
        if second & 0x80:
            mask, at = rest[at : at + 4], at + 4
        data = rest[at : at + size]
        if len(data) < size:
            break  # (the capture ended mid-message)
        at += size
        if mask:
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        opcode = first & 0x0F
        if opcode in (0x0, 0x2):
            message += data
            if first & 0x80:
                frames.append(decode(message, LinkLimits()))
                message = b""
    return frames


# -- kernel queues of a loopback connection --------------------------------------------------


def tcp_queues(local_port: int, remote_port: int) -> tuple[int, int]:
    """``(send queue, receive queue)`` in bytes of the IPv4 loopback socket from
    ``local_port`` to ``remote_port``, as the kernel reports it in ``/proc/net/tcp``: bytes
    written and not yet acknowledged by the peer, and bytes received and not yet read."""

    def address(port: int) -> str:
        return f"0100007F:{port:04X}"

    with open("/proc/net/tcp", encoding="ascii") as table:
        for line in table.readlines()[1:]:
            columns = line.split()
            if columns[1] == address(local_port) and columns[2] == address(remote_port):
                send, _, receive = columns[4].partition(":")
                return int(send, 16), int(receive, 16)
    raise AssertionError(f"no loopback connection from port {local_port} to {remote_port}")


# -- an upstream whose stream waits for the test ---------------------------------------------


class GatedStream:
    """An OpenAI-compatible upstream (``POST /v1/chat/completions``, streamed) that writes the
    role and :attr:`BEFORE` at once, then waits for :meth:`open` before :attr:`AFTER`, the
    finish, the usage and ``[DONE]``. :attr:`waiting` counts streams held at the gate."""

    BEFORE: Final = "before the gate "
    AFTER: Final = "after the gate"

    def __init__(self) -> None:
        self.waiting = 0
        self.completed = 0
        self._gate = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        self.base_url = ""

    async def __aenter__(self) -> GatedStream:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()

    def open(self) -> None:
        """Let every stream held at the gate go on (later ones pass at once)."""
        self._gate.set()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        def event(delta: dict[str, Any], finish: str | None = None, **more: Any) -> bytes:
            chunk = {
                "id": "chatcmpl-gated",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                **more,
            }
            return b"data: " + orjson.dumps(chunk) + b"\n\n"

        await response.write(event({"role": "assistant", "content": ""}))
        await response.write(event({"content": self.BEFORE}))
        self.waiting += 1
        try:
            await self._gate.wait()
        finally:
            self.waiting -= 1
        await response.write(event({"content": self.AFTER}))
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        await response.write(event({}, "stop", usage=usage))
        await response.write(b"data: [DONE]\n\n")
        self.completed += 1
        return response


# -- answers made comparable -----------------------------------------------------------------

#: Keys whose values differ between two equal answers: ids (kept apart from each other by the
#: order they first appear in) and times.
ID_KEYS: Final = frozenset({"id", "call_id", "item_id", "response_id"})
TIME_KEYS: Final = frozenset({"created", "created_at", "completed_at"})
_TOOL_USE_ID = re.compile(r"^(toolu_|call_|msg_|resp_|fc_|rs_)")


def normalized(value: Any, model: str) -> Any:
    """``value`` (an answer, or a list of stream events, as JSON-like data) with every id
    replaced by ``<id N>`` (N: the order in which the distinct ids first appear, so that two
    answers whose ids match each other the same way compare equal), every time by ``<time>``
    and the model name the client asked for by ``<model>``."""
    ids: dict[str, str] = {}

    def walk(item: Any, key: str | None) -> Any:
        if isinstance(item, dict):
            return {k: walk(v, k) for k, v in item.items()}
        if isinstance(item, list | tuple):
            return [walk(v, key) for v in item]
        if key in TIME_KEYS and isinstance(item, int | float):
            return "<time>"
        if isinstance(item, str):
            if key in ID_KEYS or (key == "tool_use_id" and _TOOL_USE_ID.match(item)):
                return ids.setdefault(item, f"<id {len(ids)}>")
            if item == model:
                return "<model>"
        return item

    return walk(value, None)


def without(values: Iterable[Mapping[str, Any]], *keys: str) -> list[dict[str, Any]]:
    """Each mapping of ``values`` without ``keys``."""
    return [{k: v for k, v in value.items() if k not in keys} for value in values]


__all__ += ["BOUND", "without"]
